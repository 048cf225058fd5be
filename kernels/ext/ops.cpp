// The gpulab operators: their schemas (one TORCH_LIBRARY for the namespace), their argument checks,
// the CPU implementations and, in GPU builds (GPULAB_WITH_CUDA), the GPU entry points that call the
// device launchers of ops_cuda.cu.
//
// Every check and every message that formats a tensor's shape, strides, dtype or device is here, in
// the unit the host compiler builds, before anything is dispatched to device code; the device
// launchers get raw pointers and sizes and return an error code. Messages never format numbers through
// a C++ stream (see dims() below for why).
//
// Contract: float32, float16 or bfloat16 inputs, contiguous, on one device; vector_add's operands of
// one shape and dtype (no broadcasting); softmax_rows's input 2-D. Strided views are refused, not copied:
// the operators are benchmark subjects, and a hidden .contiguous() copy would be timed as theirs.
// Empty tensors are valid and give an empty result. Shape functions for torch.compile are registered
// from Python (gpulab.native) with torch.library.register_fake.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "ops_common.h"

// float32, float16 and bfloat16 only: the operators' contract (compute is always in float32).
#define GPULAB_DISPATCH_FLOATING(TYPE, NAME, ...)                           \
    AT_DISPATCH_SWITCH(TYPE, NAME,                                          \
                       AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
                       AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \
                       AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))

namespace gpulab {
namespace {

// Messages are assembled from strings only (std::to_string, never a number through an std::ostream such as
// TORCH_CHECK's c10::str): with a private libstdc++ copy linked in, formatting a number through a stream crashes.
std::string dims(c10::IntArrayRef values) {
    std::string out = "[";
    for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
    return out + "]";
}

// "shape [4, 3], strides [1, 4], dtype Float, device cuda:0": what a message needs to name the problem.
std::string describe(const at::Tensor& t) {
    return "shape " + dims(t.sizes()) + ", strides " + dims(t.strides()) + ", dtype " +
           c10::toString(t.scalar_type()) + ", device " + t.device().str();
}

void check_float_tensor(const at::Tensor& t, const char* op, const char* arg) {
    const auto dtype = t.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                std::string("gpulab::") + op + ": " + arg + " has dtype " + c10::toString(dtype) +
                    "; expected float32, float16 or bfloat16 (" + arg + ": " + describe(t) + ")");
    TORCH_CHECK(t.is_contiguous(),
                std::string("gpulab::") + op + ": " + arg + " must be contiguous, got strides " + dims(t.strides()) +
                    " for shape " + dims(t.sizes()) + " (" + arg + ": " + describe(t) +
                    "); strided views are not copied implicitly: pass " + arg + ".contiguous()");
}

void check_vector_add(const at::Tensor& a, const at::Tensor& b) {
    const std::string both = " (a: " + describe(a) + "; b: " + describe(b) + ")";
    TORCH_CHECK(a.device() == b.device(), "gpulab::vector_add: a is on " + a.device().str() + " but b is on " +
                                              b.device().str() + "; both must be on one device" + both);
    TORCH_CHECK(a.scalar_type() == b.scalar_type(),
                std::string("gpulab::vector_add: a has dtype ") + c10::toString(a.scalar_type()) + " but b has dtype " +
                    c10::toString(b.scalar_type()) + "; both must have the same dtype" + both);
    TORCH_CHECK(a.sizes() == b.sizes(), "gpulab::vector_add: a has shape " + dims(a.sizes()) + " but b has shape " +
                                            dims(b.sizes()) + "; the shapes must be equal, there is no broadcasting" +
                                            both);
    check_float_tensor(a, "vector_add", "a");
    check_float_tensor(b, "vector_add", "b");
}

void check_gelu_tanh(const at::Tensor& x) { check_float_tensor(x, "gelu_tanh", "x"); }

void check_softmax_rows(const at::Tensor& x) {
    TORCH_CHECK(x.dim() == 2, "gpulab::softmax_rows: x must be 2-D (rows, cols), got " + std::to_string(x.dim()) +
                                  "-D shape " + dims(x.sizes()) + " (x: " + describe(x) +
                                  "); reshape to (-1, cols) first");
    check_float_tensor(x, "softmax_rows", "x");
}

constexpr int64_t kGrain = 1 << 15;

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
    check_vector_add(a, b);
    at::Tensor out = at::empty_like(a);
    const int64_t n = a.numel();
    GPULAB_DISPATCH_FLOATING(a.scalar_type(), "gpulab::vector_add (cpu)", [&] {
        const scalar_t* pa = a.const_data_ptr<scalar_t>();
        const scalar_t* pb = b.const_data_ptr<scalar_t>();
        scalar_t* po = out.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i)
                po[i] = static_cast<scalar_t>(static_cast<float>(pa[i]) + static_cast<float>(pb[i]));
        });
    });
    return out;
}

at::Tensor gelu_tanh_cpu(const at::Tensor& x) {
    check_gelu_tanh(x);
    at::Tensor out = at::empty_like(x);
    const int64_t n = x.numel();
    GPULAB_DISPATCH_FLOATING(x.scalar_type(), "gpulab::gelu_tanh (cpu)", [&] {
        const scalar_t* px = x.const_data_ptr<scalar_t>();
        scalar_t* po = out.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
            // 0.5 (1 + tanh z) = 1 / (1 + exp(-2z)): the same function through expf, 2.6x quicker than tanhf
            // (glibc, -O3) and without tanh's cancellation near -1 for large negative inputs.
            for (int64_t i = begin; i < end; ++i) {
                const float v = static_cast<float>(px[i]);
                po[i] = static_cast<scalar_t>(v / (1.0f + std::exp(-2.0f * gelu_tanh_inner(v))));
            }
        });
    });
    return out;
}

at::Tensor softmax_rows_cpu(const at::Tensor& x) {
    check_softmax_rows(x);
    at::Tensor out = at::empty_like(x);
    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    if (x.numel() == 0) return out;
    GPULAB_DISPATCH_FLOATING(x.scalar_type(), "gpulab::softmax_rows (cpu)", [&] {
        const scalar_t* px = x.const_data_ptr<scalar_t>();
        scalar_t* po = out.mutable_data_ptr<scalar_t>();
        const int64_t grain = std::max<int64_t>(1, kGrain / cols);
        at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
                const scalar_t* in = px + r * cols;
                scalar_t* o = po + r * cols;
                float mx = -INFINITY;
                for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, static_cast<float>(in[c]));
                // A sequential float sum over a long row loses ~1e-4 relative; a double one does not.
                double sum = 0.0;
                for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<float>(in[c]) - mx);
                const float inv = static_cast<float>(1.0 / sum);
                for (int64_t c = 0; c < cols; ++c)
                    o[c] = static_cast<scalar_t>(std::exp(static_cast<float>(in[c]) - mx) * inv);
            }
        });
    });
    return out;
}


#if defined(GPULAB_WITH_CUDA)

DType device_dtype(const at::Tensor& t) {
    switch (t.scalar_type()) {
        case at::kHalf: return DType::Half;
        case at::kBFloat16: return DType::BFloat16;
        default: return DType::Float;  // the checks admitted nothing else
    }
}

// The current stream of t's device (a cudaStream_t, or a hipStream_t on ROCm), without CUDA headers here.
void* current_stream(const at::Tensor& t) {
    return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).native_handle();
}

void check_launch(int code, const char* op, const at::Tensor& t) {
    TORCH_CHECK(code == 0, std::string("gpulab::") + op + ": the GPU launch failed: " + device_error_string(code) +
                                 " (" + describe(t) + ")");
}

at::Tensor vector_add_gpu(const at::Tensor& a, const at::Tensor& b) {
    check_vector_add(a, b);
    const c10::DeviceGuard guard(a.device());
    at::Tensor out = at::empty_like(a);
    if (a.numel() == 0) return out;
    check_launch(launch_vector_add(device_dtype(a), a.const_data_ptr(), b.const_data_ptr(), out.mutable_data_ptr(),
                                   a.numel(), current_stream(a)),
                 "vector_add", a);
    return out;
}

at::Tensor gelu_tanh_gpu(const at::Tensor& x) {
    check_gelu_tanh(x);
    const c10::DeviceGuard guard(x.device());
    at::Tensor out = at::empty_like(x);
    if (x.numel() == 0) return out;
    check_launch(launch_gelu_tanh(device_dtype(x), x.const_data_ptr(), out.mutable_data_ptr(), x.numel(),
                                  current_stream(x)),
                 "gelu_tanh", x);
    return out;
}

at::Tensor softmax_rows_gpu(const at::Tensor& x) {
    check_softmax_rows(x);
    TORCH_CHECK(x.size(0) <= INT32_MAX, "gpulab::softmax_rows: at most 2^31-1 rows on the GPU, got shape " +
                                            dims(x.sizes()));
    const c10::DeviceGuard guard(x.device());
    at::Tensor out = at::empty_like(x);
    if (x.numel() == 0) return out;
    int warp = 0;
    check_launch(device_warp_size(x.get_device(), &warp), "softmax_rows", x);
    TORCH_CHECK(softmax_supports_warp(warp), "gpulab::softmax_rows: no kernels for warp width " +
                                                 std::to_string(warp) + " of " + x.device().str());
    int units = 0;
    check_launch(device_units(x.get_device(), &units), "softmax_rows", x);
    // Rows wider than one block are split over several blocks that exchange partials through a zeroed
    // workspace: allocated per call, so its cost is the operator's.
    const int64_t split = softmax_split(x.size(0), x.size(1), x.element_size(), units);
    at::Tensor workspace;
    if (split > 1) workspace = at::zeros({softmax_workspace_words(x.size(0), split)}, x.options().dtype(at::kInt));
    check_launch(launch_softmax_rows(device_dtype(x), x.const_data_ptr(), out.mutable_data_ptr(), x.size(0),
                                     x.size(1), warp, split, split > 1 ? workspace.mutable_data_ptr() : nullptr,
                                     current_stream(x)),
                 "softmax_rows", x);
    return out;
}

#endif  // GPULAB_WITH_CUDA

}  // namespace
}  // namespace gpulab

TORCH_LIBRARY(gpulab, m) {
    m.def("vector_add(Tensor a, Tensor b) -> Tensor");
    m.def("gelu_tanh(Tensor x) -> Tensor");
    m.def("softmax_rows(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(gpulab, CPU, m) {
    m.impl("vector_add", &gpulab::vector_add_cpu);
    m.impl("gelu_tanh", &gpulab::gelu_tanh_cpu);
    m.impl("softmax_rows", &gpulab::softmax_rows_cpu);
}

#if defined(GPULAB_WITH_CUDA)
// The CUDA dispatch key is HIP's too on ROCm builds of PyTorch.
TORCH_LIBRARY_IMPL(gpulab, CUDA, m) {
    m.impl("vector_add", &gpulab::vector_add_gpu);
    m.impl("gelu_tanh", &gpulab::gelu_tanh_gpu);
    m.impl("softmax_rows", &gpulab::softmax_rows_gpu);
}
#endif
