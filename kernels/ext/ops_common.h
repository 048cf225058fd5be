// Argument checks and dtype dispatch shared by the CPU and GPU implementations of the gpulab operators.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace gpulab {

// GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as PyTorch computes it.
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

inline void check_float_tensor(const at::Tensor& t, const char* op, const char* arg) {
    const auto dtype = t.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, "gpulab::", op, ": ", arg,
                " has dtype ", dtype, "; expected float32, float16 or bfloat16");
    TORCH_CHECK(t.is_contiguous(), "gpulab::", op, ": ", arg, " must be contiguous (got strides ", t.strides(),
                " for shape ", t.sizes(), "); call .contiguous() first");
}

inline void check_vector_add(const at::Tensor& a, const at::Tensor& b) {
    check_float_tensor(a, "vector_add", "a");
    check_float_tensor(b, "vector_add", "b");
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "gpulab::vector_add: a is ", a.scalar_type(), " but b is ",
                b.scalar_type(), "; both must have the same dtype");
    TORCH_CHECK(a.sizes() == b.sizes(), "gpulab::vector_add: a has shape ", a.sizes(), " but b has shape ",
                b.sizes(), "; no broadcasting");
    TORCH_CHECK(a.device() == b.device(), "gpulab::vector_add: a is on ", a.device(), " but b is on ", b.device());
}

inline void check_softmax_rows(const at::Tensor& x) {
    check_float_tensor(x, "softmax_rows", "x");
    TORCH_CHECK(x.dim() == 2, "gpulab::softmax_rows: x must be 2-D (rows, cols), got shape ", x.sizes());
}

}  // namespace gpulab

// float32, float16 and bfloat16 only: the operators' contract (compute is always in float32).
#define GPULAB_DISPATCH_FLOATING(TYPE, NAME, ...)                       \
    AT_DISPATCH_SWITCH(TYPE, NAME,                                      \
                       AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
                       AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \
                       AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))
