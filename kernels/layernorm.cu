// LayerNorm: one warp per row for the forward pass and for dinp; dw/db are column sums over row
// chunks, reduced in shared memory and added with one atomic per column per chunk.
#include "kernels/cuda_common.cuh"
#include "kernels/layernorm.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // one warp each

__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                                         const bf16* b, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const bf16* x = inp + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += __bfloat162float(x[c]);
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = __bfloat162float(x[c]) - m;
    var += d * d;
  }
  const float s = rsqrtf(warp_sum(var) / C + kEps);
  bf16* y = out + row * C;
  for (int c = lane; c < C; c += 32)
    y[c] = __float2bfloat16_rn((__bfloat162float(x[c]) - m) * s * __bfloat162float(w[c]) + __bfloat162float(b[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_dinp_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w,
                                               const float* mean, const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const bf16* x = inp + row * C;
  const bf16* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (__bfloat162float(x[c]) - m) * s;
    const float dnorm = __bfloat162float(dy[c]) * __bfloat162float(w[c]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
  bf16* dx = dinp + row * C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (__bfloat162float(x[c]) - m) * s;
    const float dnorm = __bfloat162float(dy[c]) * __bfloat162float(w[c]);
    dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

// block (32 columns, 8 row lanes); grid (column tiles, row chunks)
__global__ void layernorm_backward_dwdb_kernel(float* dw, float* db, const bf16* dout, const bf16* inp,
                                               const float* mean, const float* rstd, int64_t N, int C) {
  __shared__ float s_dw[8][33], s_db[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (c < C) {
    for (int64_t r = blockIdx.y * int64_t{8} + threadIdx.y; r < N; r += int64_t{gridDim.y} * 8) {
      const float d = __bfloat162float(dout[r * C + c]);
      acc_b += d;
      acc_w += d * (__bfloat162float(inp[r * C + c]) - mean[r]) * rstd[r];
    }
  }
  s_dw[threadIdx.y][threadIdx.x] = acc_w;
  s_db[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < 8; ++k) {
      acc_w += s_dw[k][threadIdx.x];
      acc_b += s_db[k][threadIdx.x];
    }
    atomicAdd(&dw[c], acc_w);
    atomicAdd(&db[c], acc_b);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int64_t N,
                       int C, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "layernorm_forward: bad sizes N={} C={}", N, C);
  layernorm_forward_kernel<<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(out, mean, rstd, inp, w, b,
                                                                                          N, C);
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                        const float* mean, const float* rstd, int64_t N, int C, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "layernorm_backward: bad sizes N={} C={}", N, C);
  layernorm_backward_dinp_kernel<<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(dinp, dout, inp, w,
                                                                                                mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  const int row_chunks = std::clamp(ceil_div(N, 64), 1, 512);
  layernorm_backward_dwdb_kernel<<<dim3(ceil_div(C, 32), row_chunks), dim3(32, 8), 0, stream>>>(dw, db, dout, inp, mean,
                                                                                                rstd, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
