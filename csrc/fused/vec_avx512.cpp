// The row kernels for AVX-512 (Note [One row kernel per CPU capability], vec.h).
#include "fused/vec_kernels.h"

namespace graphex::fused::AVX512 {
RowKernels kernels() { return table(); }
}  // namespace graphex::fused::AVX512
