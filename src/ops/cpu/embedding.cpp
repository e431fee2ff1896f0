// CPU reference of the embedding op (see embedding.h), for float and double.
#include "ops/cpu/embedding.h"

namespace fp8t::cpu {

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

#define FP8T_INSTANTIATE(F)                                                                  \
  template void embedding_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int); \
  template void embedding_backward<F>(F*, F*, const F*, const int32_t*, int, int, int);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
