// Tensor utilities without autograd, for every layer above core (the tape seeds and accumulates
// gradients with them): fill, add, scale, cast, the first non-finite element and a sum of squares. On the
// host they accept f32, f64 and bf16 in any combination; CUDA tensors (f32, bf16) go to kernels/elementwise
// and kernels/global_norm on the compute stream.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/add_run.h"
#include "core/tensor.h"

namespace fp8t {

Tensor zeros_like(const Tensor& t, DType dtype);
void fill_(Tensor& t, float value);
void add_(Tensor& dst, const Tensor& src);  // dst += src (same numel; f32/f64/bf16)
// add_ over several runs of a bf16 dst and an f32 src in one pass (one launch per kernels::kMaxAddRuns runs on
// CUDA): each element as add_ rounds it. Runs must not overlap in dst.
void add_runs_(Tensor& dst, const Tensor& src, const std::vector<AddRun>& runs);
// dst[r.offset, r.offset + r.n) = 0 for each run, in one pass (one launch per kernels::kMaxAddRuns runs on CUDA).
void zero_runs_(Tensor& dst, const std::vector<ZeroRun>& runs);
void scale_(Tensor& t, float s);
Tensor cast(const Tensor& t, DType dtype, MemCategory cat = MemCategory::activations);  // f32<->f64<->bf16
void cast_into(Tensor& dst, const Tensor& src);  // dst (its dtype) = src converted; same numel and device
// The flat index of t's first NaN or Inf element; none when all are finite or t holds no floats (FP8
// codes, i32). On CUDA a sum-of-squares reduction screens the tensor and only a tensor it flags is
// copied to the host (a finite one whose squares overflow is then found finite). Synchronises.
std::optional<int64_t> first_nonfinite(const Tensor& t);
// Sum of squares of t[begin, end) (f32 or bf16 buffer, any device), in double. Synchronises on CUDA.
double sum_squares(const Tensor& t, int64_t begin, int64_t end);
// The same on CUDA into out (one f32 element on t's device), queued on the compute stream without waiting: the
// value sum_squares returns, rounded to f32 as that rounds it.
void sum_squares_into(const Tensor& t, int64_t begin, int64_t end, Tensor& out);

}  // namespace fp8t
