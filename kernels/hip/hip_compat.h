// Portability header: the HIP runtime names this project's HIP sources use, on either toolchain.
//
// hipcc (AMD, or NVIDIA through HIP's own nvidia backend) gets the real <hip/hip_runtime.h>. Plain nvcc
// gets the same names mapped onto the CUDA runtime, the way HIP itself maps onto CUDA on NVIDIA
// platforms, so one copy of each kernel builds everywhere. Only the subset the sources use is mapped:
// a missing name is a compile error, never a silent fallback.
#pragma once

#if defined(__HIP__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_NVIDIA__)
#include <hip/hip_runtime.h>
#define GPULAB_RUNTIME "HIP"

#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define GPULAB_RUNTIME "CUDA"

typedef cudaError_t hipError_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaStream_t hipStream_t;
typedef cudaDeviceProp hipDeviceProp_t;

#define hipSuccess cudaSuccess
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice

#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipSetDevice cudaSetDevice
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemset cudaMemset
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime

// HIP's launch macro; the grid/block/shared-memory/stream arguments keep HIP's order.
#define hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, ...) \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)

#else
#error "hip_compat.h: compile with hipcc (AMD ROCm) or nvcc (NVIDIA CUDA)"
#endif

#include <cstdio>

// The GPU architecture as the build flags name it: gfx90a (AMD) or sm_90 (NVIDIA).
static inline void gpulab_arch_name(const hipDeviceProp_t& prop, char* out, size_t size) {
#if defined(__HIP_PLATFORM_AMD__)
    // gcnArchName carries feature flags (gfx90a:sramecc+:xnack-); keep the ISA name only.
    size_t i = 0;
    for (; i + 1 < size && prop.gcnArchName[i] != '\0' && prop.gcnArchName[i] != ':'; ++i) out[i] = prop.gcnArchName[i];
    out[i] = '\0';
#else
    std::snprintf(out, size, "sm_%d%d", prop.major, prop.minor);
#endif
}
