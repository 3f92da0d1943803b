// Reading a safetensors file: u64 header length, a JSON header, raw little-endian data.
//
// Note [Weights are memory-mapped, never copied]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The file is mapped read-only and each tensor is a view of the mapping (at::from_blob with a
// deleter that keeps the mapping alive), so loading a model costs no copy and no parse beyond
// the header. Every entry is checked against the file before use: known dtype, offsets inside
// the data section, byte count equal to numel * element size. Tensors are read-only in spirit:
// the mapping is MAP_PRIVATE, so a kernel writing into a weight never changes the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace graphex::deploy {

class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// name -> tensor (views of the mapped file). Throws WeightsError naming the file and the entry.
std::map<std::string, at::Tensor> loadSafetensors(const std::string& path);

// Write `tensors` (contiguous CPU copies are made) to `path`; used by graphex-run --output.
void saveSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

}  // namespace graphex::deploy
