// row_kernels(): the widest table this CPU runs (Note [One row kernel per CPU capability], vec.h).
#include "fused/vec.h"

#include <ATen/Version.h>

#include <string>

namespace graphex::fused {
namespace DEFAULT {
RowKernels kernels();
}
#ifdef GRAPHEX_FUSED_AVX2
namespace AVX2 {
RowKernels kernels();
}
#endif
#ifdef GRAPHEX_FUSED_AVX512
namespace AVX512 {
RowKernels kernels();
}
#endif

const RowKernels& row_kernels() {
  static const RowKernels chosen = [] {
    const std::string aten = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512", ...
#ifdef GRAPHEX_FUSED_AVX512
    if (aten == "AVX512") return AVX512::kernels();
#endif
#ifdef GRAPHEX_FUSED_AVX2
    if (aten == "AVX2" || aten == "AVX512") return AVX2::kernels();
#endif
    return DEFAULT::kernels();
  }();
  return chosen;
}

}  // namespace graphex::fused
