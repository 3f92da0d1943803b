// The row kernels for AVX2 + FMA (Note [One row kernel per CPU capability], vec.h).
#include "fused/vec_kernels.h"

namespace graphex::fused::AVX2 {
RowKernels kernels() { return table(); }
}  // namespace graphex::fused::AVX2
