// CPU reference implementations of every op (see reference.h), for float and double.
// Rows are spread over OpenMP threads; sums of long rows accumulate in double. The matmul lives in
// cpu/gemm.h: a packed, register-tiled kernel, because the lm_head dominates CPU training time.
#include "ops/cpu/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "ops/cpu/gemm.h"

namespace fp8t::cpu {

// ---------------------------------------------------------------- embedding

template <typename F>
void embedding_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    const int64_t t = bt % T;
    const F* we = wte + int64_t(tokens[bt]) * C;
    const F* pe = wpe + t * C;
    F* o = out + bt * C;
    for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
  }
}

template <typename F>
void embedding_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C) {
  // Serial: repeated tokens would race, and B*T*C adds are cheap next to the matmuls.
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    const int64_t t = bt % T;
    const F* d = dout + bt * C;
    if (dwte) {
      F* g = dwte + int64_t(tokens[bt]) * C;
      for (int c = 0; c < C; ++c) g[c] += d[c];
    }
    if (dwpe) {
      F* g = dwpe + t * C;
      for (int c = 0; c < C; ++c) g[c] += d[c];
    }
  }
}

// ---------------------------------------------------------------- matmul

template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int64_t M, int64_t K, int64_t N) {
  // out (M, N) starts as the bias, then accumulates inp (M, K) @ weight (N, K)^T.
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    F* o = out + m * N;
    if (bias) std::copy(bias, bias + N, o);
    else std::fill(o, o + N, F(0));
  }
  gemm_accumulate<F>(out, N, StridedMat<F>{inp, K, 1}, StridedMat<F>{weight, 1, K}, M, N, K);
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int64_t M,
                     int64_t K, int64_t N) {
  // dinp (M, K) += dout (M, N) @ weight (N, K)
  if (dinp) gemm_accumulate<F>(dinp, K, StridedMat<F>{dout, N, 1}, StridedMat<F>{weight, K, 1}, M, K, N);
  // dweight (N, K) += dout^T (N, M) @ inp (M, K)
  if (dweight) gemm_accumulate<F>(dweight, K, StridedMat<F>{dout, 1, N}, StridedMat<F>{inp, K, 1}, N, K, M);
  if (dbias) {
    // Column sums of dout, each thread owning a range of columns.
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t n0 = N * id / nt, n1 = N * (id + 1) / nt;
      std::vector<double> acc(static_cast<size_t>(n1 - n0), 0.0);
      for (int64_t m = 0; m < M; ++m) {
        const F* d = dout + m * N;
        for (int64_t n = n0; n < n1; ++n) acc[n - n0] += d[n];
      }
      for (int64_t n = n0; n < n1; ++n) dbias[n] += static_cast<F>(acc[n - n0]);
    }
  }
}

// ---------------------------------------------------------------- layernorm

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int64_t N, int64_t C) {
  constexpr double eps = 1e-5;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const F* x = inp + i * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    double v = 0.0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const double r = 1.0 / std::sqrt(v / C + eps);
    F* o = out + i * C;
    for (int64_t c = 0; c < C; ++c) o[c] = static_cast<F>((x[c] - m) * r * w[c] + b[c]);
    mean[i] = static_cast<F>(m);
    rstd[i] = static_cast<F>(r);
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int64_t N, int64_t C) {
  // dw and db are sums over rows: each thread sums its own rows into its slice of `partial`
  // (nt, 2, C), then the slices are added in thread order, so results are bitwise reproducible.
  std::vector<double> partial;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
#pragma omp single
    partial.assign(static_cast<size_t>(nt) * 2 * C, 0.0);
    double* pdw = partial.data() + static_cast<size_t>(id) * 2 * C;
    double* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const F* x = inp + i * C;
      const F* d = dout + i * C;
      const double m = mean[i], r = rstd[i];
      double sum_dn = 0.0, sum_dn_n = 0.0;  // sum(dnorm), sum(dnorm * norm)
      for (int64_t c = 0; c < C; ++c) {
        const double norm = (x[c] - m) * r;
        const double dn = double(d[c]) * w[c];
        sum_dn += dn;
        sum_dn_n += dn * norm;
        pdw[c] += double(d[c]) * norm;
        pdb[c] += d[c];
      }
      if (dinp) {
        const double mdn = sum_dn / C, mdnn = sum_dn_n / C;
        F* g = dinp + i * C;
        for (int64_t c = 0; c < C; ++c) {
          const double norm = (x[c] - m) * r;
          g[c] += static_cast<F>(r * (double(d[c]) * w[c] - mdn - norm * mdnn));
        }
      }
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      double sw = 0.0, sb = 0.0;
      for (int t = 0; t < nt; ++t) {
        sw += partial[static_cast<size_t>(t) * 2 * C + c];
        sb += partial[static_cast<size_t>(t) * 2 * C + C + c];
      }
      if (dw) dw[c] += static_cast<F>(sw);
      if (db) db[c] += static_cast<F>(sb);
    }
  }
}

// ---------------------------------------------------------------- gelu

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <typename F>
void gelu_forward(F* out, const F* inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F u = F(kSqrt2OverPi) * (x + F(kGeluCubic) * x * x * x);
    out[i] = F(0.5) * x * (F(1) + std::tanh(u));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F u = F(kSqrt2OverPi) * (x + F(kGeluCubic) * x * x * x);
    const F th = std::tanh(u);
    const F sech2 = F(1) - th * th;
    const F du = F(kSqrt2OverPi) * (F(1) + F(3 * kGeluCubic) * x * x);
    dinp[i] += dout[i] * (F(0.5) * (F(1) + th) + F(0.5) * x * sech2 * du);
  }
}

// ---------------------------------------------------------------- attention

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

// ---------------------------------------------------------------- cross-entropy

namespace {

// The softmax over a 50304-wide row is as costly as the lm_head matmul unless exp vectorises, so
// float rows use a Cephes-style polynomial exp (within 2 ulp of expf) that the compiler turns into
// AVX2 code; double rows (gradient checks) keep std::exp.
#if defined(__x86_64__) && defined(__GNUC__)
#define FP8T_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FP8T_CLONES
#endif

// e^x for x <= 0. Below about -87.3 the result flushes to 0 (a softmax sum >= 1 cannot notice);
// the clamp is on the integer exponent because a float select would keep the loop from vectorising.
inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  // n = round(x / ln2) by the 1.5 * 2^23 trick (branch-free); x = n ln2 + r with |r| <= ln2 / 2.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  // Clamped before the conversion (a NaN or a float below INT32_MIN would make it undefined, UBSan):
  // 2^-127 -> bit pattern 0 -> result 0; a NaN x keeps e NaN, so the result stays NaN.
  const int32_t ni = static_cast<int32_t>(std::fmax(n, -127.0f));
  return e * std::bit_cast<float>((ni + 127) << 23);
}

FP8T_CLONES void row_stats_f32(const float* x, int64_t V, float* mx_out, double* sum_out) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < V; ++i) sum += exp_nonpositive(x[i] - mx);
  *mx_out = mx;
  *sum_out = sum;
}

FP8T_CLONES void row_grad_f32(float* g, const float* x, int64_t V, float mx, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) g[i] += exp_nonpositive(x[i] - mx) * scale;
}

// Max and sum(exp(x - max)) over the first V entries of a logits row.
template <typename F>
void row_stats(const F* x, int64_t V, F& mx, double& sum) {
  if constexpr (std::is_same_v<F, float>) {
    row_stats_f32(x, V, &mx, &sum);
  } else {
    mx = -INFINITY;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, x[i]);
    sum = 0.0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - mx);
  }
}

// g[i] += exp(x[i] - mx) * scale over the first V entries.
template <typename F>
void row_grad(F* g, const F* x, int64_t V, F mx, F scale) {
  if constexpr (std::is_same_v<F, float>) {
    row_grad_f32(g, x, V, mx, scale);
  } else {
    for (int64_t i = 0; i < V; ++i) g[i] += std::exp(x[i] - mx) * scale;
  }
}

}  // namespace

template <typename F>
void crossentropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t BT, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BT; ++r) {
    const F* x = logits + r * Vp;
    F mx;
    double sum;
    row_stats(x, V, mx, sum);
    losses[r] = static_cast<F>(std::log(sum) + double(mx) - double(x[targets[r]]));
  }
}

template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const int32_t* targets, const F* dlosses, int64_t BT,
                           int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BT; ++r) {
    const F* x = logits + r * Vp;
    F* g = dlogits + r * Vp;
    F mx;
    double sum;
    row_stats(x, V, mx, sum);
    const F dl = dlosses[r];
    row_grad(g, x, V, mx, static_cast<F>(double(dl) / sum));
    g[targets[r]] -= dl;
  }
}

// ---------------------------------------------------------------- instantiations

#define FP8T_INSTANTIATE(F)                                                                                    \
  template void embedding_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int);                   \
  template void embedding_backward<F>(F*, F*, const F*, const int32_t*, int, int, int);                        \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int64_t, int64_t, int64_t);                \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, int64_t, int64_t, int64_t);       \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int64_t, int64_t);              \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, int64_t,    \
                                      int64_t);                                                                \
  template void gelu_forward<F>(F*, const F*, int64_t);                                                        \
  template void gelu_backward<F>(F*, const F*, const F*, int64_t);                                             \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int);                                    \
  template void attention_backward<F>(F*, const F*, const F*, const F*, const F*, int, int, int, int);         \
  template void crossentropy_forward<F>(F*, const F*, const int32_t*, int64_t, int64_t, int64_t);              \
  template void crossentropy_backward<F>(F*, const F*, const int32_t*, const F*, int64_t, int64_t, int64_t);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
