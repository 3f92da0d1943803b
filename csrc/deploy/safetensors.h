// Reading a safetensors file: u64 header length, a JSON header, raw little-endian data.
//
// Note [Weights are memory-mapped, never copied]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The file is mapped read-only and each tensor is a view of the mapping (at::from_blob with a
// deleter that keeps the mapping alive), so loading a model costs no copy and no parse beyond
// the header. Every entry is checked against the file before use: known dtype, offsets inside
// the data section, byte count equal to numel * element size. Tensors are read-only in spirit:
// the mapping is MAP_PRIVATE, so a kernel writing into a weight never changes the file. The one
// copy: a tensor that is not kWeightsAlignment-aligned in the file (Note [Weights are 64-byte aligned]).
//
// Note [Weights are 64-byte aligned]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MKL and oneDNN choose their code path by the alignment of the operands: a one-row `x @ W.t()`
// with W 64-byte aligned and the same W 8 bytes off round differently (2.4e-7 in a logit; seen on
// AMD EPYC CPUs with and without AVX-512, under every ATEN_CPU_CAPABILITY). Eager's weights are
// 64-byte aligned (c10's CPU allocator aligns every allocation to 64), so a weight mapped from a
// file must be too, or a deployed model differs from eager depending on, say, the length of a
// parameter's name (it moves every tensor after the header). So:
//  - the writers (saveSafetensors here, graphex.exporting.safetensors_bytes in Python, both with
//    this alignment) pad the JSON header with spaces so that the data section starts at a file
//    offset that is a multiple of kWeightsAlignment (the header length counts the spaces, which
//    safetensors allows), and start every tensor at a data offset that is a multiple of it, with
//    zero bytes between tensors (none after the last one);
//  - the mapping starts on a page, so a tensor's address is aligned exactly when its file offset
//    is; loadSafetensors copies a tensor that is not (a file written by another tool) once into
//    a fresh, allocator-aligned tensor at load, and views every other one.
// A reader that requires the data section to be covered without gaps (huggingface's safetensors
// library does) reads such a file only when every tensor but the last one has a size that is a
// multiple of 64 bytes, as the weights of common models do; graphex's readers accept the gaps.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace graphex::deploy {

// Note [Weights are 64-byte aligned]; graphex/exporting.py's WEIGHTS_ALIGNMENT is the same number.
inline constexpr size_t kWeightsAlignment = 64;

class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// name -> tensor (views of the mapped file; a copy for one that is not aligned). Throws WeightsError naming the file and the entry.
std::map<std::string, at::Tensor> loadSafetensors(const std::string& path);

// Write `tensors` (contiguous CPU copies are made) to `path`; used by graphex-run --output.
void saveSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

}  // namespace graphex::deploy
