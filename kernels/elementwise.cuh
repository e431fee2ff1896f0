// Elementwise launchers for core/tensor_ops.h: fill, in-place add and scale, f32<->bf16 cast.
// `dtype` arguments are f32 or bf16; n counts elements.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "core/dtype.h"
#include "core/add_run.h"

namespace fp8t::kernels {

void fill(void* x, DType dtype, size_t n, float value, cudaStream_t stream);
void add_inplace(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream);
void scale_inplace(void* x, DType dtype, size_t n, float s, cudaStream_t stream);
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream);

// The runs of core/tensor_ops.h's add_runs_ travel in the kernel's arguments: at most this many per launch.
inline constexpr int kMaxAddRuns = 240;
// dst (bf16 bits) += src (f32) over `count` runs (a host array), each element rounded once
// as add_inplace rounds it; one block per run.
void add_runs(uint16_t* dst, const float* src, const AddRun* runs, int count, cudaStream_t stream);
// dst (elements of elem_bytes, 2 or 4) = 0 over `count` runs (a host array), at most kMaxAddRuns per launch; one
// block per run.
void zero_runs(void* dst, int elem_bytes, const ZeroRun* runs, int count, cudaStream_t stream);

}  // namespace fp8t::kernels
