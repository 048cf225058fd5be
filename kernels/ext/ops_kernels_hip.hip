// A standalone HIP translation unit of the extension's device code (ops_kernels.cuh): it instantiates
// every kernel for float, half and bfloat16, and every warp width an AMD GPU can have (32 on RDNA, 64 on
// CDNA), so that the AMD code objects can be compiled, and their registers, spills and LDS read, on a
// machine with hipcc but no AMD GPU, e.g.
//   HIP_PLATFORM=amd hipcc -std=c++17 -O3 --offload-arch=gfx90a -c kernels/ext/ops_kernels_hip.hip
// The extension itself is built by PyTorch (ops_cuda.cu, hipified on ROCm); this unit is not linked into it.
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>  // ROCm 6+: __hip_bfloat16
using gpulab_bf16 = __hip_bfloat16;
#else
#include <hip/hip_bfloat16.h>  // older ROCm (Debian's 5.2): hip_bfloat16
using gpulab_bf16 = hip_bfloat16;
#endif

#include "ops_kernels.cuh"

namespace gpulab {
namespace kernels {

// The launchers choose among the kernels at run time, so instantiating them instantiates every kernel.
#define GPULAB_INSTANTIATE(T)                                                                      \
    template void launch_binary<T, AddOp>(const T*, const T*, T*, int64_t, AddOp, Stream);          \
    template void launch_unary<T, GeluTanhOp>(const T*, T*, int64_t, GeluTanhOp, Stream);          \
    template bool launch_softmax_for_warp<T>(const T*, T*, int64_t, int64_t, int, int64_t, void*, Stream);

GPULAB_INSTANTIATE(float)
GPULAB_INSTANTIATE(__half)
GPULAB_INSTANTIATE(gpulab_bf16)

}  // namespace kernels
}  // namespace gpulab
