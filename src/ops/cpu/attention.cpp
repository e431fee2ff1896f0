// CPU reference of the causal self-attention op (see attention.h), for float and double. Query rows (forward)
// and (batch, head) pairs (backward) are spread over OpenMP threads; the softmax sums accumulate in double.
#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fp8t::cpu {

template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const F scale = F(1) / std::sqrt(F(HS));
  // One (b, h, t) query row per iteration; only lse is kept for backward.
#pragma omp parallel
  {
    std::vector<F> p(static_cast<size_t>(T));
    std::vector<double> acc(static_cast<size_t>(HS));
#pragma omp for schedule(dynamic, 16)
    for (int64_t row = 0; row < int64_t(B) * NH * T; ++row) {
      const int64_t t = row % T, h = (row / T) % NH, b = row / (int64_t(T) * NH);
      const F* q = qkv + (b * T + t) * C3 + h * HS;
      F mx = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        const F* k = qkv + (b * T + j) * C3 + C + h * HS;
        F s = 0;
        for (int i = 0; i < HS; ++i) s += q[i] * k[i];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= t; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j <= t; ++j) {
        const F* v = qkv + (b * T + j) * C3 + 2 * C + h * HS;
        for (int i = 0; i < HS; ++i) acc[i] += double(p[j]) * v[i];
      }
      F* o = out + (b * T + t) * C + h * HS;
      for (int i = 0; i < HS; ++i) o[i] = static_cast<F>(acc[i] / sum);
      lse[(b * NH + h) * T + t] = static_cast<F>(mx + std::log(sum));
    }
  }
}

template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse, int B, int T, int C,
                        int NH) {
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const F scale = F(1) / std::sqrt(F(HS));
  // One (b, h) per iteration: its dq, dk, dv channels are written by no other iteration.
  // Probabilities are recomputed row by row from lse: p_j = exp(q.k_j * scale - lse).
#pragma omp parallel
  {
    std::vector<F> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T)), dq(static_cast<size_t>(HS));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < int64_t(B) * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      for (int64_t t = 0; t < T; ++t) {
        const F* q = qkv + (b * T + t) * C3 + h * HS;
        const F* d = dout + (b * T + t) * C + h * HS;
        const F* o = out + (b * T + t) * C + h * HS;
        const F l = lse[bh * T + t];
        F dsum = 0;  // sum_j p_j dp_j = dout . out
        for (int i = 0; i < HS; ++i) dsum += d[i] * o[i];
        for (int64_t j = 0; j <= t; ++j) {
          const F* k = qkv + (b * T + j) * C3 + C + h * HS;
          const F* v = qkv + (b * T + j) * C3 + 2 * C + h * HS;
          F s = 0, dpj = 0;
          for (int i = 0; i < HS; ++i) {
            s += q[i] * k[i];
            dpj += d[i] * v[i];
          }
          p[j] = std::exp(s * scale - l);
          dp[j] = dpj;
        }
        std::fill(dq.begin(), dq.end(), F(0));  // kept local so the dk/dv updates vectorise
        for (int64_t j = 0; j <= t; ++j) {
          const F* k = qkv + (b * T + j) * C3 + C + h * HS;
          F* dk = dqkv + (b * T + j) * C3 + C + h * HS;
          F* dv = dqkv + (b * T + j) * C3 + 2 * C + h * HS;
          const F ds = p[j] * (dp[j] - dsum) * scale;
          for (int i = 0; i < HS; ++i) {
            dv[i] += p[j] * d[i];
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
        F* dq_out = dqkv + (b * T + t) * C3 + h * HS;
        for (int i = 0; i < HS; ++i) dq_out[i] += dq[i];
      }
    }
  }
}

#define FP8T_INSTANTIATE(F)                                                      \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int); \
  template void attention_backward<F>(F*, const F*, const F*, const F*, const F*, int, int, int, int);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
