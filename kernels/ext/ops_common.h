// What the host translation unit (ops.cpp, g++) and the device translation units (ops_cuda.cu, nvcc or
// hipcc; ops_kernels_hip.hip) share: the GeLU constants and the launcher interface.
//
// No ATen or c10 here, on purpose. The argument checks (and every message that formats a shape, a
// stride, a dtype or a device) live in ops.cpp only, compiled once by the host compiler; the device
// side receives raw pointers and sizes that are already known to be valid, and reports a failure as
// the runtime's error code, which ops.cpp turns into an exception.
#pragma once

#include <climits>
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

// Softmax rows up to kSoftmaxBlockElems elements are held in the registers of one block (1024 threads x 16
// elements, as the Triton kernel's table has it). Wider rows are split over `split` blocks that each hold a chunk
// of kSoftmaxSplitBytes of the input as loaded (256 threads x 128 bytes: 8192 floats, as the Triton split kernel's
// fastest launch on an H100 at 2048x131072; 16384 elements of a 2-byte type in the same registers) and exchange
// their (max, sum) through a zeroed workspace that ops.cpp allocates; the blocks of a row wait for each other, so
// all of them must be able to run at once: split <= the device's SMs / CUs (`units`). Returns 1 (no split
// needed), the split, or 0 where it cannot be done (the looped kernel then reads twice).
constexpr int64_t kSoftmaxBlockElems = 16384;
constexpr int64_t kSoftmaxSplitBytes = 32768;

GPULAB_HOST_DEVICE constexpr int64_t softmax_split_elems(int64_t itemsize) { return kSoftmaxSplitBytes / itemsize; }

GPULAB_HOST_DEVICE inline int64_t softmax_split(int64_t rows, int64_t cols, int64_t itemsize, int units) {
    if (cols <= kSoftmaxBlockElems) return 1;
    const int64_t elems = softmax_split_elems(itemsize);
    const int64_t split = (cols + elems - 1) / elems;
    return split <= units && rows * split <= INT_MAX ? split : 0;
}

// The split kernel's workspace, in 32-bit words (sections 16-byte aligned): a ticket counter, one arrival count
// per row, then each chunk's max and sum of exp(x - max) as floats, at row * split + chunk.
GPULAB_HOST_DEVICE inline int64_t softmax_partials_offset(int64_t rows) { return 4 + (rows + 3) / 4 * 4; }
GPULAB_HOST_DEVICE inline int64_t softmax_workspace_words(int64_t rows, int64_t split) {
    return softmax_partials_offset(rows) + 2 * rows * split;
}

// Device launchers (ops_cuda.cu). Each enqueues its kernel on `stream` (a cudaStream_t / hipStream_t)
// and returns the runtime's error code of the launch: 0 is success, anything else goes to
// device_error_string. Preconditions, checked by the caller: contiguous inputs of one dtype on the
// current device, n > 0 / rows, cols > 0, rows < 2^31.
int launch_vector_add(DType dtype, const void* a, const void* b, void* out, int64_t n, void* stream);
int launch_gelu_tanh(DType dtype, const void* x, void* out, int64_t n, void* stream);
// launch_softmax_rows's `split` is softmax_split's answer; `workspace` holds softmax_workspace_words zeroed words
// when split > 1 (else null).
int launch_softmax_rows(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, int warp, int64_t split,
                        void* workspace, void* stream);
// Whether launch_softmax_rows has kernels for this warp width (32; also 64 on AMD builds).
bool softmax_supports_warp(int warp);
// The warp (wavefront) width of `device` into *warp; returns the runtime's error code.
int device_warp_size(int device, int* warp);
// The SMs (NVIDIA) or CUs (AMD) of `device` into *units; returns the runtime's error code.
int device_units(int device, int* units);
const char* device_error_string(int code);

}  // namespace gpulab
