// GEMMs through cuBLASLt: BF16 or FP8 operands, FP32 accumulation, BF16 or FP32 output,
// optional bias / GELU epilogues; and the bias-gradient reduction.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace fp8t::kernels {

enum class MatmulEpilogue : uint8_t {
  none,
  bias,           // D += bias (per output feature)
  gelu,           // D = gelu(A B)
  gelu_bias,      // D = gelu(A B + bias)
  gelu_aux_bias,  // D = gelu(A B + bias), and the pre-GELU values are written to `aux` (for backward)
  dgelu,          // D = (A B) * gelu'(aux), aux holding the pre-GELU values (D's type and layout)
};

// One GEMM operand: its data, element type, and (FP8 only) a device pointer to its f32 dequantisation
// scale (cuBLASLt's A/B_SCALE_POINTER), so delayed scaling needs no host round trip.
// scale_layout: how that scale covers the codes; part of the plan key. cuBLASLt takes per_tensor here (its
// SCALAR_32F mode); the other layouts are refused until their scale-tensor layouts are wired and tested.
struct MatmulOperand {
  const void* data = nullptr;
  DType dtype = DType::bf16;
  const float* scale = nullptr;
  ScaleLayout scale_layout = ScaleLayout::per_tensor;
};

// Each CUDA device has one GEMM context: its cuBLASLt handle, 32 MiB workspace, plan cache, and the memory and
// options below, which users set per device.

// Device memory for one device's GEMMs (the workspace, held for the life of the process). The caching allocator
// installs its own when it is created for the device (core/cuda_allocator.cpp), so this memory is accounted under
// `workspace`; until then it comes from cudaMalloc.
struct MatmulMemory {
  void* (*allocate)(size_t bytes) = nullptr;
};
void set_matmul_memory(int device, const MatmulMemory& memory);

struct MatmulOptions {
  // config run.gemm_autotune (set through set_gemm_autotune, ops/ops.h): each new GEMM plan (shape, layout,
  // dtypes, epilogue, alignment) asks cuBLASLt's heuristic for up to 8 algorithms and times them on its first call
  // (writing that call's outputs), keeping the fastest; false: the heuristic's first choice. A plan whose first call
  // accumulates (beta != 0) or is captured into a CUDA graph keeps the first choice.
  bool autotune = false;
};
// Plans made before a change keep their algorithm.
void set_matmul_options(int device, const MatmulOptions& options);

// Column-major, packed: D (m, n) = alpha * op(A) @ op(B) + beta * D, op(A) (m, k), op(B) (k, n).
// A is stored (k, m) when trans_a else (m, k); B is stored (n, k) when trans_b else (k, n).
// d_dtype: bf16 or f32. bias has m elements (D's type for bf16 output, f32 for f32 output).
// The algorithm is chosen once per (shape, layout, dtypes, epilogue, alignment) and cached per device.
void matmul_cublaslt(void* d, DType d_dtype, const MatmulOperand& a, bool trans_a, const MatmulOperand& b,
                     bool trans_b, int m, int n, int k, float alpha, float beta, MatmulEpilogue epilogue,
                     const void* bias, void* aux, cudaStream_t stream);

// ---- Row-major helpers used by ops (layout fixed alphabet: M rows, K in features, N out features) ----
// out (M, N) = inp (M, K) @ weight (N, K)^T (+ bias (N)); out bf16 or f32
void matmul_forward(void* out, DType out_dtype, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                    const void* bias, int M, int K, int N, cudaStream_t stream);
// dinp (M, K) bf16 (+)= dout (M, N) @ weight (N, K)
void matmul_backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* weight, int M, int K,
                           int N, bool accumulate, cudaStream_t stream);
// out (M, N) bf16 = gelu(inp (M, K) @ weight (N, K)^T + bias (N)), pre (M, N) bf16 = the pre-GELU values
void matmul_forward_gelu(__nv_bfloat16* out, __nv_bfloat16* pre, const __nv_bfloat16* inp,
                         const __nv_bfloat16* weight, const __nv_bfloat16* bias, int M, int K, int N,
                         cudaStream_t stream);
// dpre (M, K) bf16 = (dout (M, N) @ weight (N, K)) * gelu'(pre (M, K)): the gradient through a GELU whose
// output fed this GEMM. Overwrites dpre.
void matmul_backward_input_dgelu(__nv_bfloat16* dpre, const __nv_bfloat16* dout, const __nv_bfloat16* weight,
                                 const __nv_bfloat16* pre, int M, int K, int N, cudaStream_t stream);
// dweight (N, K) (+)= dout (M, N)^T @ inp (M, K); dweight f32 or bf16 (precision.grad_dtype: the f32 sum with
// beta = 1 is rounded to bf16 once per call)
void matmul_backward_weight(void* dweight, DType dweight_dtype, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                            int M, int K, int N, bool accumulate, cudaStream_t stream);
// ---- FP8 row-major helpers. Operands are FP8 codes (E4M3 or E5M2, not both E5M2) with their device
// scale_inv as `scale`; FP32 accumulation; every dimension a multiple of 16. `fast_accum`: cuBLASLt's fast
// accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the tensor cores' partial sums are not promoted to f32 along K),
// by default in fprop only, as in Transformer Engine (precision.fp8.fast_accum). Hopper takes only K-major
// operands, hence the transposed copies in backward.
// out (M, N) bf16 = inp (M, K) @ weight (N, K)^T (+ bias (N) bf16)
void matmul_fp8_forward(__nv_bfloat16* out, const MatmulOperand& inp, const MatmulOperand& weight,
                        const __nv_bfloat16* bias, int M, int K, int N, cudaStream_t stream, bool fast_accum = true);
// dinp (M, K) bf16 (+)= dout (M, N) @ weight (N, K), given weight_t (K, N)
void matmul_fp8_backward_input(__nv_bfloat16* dinp, const MatmulOperand& dout, const MatmulOperand& weight_t, int M,
                               int K, int N, bool accumulate, cudaStream_t stream, bool fast_accum = false);
// dweight (N, K) f32 or bf16 (+)= dout (M, N)^T @ inp (M, K), given dout_t (N, M) and inp_t (K, M)
void matmul_fp8_backward_weight(void* dweight, DType dweight_dtype, const MatmulOperand& dout_t,
                                const MatmulOperand& inp_t, int M, int K, int N, bool accumulate, cudaStream_t stream,
                                bool fast_accum = false);
// dbias (N) f32 += column sums of dout (M, N)
void matmul_backward_bias(float* dbias, const __nv_bfloat16* dout, int M, int N, cudaStream_t stream);

}  // namespace fp8t::kernels
