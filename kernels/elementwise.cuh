// Elementwise launchers for core/tensor_ops.h: fill, in-place add and scale, f32<->bf16 cast.
// `dtype` arguments are f32 or bf16; n counts elements.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "core/dtype.h"

namespace fp8t::kernels {

void fill(void* x, DType dtype, size_t n, float value, cudaStream_t stream);
void add_inplace(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream);
void scale_inplace(void* x, DType dtype, size_t n, float s, cudaStream_t stream);
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream);

}  // namespace fp8t::kernels
