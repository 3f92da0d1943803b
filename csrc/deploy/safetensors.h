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
//    safetensors allows), and start every tensor at a data offset that is a multiple of it;
//  - the zero bytes between two tensors are themselves an entry, named kPaddingPrefix and a
//    count ("__graphex_pad_0", ...), dtype U8, shape [the gap's length], written just before the
//    tensor it aligns (nothing follows the last tensor). huggingface's safetensors reader
//    (safetensors.torch.load_file, safe_open, the Rust crate) refuses a data section that its
//    entries do not cover end to end ("invalid offset", "file not fully covered"), and its own
//    writer aligns only to 8 bytes (by sorting tensors by dtype size), so an entry is the one way
//    to leave a gap that every reader accepts (safetensors_bytes and this writer lay out the same
//    tensors byte for byte, ASCII names assumed);
//  - the one prefix, kPaddingPrefix here and PAD_PREFIX in graphex/base/weights_layout.py, marks
//    padding: graphex's readers (loadSafetensors, so graphex::Module's weight binding and
//    graphex-run's --inputs; graphex.exporting.load_safetensors) and `graphex inspect` skip every
//    entry whose name starts with it, and both writers refuse a tensor named so (graphex.export
//    with an ExportError naming the weight), so no weight hides behind the prefix. Other readers
//    see each padding entry as a U8 tensor of 1..63 zero bytes; filter them by the prefix;
//  - the mapping starts on a page, so a tensor's address is aligned exactly when its file offset
//    is; loadSafetensors copies a tensor that is not (a file written by another tool) once into
//    a fresh, allocator-aligned tensor at load, and views every other one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace graphex::deploy {

// Note [Weights are 64-byte aligned]; graphex/exporting.py's WEIGHTS_ALIGNMENT is the same number.
inline constexpr size_t kWeightsAlignment = 64;

// Note [Weights are 64-byte aligned]: the names of the entries that fill the gaps between tensors;
// graphex/base/weights_layout.py's PAD_PREFIX is the same string.
inline constexpr std::string_view kPaddingPrefix = "__graphex_pad_";

// Whether a safetensors entry is padding (Note [Weights are 64-byte aligned]), never a weight.
inline bool isPadding(std::string_view name) { return name.substr(0, kPaddingPrefix.size()) == kPaddingPrefix; }

class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// name -> tensor (views of the mapped file; a copy for one that is not aligned), padding entries left out.
// Throws WeightsError naming the file and the entry.
std::map<std::string, at::Tensor> loadSafetensors(const std::string& path);

// Write `tensors` (contiguous CPU copies are made) to `path`, aligned and padded (Note [Weights are
// 64-byte aligned]); used by graphex-run --output. A name starting with kPaddingPrefix is a WeightsError.
void saveSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

}  // namespace graphex::deploy
