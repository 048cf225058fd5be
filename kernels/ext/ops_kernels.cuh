// The gpulab operators' device code: kernels and the host templates that choose and launch them.
//
// Pure CUDA/HIP C++: no ATen, no c10, no exceptions. Included by ops_cuda.cu (the PyTorch extension,
// compiled by nvcc, or hipified and compiled by hipcc on ROCm builds of PyTorch) and by
// ops_kernels_hip.hip (a standalone HIP translation unit that instantiates every kernel, so the AMD
// code can be compiled and its resource usage read on a machine without an AMD GPU). The element type
// T is the including unit's: c10::Half / c10::BFloat16 in the extension, __half / __hip_bfloat16 in
// the HIP unit; to_float / from_float are the only conversions the kernels use.
//
// Nothing assumes a 32-lane warp: the warp width is a template parameter of every kernel that reduces
// across lanes (AMD CDNA wavefronts are 64 lanes, RDNA and NVIDIA warps 32).
//
// Performance notes (all operators are memory-bound):
// - 16-byte vector loads and stores when every pointer is 16-byte aligned and, for softmax, the row
//   length is a multiple of the vector width; scalar kernels otherwise, so any size and any offset view
//   is still correct.
// - Elementwise: a few 16-byte vectors per thread and input, loaded before any is used; one block per
//   tile (a grid-stride loop only past the grid-size limit); the sub-vector tail is done by block 0.
// - Softmax: rows up to 32 floats per lane are held in registers by one warp per row, or half a warp for
//   rows of a warp's vectors or fewer (two passes over registers, one read and one write of memory); rows
//   up to kSoftmaxBlockElems (16 per thread of a 1024-thread block, the Triton kernel's launch) by one
//   block per row; wider rows by several blocks per
//   row that exchange their chunk's (max, sum) through global memory, still one read and one write; rows
//   too wide even for that (more blocks than SMs) by an online (max, sum) pass and a normalising pass.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops_common.h"

#if defined(USE_ROCM) || defined(__HIP_PLATFORM_AMD__)
#define GPULAB_ROCM 1
#else
#include <cuda/atomic>
#endif

namespace gpulab {
namespace kernels {

// Lane exchange within a warp of WIDTH lanes (a 64-bit lane mask on AMD: no _sync variant needed).
__device__ __forceinline__ float shfl_xor(float v, int lane_mask, int width) {
#if defined(GPULAB_ROCM)
    return __shfl_xor(v, lane_mask, width);
#else
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
#endif
}

constexpr int kVecBytes = 16;
// PyTorch's own launch shape for vectorised elementwise kernels (ATen/native/cuda/CUDALoops.cuh): small blocks, a
// few elements per thread, one block per tile, faster than a grid-stride loop.
#if defined(GPULAB_ROCM)
constexpr int kElementwiseThreads = 256;
constexpr int kElementsPerThread = 4;
#else
constexpr int kElementwiseThreads = 128;
constexpr int kElementsPerThread = 8;
#endif
constexpr int kSoftmaxWarpBlockThreads = 256;
constexpr int kFloatsPerLane = 32;  // register budget of the row-in-registers softmax kernels
constexpr int kMaxBlockThreads = 1024;
// Elements per thread of the block and split softmax kernels (kSoftmaxBlockElems = kMaxBlockThreads x this): the
// Triton kernel's 16 (kernels/triton/config.py), faster than 32 per thread in 512 threads.
constexpr int kBlockElemsPerThread = 16;
static_assert(kSoftmaxBlockElems == kMaxBlockThreads * kBlockElemsPerThread, "one block holds one chunk");
// Reads of a row's arrival count a split-softmax block makes before it gives up (2^22 L2 round trips): a launch
// that breaks the co-residency assumption then writes NaN, which the benchmark's gate fails, instead of hanging.
constexpr int kSplitMaxSpins = 1 << 22;

template <typename T>
struct alignas(kVecBytes) Vec {
    T v[kVecBytes / sizeof(T)];
};

// 16-byte accesses go through uint4, a native vector type: a plain struct copy can be split into
// scalar accesses when the compiler loses track of the alignment.
// Index i counts 16-byte vectors from a 16-byte aligned base.
template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* base, int64_t i) {
    const uint4 bits = reinterpret_cast<const uint4*>(base)[i];
    Vec<T> v;
    memcpy(&v, &bits, sizeof(v));
    return v;
}

template <typename T>
__device__ __forceinline__ void store_vec(T* base, int64_t i, const Vec<T>& v) {
    uint4 bits;
    memcpy(&bits, &v, sizeof(bits));
    reinterpret_cast<uint4*>(base)[i] = bits;
}

template <typename T>
__device__ __forceinline__ float to_float(T x) {
    return static_cast<float>(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
    return static_cast<T>(x);
}

struct AddOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

struct GeluTanhOp {
    __device__ __forceinline__ float operator()(float x) const {
        return 0.5f * x * (1.0f + tanhf(gelu_tanh_inner(x)));
    }
};

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kVecBytes == 0; }

// One block per tile; the kernels' grid-stride loops only matter past the grid-size limit.
inline int64_t elementwise_blocks(int64_t work_items, int64_t items_per_block) {
    const int64_t needed = (work_items + items_per_block - 1) / items_per_block;
    return std::max<int64_t>(1, std::min<int64_t>(needed, INT32_MAX));
}

// 16-byte vectors per thread per tensor: kElementsPerThread elements, at least one vector.
template <typename T>
constexpr int elementwise_unroll() {
    return std::max<int>(1, kElementsPerThread / (kVecBytes / static_cast<int>(sizeof(T))));
}

// ---------------------------------------------------------------------------------------------------
// Elementwise kernels
// ---------------------------------------------------------------------------------------------------

// Grid-stride loop over `nvec` vectors, UNROLL per thread and tile: `load(u, i)` for each of a tile's
// vectors first, then `store(u, i)`, so that the tile's loads are in flight together.
template <int UNROLL, typename Load, typename Store>
__device__ __forceinline__ void for_each_vec_tile(int64_t nvec, Load load, Store store) {
    const int64_t tile = static_cast<int64_t>(kElementwiseThreads) * UNROLL;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * tile + threadIdx.x; base < nvec;
         base += static_cast<int64_t>(gridDim.x) * tile) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t i = base + static_cast<int64_t>(u) * kElementwiseThreads;
            if (i < nvec) load(u, i);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t i = base + static_cast<int64_t>(u) * kElementwiseThreads;
            if (i < nvec) store(u, i);
        }
    }
}

template <typename T, int UNROLL, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
binary_vec_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n, Op op) {
    constexpr int V = kVecBytes / sizeof(T);
    using VecT = Vec<T>;
    const int64_t nvec = n / V;
    VecT ra[UNROLL], rb[UNROLL];
    for_each_vec_tile<UNROLL>(
        nvec,
        [&](int u, int64_t i) {
            ra[u] = load_vec(a, i);
            rb[u] = load_vec(b, i);
        },
        [&](int u, int64_t i) {
            VecT r;
#pragma unroll
            for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(op(to_float(ra[u].v[k]), to_float(rb[u].v[k])));
            store_vec(out, i, r);
        });
    const int64_t tail = nvec * V;  // fewer than V elements remain
    if (blockIdx.x == 0 && tail + threadIdx.x < n) {
        const int64_t i = tail + threadIdx.x;
        out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
    }
}

template <typename T, int UNROLL, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
unary_vec_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n, Op op) {
    constexpr int V = kVecBytes / sizeof(T);
    using VecT = Vec<T>;
    const int64_t nvec = n / V;
    VecT rx[UNROLL];
    for_each_vec_tile<UNROLL>(
        nvec, [&](int u, int64_t i) { rx[u] = load_vec(x, i); },
        [&](int u, int64_t i) {
            VecT r;
#pragma unroll
            for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(op(to_float(rx[u].v[k])));
            store_vec(out, i, r);
        });
    const int64_t tail = nvec * V;
    if (blockIdx.x == 0 && tail + threadIdx.x < n) {
        const int64_t i = tail + threadIdx.x;
        out[i] = from_float<T>(op(to_float(x[i])));
    }
}

// Unaligned views (a storage offset that is not a multiple of 16 bytes) take the scalar path.
template <typename T, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
binary_scalar_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n, Op op) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

template <typename T, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
unary_scalar_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n, Op op) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_float<T>(op(to_float(x[i])));
}

// ---------------------------------------------------------------------------------------------------
// Softmax kernels
// ---------------------------------------------------------------------------------------------------

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

template <int WIDTH, typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset /= 2) v = op(v, shfl_xor(v, offset, WIDTH));
    return v;
}

// Every thread gets the block's result; `smem` holds one float per warp and is not reused afterwards.
template <int WARP, typename Op>
__device__ __forceinline__ float block_reduce(float v, float* smem, Op op, float identity) {
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int nwarps = (blockDim.x + WARP - 1) / WARP;
    v = warp_reduce<WARP>(v, op);
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < nwarps ? smem[lane] : identity;
    return warp_reduce<WARP>(v, op);
}

// A chunk's 16-byte word as loaded, or one element of a chunk the scalar kernel holds.
template <typename T, bool VEC>
using Raw = std::conditional_t<VEC, uint4, T>;

template <typename T, bool VEC>
__device__ __forceinline__ Raw<T, VEC> load_raw(const T* __restrict__ row, int64_t j) {
    if constexpr (VEC) return reinterpret_cast<const uint4*>(row)[j];
    else return row[j];
}

template <typename T, bool VEC>
__device__ __forceinline__ void raw_to_float(const Raw<T, VEC>& raw, float* dst) {
    if constexpr (VEC) {
        Vec<T> v;
        memcpy(&v, &raw, sizeof(v));
#pragma unroll
        for (int k = 0; k < kVecBytes / static_cast<int>(sizeof(T)); ++k) dst[k] = to_float(v.v[k]);
    } else {
        dst[0] = to_float(raw);
    }
}

// Chunk j of a row as floats: 16-byte vector j (VEC) or element j.
template <typename T, bool VEC>
__device__ __forceinline__ void load_chunk(const T* __restrict__ row, int64_t j, float* dst) {
    raw_to_float<T, VEC>(load_raw<T, VEC>(row, j), dst);
}

template <typename T, bool VEC>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int64_t j, const float* src, float scale) {
    if constexpr (VEC) {
        Vec<T> v;
#pragma unroll
        for (int k = 0; k < kVecBytes / static_cast<int>(sizeof(T)); ++k) v.v[k] = from_float<T>(src[k] * scale);
        store_vec(row, j, v);
    } else {
        row[j] = from_float<T>(src[0] * scale);
    }
}

// Softmax of one row held in registers: ITERS chunks of V elements per thread, chunk j = it * stride + first.
// `reduce_max` and `reduce_sum` combine the threads that share the row (a warp, or a block). FAST_EXP takes the
// hardware exp2 approximation (__expf), as Triton's tl.exp does, instead of the accurate expf: the split kernel
// holds 32 elements a thread and spends its time between waits on arithmetic.
template <typename T, int ITERS, bool VEC, bool FAST_EXP = false, typename ReduceMax, typename ReduceSum>
__device__ __forceinline__ void softmax_row_in_registers(const T* __restrict__ xr, T* __restrict__ yr,
                                                         int64_t chunks, int64_t first, int64_t stride,
                                                         ReduceMax reduce_max, ReduceSum reduce_sum) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    float v[ITERS][V];
    float mx = -INFINITY;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int64_t j = static_cast<int64_t>(it) * stride + first;
        if (j < chunks) {
            load_chunk<T, VEC>(xr, j, v[it]);
#pragma unroll
            for (int k = 0; k < V; ++k) mx = fmaxf(mx, v[it][k]);
        }
    }
    mx = reduce_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int64_t j = static_cast<int64_t>(it) * stride + first;
        if (j < chunks) {
#pragma unroll
            for (int k = 0; k < V; ++k) {
                v[it][k] = FAST_EXP ? __expf(v[it][k] - mx) : expf(v[it][k] - mx);
                sum += v[it][k];
            }
        }
    }
    const float inv = 1.0f / reduce_sum(sum);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int64_t j = static_cast<int64_t>(it) * stride + first;
        if (j < chunks) store_chunk<T, VEC>(yr, j, v[it], inv);
    }
}

// LANES lanes per row: a warp, or part of one for short rows, so that each lane holds more than one vector and
// a warp has several rows' loads in flight. The row lives in registers (ITERS chunks of V elements per lane).
template <typename T, int LANES, int ITERS, bool VEC>
__global__ void __launch_bounds__(kSoftmaxWarpBlockThreads)
softmax_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    // A row past the end takes part in its warp's shuffles with nothing to load or store: its lanes leaving
    // early would be missing from the other rows' exchanges.
    const bool live = row < rows;
    const int64_t offset = live ? row * cols : 0;
    // VEC implies cols % V == 0
    softmax_row_in_registers<T, ITERS, VEC>(
        x + offset, y + offset, live ? cols / V : 0, threadIdx.x, LANES,
        [](float m) { return warp_reduce<LANES>(m, MaxOp{}); }, [](float s) { return warp_reduce<LANES>(s, SumOp{}); });
}

// One block per row; the row lives in registers (ITERS chunks of V elements per thread).
template <typename T, int WARP, int ITERS, bool VEC>
__global__ void __launch_bounds__(kMaxBlockThreads)
softmax_block_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    __shared__ float smem_max[kMaxBlockThreads / 32];
    __shared__ float smem_sum[kMaxBlockThreads / 32];
    const int64_t row = blockIdx.x;
    softmax_row_in_registers<T, ITERS, VEC>(
        x + row * cols, y + row * cols, cols / V, threadIdx.x, blockDim.x,
        [&](float m) { return block_reduce<WARP>(m, smem_max, MaxOp{}, -INFINITY); },
        [&](float s) { return block_reduce<WARP>(s, smem_sum, SumOp{}, 0.0f); });
}

// Running (max, sum of exp(x - max)); a max of -inf (nothing seen yet, or only -inf) contributes 0.
struct OnlineSoftmax {
    float m = -INFINITY;
    float s = 0.0f;

    __device__ __forceinline__ void merge(float other_m, float other_s) {
        const float new_m = fmaxf(m, other_m);
        const float ref = new_m == -INFINITY ? 0.0f : new_m;
        s = s * expf(m - ref) + other_s * expf(other_m - ref);
        m = new_m;
    }
};

template <int WARP>
__device__ __forceinline__ OnlineSoftmax warp_reduce_online(OnlineSoftmax a) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        const float om = shfl_xor(a.m, offset, WARP);
        const float os = shfl_xor(a.s, offset, WARP);
        a.merge(om, os);
    }
    return a;
}

// Every thread gets the block's combined (max, sum); `smem_m`, `smem_s` hold one float per warp, not reused after.
template <int WARP>
__device__ __forceinline__ OnlineSoftmax block_reduce_online(OnlineSoftmax acc, float* smem_m, float* smem_s) {
    acc = warp_reduce_online<WARP>(acc);
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int nwarps = (blockDim.x + WARP - 1) / WARP;
    if (lane == 0) {
        smem_m[warp] = acc.m;
        smem_s[warp] = acc.s;
    }
    __syncthreads();
    OnlineSoftmax total;
    if (lane < nwarps) {
        total.m = smem_m[lane];
        total.s = smem_s[lane];
    }
    return warp_reduce_online<WARP>(total);
}

// Visits a row's chunks, UNROLL per thread and iteration: the iteration's loads first, then
// `visit(chunk, j)` for each loaded chunk j, so that the loads are in flight together.
template <typename T, bool VEC, int UNROLL, typename Visit>
__device__ __forceinline__ void for_each_chunk_unrolled(const T* __restrict__ row, int64_t chunks, Visit visit) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    const int64_t step = blockDim.x;
    for (int64_t base = threadIdx.x; base < chunks; base += step * UNROLL) {
        float v[UNROLL][V];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t j = base + u * step;
            if (j < chunks) load_chunk<T, VEC>(row, j, v[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t j = base + u * step;
            if (j < chunks) visit(v[u], j);
        }
    }
}

// Rows too long for the split kernel: an online pass for (max, sum), then a pass that writes the result (the
// second read mostly hits L2: a wave of blocks touches far less than the cache holds).
template <typename T, int WARP, bool VEC>
__global__ void __launch_bounds__(kMaxBlockThreads)
softmax_looped_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    constexpr int UNROLL = 4;
    __shared__ float smem_m[kMaxBlockThreads / 32];
    __shared__ float smem_s[kMaxBlockThreads / 32];
    const int64_t row = blockIdx.x;
    const int64_t chunks = cols / V;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;

    OnlineSoftmax acc;
    for_each_chunk_unrolled<T, VEC, UNROLL>(xr, chunks, [&](float (&c)[V], int64_t) {
        float cm = c[0];
#pragma unroll
        for (int k = 1; k < V; ++k) cm = fmaxf(cm, c[k]);
        const float ref = cm == -INFINITY ? 0.0f : cm;
        float cs = 0.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) cs += expf(c[k] - ref);
        acc.merge(cm, cs);
    });
    const OnlineSoftmax total = block_reduce_online<WARP>(acc, smem_m, smem_s);
    const float mx = total.m;
    const float inv = 1.0f / total.s;

    for_each_chunk_unrolled<T, VEC, UNROLL>(xr, chunks, [&](float (&c)[V], int64_t j) {
#pragma unroll
        for (int k = 0; k < V; ++k) c[k] = expf(c[k] - mx);
        store_chunk<T, VEC>(yr, j, c, inv);
    });
}

// The split kernel's workspace (ops_common.h: softmax_workspace_words), zeroed by the caller.
struct SplitWorkspace {
    unsigned int* ticket;  // blocks started so far
    int* count;            // per row: blocks that have published their partials
    float* max;            // per chunk, at row * split + chunk: its max
    float* sum;            // and its sum of exp(x - max)
};

inline SplitWorkspace split_workspace(void* base, int64_t rows, int64_t split) {
    int* words = static_cast<int*>(base);
    float* partials = reinterpret_cast<float*>(words + softmax_partials_offset(rows));
    return {reinterpret_cast<unsigned int*>(words), words + 4, partials, partials + rows * split};
}

// Device-scope atomics on a row's arrival count: a release add (this thread's partials are visible before the count
// that announces them) and acquire loads (the partials read after are at least as new as the count), as Triton's
// sem="acq_rel" and "acquire" are. Two __threadfence() calls (sequentially consistent fences, MEMBAR.SC) did the
// same at a higher cost on every block.
__device__ __forceinline__ int arrive(int* count) {
#if defined(GPULAB_ROCM)
    return __hip_atomic_fetch_add(count, 1, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
#else
    return cuda::atomic_ref<int, cuda::thread_scope_device>(*count).fetch_add(1, cuda::memory_order_acq_rel);
#endif
}

__device__ __forceinline__ int arrived_so_far(int* count) {
#if defined(GPULAB_ROCM)
    return __hip_atomic_load(count, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#else
    return cuda::atomic_ref<int, cuda::thread_scope_device>(*count).load(cuda::memory_order_acquire);
#endif
}

// One thread per block: counts the block in (its partials published first) and waits, at most kSplitMaxSpins
// reads, until all `split` blocks of the row are in. Returns how many were.
__device__ __forceinline__ int arrive_and_wait(int* count, int split) {
    int arrived = arrive(count) + 1;
    for (int spins = 0; arrived < split && spins < kSplitMaxSpins; ++spins) arrived = arrived_so_far(count);
    return arrived;
}

// Publishes this block's chunk (max, sum), waits for the row's other blocks and returns the row's sum of
// exp(x - ref), which softmax_row_in_registers divides by: NaN if the wait gave up.
template <int WARP>
__device__ __forceinline__ float split_row_sum(float chunk_max, float chunk_sum, float ref, unsigned int ticket,
                                               int split, SplitWorkspace ws, float* smem_m, float* smem_s) {
    __shared__ int arrived;
    const int64_t row = ticket / split;
    if (threadIdx.x == 0) {
        ws.max[ticket] = chunk_max;
        ws.sum[ticket] = chunk_sum;
        arrived = arrive_and_wait(ws.count + row, split);
    }
    __syncthreads();
    OnlineSoftmax acc;
    const volatile float* maxes = ws.max + row * split;  // volatile: from L2, never a stale L1 line
    const volatile float* sums = ws.sum + row * split;
    for (int i = threadIdx.x; i < split; i += blockDim.x) acc.merge(maxes[i], sums[i]);
    const OnlineSoftmax total = block_reduce_online<WARP>(acc, smem_m, smem_s);
    return arrived < split ? NAN : total.s * expf(total.m - ref);
}

// An empty asm statement that claims to change the word: floats converted from it before cannot be reused
// after, so across the split kernel's wait the compiler keeps the words as loaded (a 2-byte type: two elements
// a register) and converts them again, where it would otherwise keep one float register per element.
__device__ __forceinline__ void reload(uint4& w) {
#if defined(GPULAB_ROCM)
    asm volatile("" : "+v"(w.x), "+v"(w.y), "+v"(w.z), "+v"(w.w));
#else
    asm volatile("" : "+r"(w.x), "+r"(w.y), "+r"(w.z), "+r"(w.w));
#endif
}
template <typename T>
__device__ __forceinline__ void reload(T&) {}

// Rows wider than one block holds (kSoftmaxBlockElems): `split` blocks per row, each keeping kSoftmaxSplitBytes of
// the input in registers as loaded (softmax_split_elems: 8192 floats, 16384 2-byte elements), so every element is
// read once and written once; the blocks of a row exchange their chunk's (max, sum) through `ws`, and each
// computes its exponentials twice, before and after the wait, rather than hold them. A block takes a ticket in
// the order blocks start (as CUB's decoupled look-back does) and works on chunk ticket % split of row
// ticket / split: it only ever waits for blocks of its row that are running or not yet started, and with
// split <= SMs a slot is always free for those.
// Small blocks, several per SM, so some load while others wait for their row: 256 threads x 128 bytes (the launch
// sweep is in docs/decisions.md, "Softmax launches").
// On NVIDIA five blocks an SM (at most 48 registers, the Triton kernel's count; sm_90 spills 16 bytes of fp32):
// without the bound nvcc takes 56 for fp32 and four blocks fit. HIP reads the bound's second number differently
// (waves per SIMD) and is left to choose. The scalar kernel (unaligned or odd rows) would spill hundreds of bytes
// at five; at two, 16.
constexpr int kSplitThreads = 256;
#if defined(GPULAB_ROCM)
constexpr int kSplitMinBlocks = 1;
#else
constexpr int kSplitMinBlocks = 5;
#endif
static_assert(kSoftmaxSplitBytes % (kSplitThreads * kVecBytes) == 0, "a chunk is whole words per thread");

template <typename T, int WARP, bool VEC>
__global__ void __launch_bounds__(kSplitThreads, VEC ? kSplitMinBlocks : 2)
softmax_split_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols, int split, SplitWorkspace ws) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    constexpr int ITERS = kSoftmaxSplitBytes / (kSplitThreads * V * sizeof(T));
    constexpr int64_t kChunk = kSplitThreads * ITERS;  // vectors (or elements) per chunk
    static_assert(kChunk * V == softmax_split_elems(sizeof(T)), "the host splits rows into these chunks");
    __shared__ float smem[4][kSplitThreads / 32];
    __shared__ unsigned int ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(ws.ticket, 1u);
    __syncthreads();
    const int64_t chunk = ticket % split;
    const int64_t offset = static_cast<int64_t>(ticket / split) * cols + chunk * kChunk * V;
    const int64_t left = cols / V - chunk * kChunk;  // the row's last chunk may be shorter
    const int64_t n = left < kChunk ? left : kChunk;
    Raw<T, VEC> raw[ITERS];
    float f[V];
    float mx = -INFINITY;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int64_t j = static_cast<int64_t>(it) * kSplitThreads + threadIdx.x;
        if (j < n) raw[it] = load_raw<T, VEC>(x + offset, j);
    }
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        if (static_cast<int64_t>(it) * kSplitThreads + threadIdx.x >= n) continue;
        raw_to_float<T, VEC>(raw[it], f);
#pragma unroll
        for (int k = 0; k < V; ++k) mx = fmaxf(mx, f[k]);
    }
    const float chunk_max = block_reduce<WARP>(mx, smem[0], MaxOp{}, -INFINITY);
    // An all -inf chunk of a row with finite values gives zeros, not exp(-inf - -inf) = NaN.
    const float ref = chunk_max == -INFINITY ? 0.0f : chunk_max;
    float sum = 0.0f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        if (static_cast<int64_t>(it) * kSplitThreads + threadIdx.x >= n) continue;
        raw_to_float<T, VEC>(raw[it], f);
#pragma unroll
        for (int k = 0; k < V; ++k) sum += __expf(f[k] - ref);
    }
    const float chunk_sum = block_reduce<WARP>(sum, smem[1], SumOp{}, 0.0f);
    const float inv = 1.0f / split_row_sum<WARP>(chunk_max, chunk_sum, ref, ticket, split, ws, smem[2], smem[3]);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int64_t j = static_cast<int64_t>(it) * kSplitThreads + threadIdx.x;
        if (j >= n) continue;
        reload(raw[it]);
        raw_to_float<T, VEC>(raw[it], f);
#pragma unroll
        for (int k = 0; k < V; ++k) f[k] = __expf(f[k] - ref);
        store_chunk<T, VEC>(y + offset, j, f, inv);
    }
}

// ---------------------------------------------------------------------------------------------------
// Launchers: choose the kernel for the pointers' alignment and the row length, enqueue it on `stream`.
// The caller checks the launch with the runtime's last error.
// ---------------------------------------------------------------------------------------------------

#if defined(GPULAB_ROCM)
using Stream = hipStream_t;
#else
using Stream = cudaStream_t;
#endif

template <typename T, typename Op>
void launch_binary(const T* a, const T* b, T* out, int64_t n, Op op, Stream stream) {
    constexpr int V = kVecBytes / sizeof(T);
    if (aligned16(a) && aligned16(b) && aligned16(out)) {
        constexpr int U = elementwise_unroll<T>();
        const int64_t blocks = elementwise_blocks(n / V, kElementwiseThreads * U);
        binary_vec_kernel<T, U><<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(a, b, out, n, op);
    } else {
        const int64_t blocks = elementwise_blocks(n, kElementwiseThreads * 4);
        binary_scalar_kernel<T><<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(a, b, out, n, op);
    }
}

template <typename T, typename Op>
void launch_unary(const T* x, T* out, int64_t n, Op op, Stream stream) {
    constexpr int V = kVecBytes / sizeof(T);
    if (aligned16(x) && aligned16(out)) {
        constexpr int U = elementwise_unroll<T>();
        const int64_t blocks = elementwise_blocks(n / V, kElementwiseThreads * U);
        unary_vec_kernel<T, U><<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(x, out, n, op);
    } else {
        const int64_t blocks = elementwise_blocks(n, kElementwiseThreads * 4);
        unary_scalar_kernel<T><<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(x, out, n, op);
    }
}

template <typename T, int LANES, int ITERS, bool VEC>
void launch_softmax_warp(const T* x, T* y, int64_t rows, int64_t cols, Stream stream) {
    constexpr int rows_per_block = kSoftmaxWarpBlockThreads / LANES;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    softmax_warp_kernel<T, LANES, ITERS, VEC>
        <<<static_cast<unsigned>(blocks), dim3(LANES, rows_per_block), 0, stream>>>(x, y, rows, cols);
}

// Picks the kernel for a row of `chunks` chunks (vectors of V elements, or single elements).
// rows < 2^31 (one block per row in the block and looped kernels): the caller checks it. `split` and
// `workspace`: see launch_softmax_rows (ops_common.h).
template <typename T, int WARP, bool VEC>
void launch_softmax(const T* x, T* y, int64_t rows, int64_t cols, int64_t split, void* workspace, Stream stream) {
    constexpr int V = VEC ? kVecBytes / sizeof(T) : 1;
    constexpr int kMaxIters = kFloatsPerLane / V;
    const int64_t chunks = cols / V;
    if (chunks <= static_cast<int64_t>(WARP) * kMaxIters) {
        if constexpr (VEC) {
            // Exact register footprints for the widths that matter (powers of two up to the limit).
            // Rows of a warp's vectors or fewer: half a warp each, two vectors a lane (one vector a lane is slower).
            if (chunks <= WARP) return launch_softmax_warp<T, WARP / 2, 2, VEC>(x, y, rows, cols, stream);
            if (chunks <= WARP * 2) return launch_softmax_warp<T, WARP, 2, VEC>(x, y, rows, cols, stream);
            if (chunks <= WARP * 4) return launch_softmax_warp<T, WARP, 4, VEC>(x, y, rows, cols, stream);
            if constexpr (kMaxIters >= 8) {
                if (chunks <= WARP * 8) return launch_softmax_warp<T, WARP, 8, VEC>(x, y, rows, cols, stream);
            }
        } else {
            if (chunks <= WARP * 4) return launch_softmax_warp<T, WARP, 4, VEC>(x, y, rows, cols, stream);
            return launch_softmax_warp<T, WARP, kMaxIters, VEC>(x, y, rows, cols, stream);
        }
    }
    constexpr int kBlockIters = kBlockElemsPerThread / V;
    if (chunks <= static_cast<int64_t>(kMaxBlockThreads) * kBlockIters) {
        // Fewest threads that hold the row at kBlockIters chunks each, but at least 128 so a block has
        // several warps to overlap.
        const int64_t per_thread = (chunks + kBlockIters - 1) / kBlockIters;
        const int64_t threads = std::min<int64_t>(
            kMaxBlockThreads, std::max<int64_t>(128, (per_thread + WARP - 1) / WARP * WARP));
        softmax_block_kernel<T, WARP, kBlockIters, VEC>
            <<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), 0, stream>>>(x, y, cols);
        return;
    }
    if (split > 1) {
        softmax_split_kernel<T, WARP, VEC><<<static_cast<unsigned>(rows * split), kSplitThreads, 0, stream>>>(
            x, y, cols, static_cast<int>(split), split_workspace(workspace, rows, split));
        return;
    }
    softmax_looped_kernel<T, WARP, VEC><<<static_cast<unsigned>(rows), kMaxBlockThreads, 0, stream>>>(x, y, cols);
}

template <typename T, int WARP>
void launch_softmax_any(const T* x, T* y, int64_t rows, int64_t cols, int64_t split, void* workspace,
                        Stream stream) {
    constexpr int V = kVecBytes / sizeof(T);
    if (cols % V == 0 && aligned16(x) && aligned16(y))
        launch_softmax<T, WARP, true>(x, y, rows, cols, split, workspace, stream);
    else
        launch_softmax<T, WARP, false>(x, y, rows, cols, split, workspace, stream);
}

// The warp widths this build's kernels are instantiated for: 32 everywhere, 64 on AMD (CDNA).
template <typename T>
bool launch_softmax_for_warp(const T* x, T* y, int64_t rows, int64_t cols, int warp, int64_t split,
                             void* workspace, Stream stream) {
#if defined(GPULAB_ROCM)
    if (warp == 64) {
        launch_softmax_any<T, 64>(x, y, rows, cols, split, workspace, stream);
        return true;
    }
#endif
    if (warp != 32) return false;
    launch_softmax_any<T, 32>(x, y, rows, cols, split, workspace, stream);
    return true;
}

}  // namespace kernels
}  // namespace gpulab
