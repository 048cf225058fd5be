// What the host translation unit (ops.cpp, g++) and the device translation units (ops_cuda.cu, nvcc or
// hipcc; ops_kernels_hip.hip) share: the GeLU constants and the launcher interface.
//
// No ATen or c10 here, on purpose. The argument checks (and every message that formats a shape, a
// stride, a dtype or a device) live in ops.cpp only, compiled once by the host compiler; the device
// side receives raw pointers and sizes that are already known to be valid, and reports a failure as
// the runtime's error code, which ops.cpp turns into an exception.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GPULAB_HOST_DEVICE __host__ __device__
#else
#define GPULAB_HOST_DEVICE
#endif

namespace gpulab {

// GeLU, tanh approximation: 0.5 x (1 + tanh(beta (x + kappa x^3))), as PyTorch computes it.
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

GPULAB_HOST_DEVICE inline float gelu_tanh_inner(float x) { return kGeluBeta * (x + kGeluKappa * x * x * x); }

// The element types the device launchers are instantiated for (compute is always in float32).
enum class DType : int { Float = 0, Half = 1, BFloat16 = 2 };

// Device launchers (ops_cuda.cu). Each enqueues its kernel on `stream` (a cudaStream_t / hipStream_t)
// and returns the runtime's error code of the launch: 0 is success, anything else goes to
// device_error_string. Preconditions, checked by the caller: contiguous inputs of one dtype on the
// current device, n > 0 / rows, cols > 0, rows < 2^31.
int launch_vector_add(DType dtype, const void* a, const void* b, void* out, int64_t n, void* stream);
int launch_gelu_tanh(DType dtype, const void* x, void* out, int64_t n, void* stream);
int launch_softmax_rows(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, int warp, void* stream);
// Whether launch_softmax_rows has kernels for this warp width (32; also 64 on AMD builds).
bool softmax_supports_warp(int warp);
// The warp (wavefront) width of `device` into *warp; returns the runtime's error code.
int device_warp_size(int device, int* warp);
const char* device_error_string(int code);

}  // namespace gpulab
