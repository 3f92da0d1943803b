// The row kernels for the baseline instruction set (Note [One row kernel per CPU capability], vec.h).
#include "fused/vec_kernels.h"

namespace graphex::fused::DEFAULT {
RowKernels kernels() { return table(); }
}  // namespace graphex::fused::DEFAULT
