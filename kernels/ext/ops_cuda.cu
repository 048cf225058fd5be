// The device launchers of the gpulab operators (declared in ops_common.h), for CUDA and, hipified by
// PyTorch, for HIP. The kernels are in ops_kernels.cuh.
//
// This unit holds no ATen code on purpose: the operators' argument checks, their error messages and
// their registration are in ops.cpp, compiled by the host compiler alone. Here a launch reports the
// runtime's error code and never throws.
#include <cuda_runtime.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "ops_common.h"
#include "ops_kernels.cuh"

namespace gpulab {
namespace {

// The element types of a PyTorch tensor: c10's 16-bit types convert to and from float on the device.
template <typename F>
int dispatch(DType dtype, F&& launch) {
    switch (dtype) {
        case DType::Float: launch(float{}); break;
        case DType::Half: launch(c10::Half{}); break;
        case DType::BFloat16: launch(c10::BFloat16{}); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_vector_add(DType dtype, const void* a, const void* b, void* out, int64_t n, void* stream) {
    return dispatch(dtype, [&](auto tag) {
        using T = decltype(tag);
        kernels::launch_binary(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n,
                               kernels::AddOp{}, static_cast<cudaStream_t>(stream));
    });
}

int launch_gelu_tanh(DType dtype, const void* x, void* out, int64_t n, void* stream) {
    return dispatch(dtype, [&](auto tag) {
        using T = decltype(tag);
        kernels::launch_unary(static_cast<const T*>(x), static_cast<T*>(out), n, kernels::GeluTanhOp{},
                              static_cast<cudaStream_t>(stream));
    });
}

int launch_softmax_rows(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, int warp, int64_t split,
                        void* workspace, void* stream) {
    if (!softmax_supports_warp(warp) || (split > 1 && workspace == nullptr))
        return static_cast<int>(cudaErrorInvalidValue);
    return dispatch(dtype, [&](auto tag) {
        using T = decltype(tag);
        kernels::launch_softmax_for_warp(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, warp, split,
                                         workspace, static_cast<cudaStream_t>(stream));
    });
}

bool softmax_supports_warp(int warp) {
#if defined(GPULAB_ROCM)
    return warp == 32 || warp == 64;
#else
    return warp == 32;
#endif
}

int device_warp_size(int device, int* warp) {
    return static_cast<int>(cudaDeviceGetAttribute(warp, cudaDevAttrWarpSize, device));
}

int device_units(int device, int* units) {
    return static_cast<int>(cudaDeviceGetAttribute(units, cudaDevAttrMultiProcessorCount, device));
}

const char* device_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace gpulab
