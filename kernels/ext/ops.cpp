// The gpulab operators: their schemas (one TORCH_LIBRARY for the namespace) and CPU implementations.
//
// GPU implementations live in ops_cuda.cu (registered for the CUDA dispatch key, which is HIP on ROCm
// builds of PyTorch); a CPU-only build compiles just this file, so the operator machinery is exercised
// on machines without a GPU. Shape functions for torch.compile are registered from Python
// (gpulab.extension) with torch.library.register_fake.
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "ops_common.h"

namespace gpulab {
namespace {

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
    check_float_tensor(x, "gelu_tanh", "x");
    at::Tensor out = at::empty_like(x);
    const int64_t n = x.numel();
    GPULAB_DISPATCH_FLOATING(x.scalar_type(), "gpulab::gelu_tanh (cpu)", [&] {
        const scalar_t* px = x.const_data_ptr<scalar_t>();
        scalar_t* po = out.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const float v = static_cast<float>(px[i]);
                const float inner = kGeluBeta * (v + kGeluKappa * v * v * v);
                po[i] = static_cast<scalar_t>(0.5f * v * (1.0f + std::tanh(inner)));
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
