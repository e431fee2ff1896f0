// Every cuBLASLt candidate for the FP8 GEMMs of one GPT-2 layer, as fp8train sets them up (kernels/matmul.cu: TN
// layouts, per-tensor scales, the forward with the bias epilogue and fast accumulation into bf16, dgrad E4M3 x E5M2
// into bf16, wgrad E4M3 x E5M2 accumulated into the bf16 gradient with beta 1, a 32 MiB workspace), each timed alone:
// what the heuristic's first choice (the one fp8train runs with run.gemm_autotune false, and for the accumulating
// wgrads always) leaves against the fastest candidate the heuristic offers. Comparison rows, not in the layer's sum:
// dgrad and wgrad with fast accumulation, the forward without its bias epilogue, the forward writing E4M3 (D scale and
// amax) with and without the bias epilogue, and BF16 mode's forward with and without it; for fc2, FP8 mode's dgrad into
// E5M2 codes, and with the DGELU epilogue (pre read as bf16 or as E4M3 codes), in place of the dgelu cast's read of
// d(h) and pre; BF16 mode's dgrad as kernels/matmul.cu runs it (NN layouts, the DGELU epilogue reading pre as aux)
// beside the same with DGELU_BGRAD (fc's bias gradient from the epilogue, into a bf16 or an f32 vector) and without an
// epilogue; for fc, the forward with the GELU in its epilogue (GELU_AUX_BIAS and GELU_AUX, pre as the bf16 aux output,
// or as E4M3 codes) into bf16 and into E4M3: whether fc's GEMM could write fc2's input codes itself, in place of the
// GELU cast.
// Build: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a gemm_sweep.cu -lcublasLt -o gemm_sweep
// Usage: gemm_sweep [C ROWS [CANDIDATES]]   (default 1600 16384 32: GPT-2 1.5B, B=16, T=1024); GEMM_SWEEP_ONLY=fc
// runs only the rows whose names contain "fc".
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);          \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define LK(x)                                                                                 \
  do {                                                                                        \
    cublasStatus_t s_ = (x);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::printf("cuBLASLt status %d at %s:%d\n", static_cast<int>(s_), __FILE__, __LINE__); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

constexpr size_t kWorkspace = size_t{32} << 20;

// Bytes of roughly Gaussian values: an FP8 code per byte with the sign, exponent and mantissa of a normal
// sample scaled toward the format's top (as a delayed-scaled tensor's codes are), or bf16 bits of small values.
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, bool e5m2) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // Sum of four uniforms ~ normal; |x| up to ~4 sigma mapped to ~2^7 (E4M3 top 448) or ~2^14 (E5M2).
    const float u = ((h & 255) + ((h >> 8) & 255) + ((h >> 16) & 255) + (h >> 24)) / 255.0f - 2.0f;
    const float x = u * (e5m2 ? 4096.0f : 100.0f);
    const uint32_t bits = __float_as_uint(x);
    const int exp = static_cast<int>((bits >> 23) & 255) - 127;
    uint8_t code = 0;
    if (x != 0.0f) {
      if (e5m2) {
        const int e = min(max(exp + 15, 1), 30);
        code = static_cast<uint8_t>((e << 2) | ((bits >> 21) & 3));
      } else {
        const int e = min(max(exp + 7, 1), 15);
        code = static_cast<uint8_t>((e << 3) | ((bits >> 20) & 7));
        if (code == 0x7F) code = 0x7E;  // 0x7F is NaN in E4M3
      }
    }
    p[i] = static_cast<uint8_t>(code | ((bits >> 24) & 0x80));
  }
}

struct Gemm {
  const char* name;
  int m, n, k;
  cudaDataType_t a, b, d;
  bool bias, fast_accum;
  float beta;
  bool variant = false;  // a comparison row, not counted in the layer's sum
  // BF16 mode's fc2 dgrad (NN layouts, as matmul_backward_input_dgelu): 0 no epilogue, 1 DGELU (aux: pre),
  // 2 DGELU_BGRAD with a bf16 bias gradient, 3 DGELU_BGRAD with an f32 one. -1: the TN rows above.
  int dgelu = -1;
  // fc's forward with the GELU in the epilogue, pre written as the aux output: 1 GELU_AUX_BIAS, 2 GELU_AUX (bf16
  // aux); 3 GELU_AUX_BIAS with pre as E4M3 codes (an aux scale and its amax).
  int gelu = 0;
  // FP8 mode's fc2 dgrad (TN) with the DGELU epilogue reading pre: 1 as bf16, 2 as E4M3 codes (an aux scale).
  int fp8_dgelu = 0;
};

struct Timed {
  int index;
  float us;
  int tile, stages, splitk, cluster;
};

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  LK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

int algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t value = 0;  // tile ids, stage ids and cluster shapes are enums of 4 bytes; splits are int32
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS)
    return -1;
  return static_cast<int>(value);
}

// Median over `runs` timed launches of one algorithm (after two warm-ups); minus the cuBLAS status when it cannot
// run. C is D's buffer where their types agree; cuBLASLt runs C == D only with equal layouts.
float time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, const void* A, cublasLtMatrixLayout_t la,
                const void* B, cublasLtMatrixLayout_t lb, const void* C, cublasLtMatrixLayout_t lc, void* D,
                cublasLtMatrixLayout_t ld, float beta, const cublasLtMatmulAlgo_t& algo, void* ws, int runs) {
  const float alpha = 1.0f;
  for (int i = 0; i < 2; ++i) {
    const cublasStatus_t st = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, D, ld, &algo, ws,
                                             kWorkspace, 0);
    if (st != CUBLAS_STATUS_SUCCESS) return -static_cast<float>(st);
  }
  std::vector<cudaEvent_t> ev(runs + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < runs; ++i) {
    LK(cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, D, ld, &algo, ws, kWorkspace, 0));
    CK(cudaEventRecord(ev[i + 1]));
  }
  CK(cudaEventSynchronize(ev[runs]));
  std::vector<float> ms(runs);
  for (int i = 0; i < runs; ++i) CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::nth_element(ms.begin(), ms.begin() + runs / 2, ms.end());
  return ms[runs / 2] * 1000.0f;
}

// Every candidate of one GEMM, timed; returns them in the heuristic's order.
std::vector<Timed> sweep(cublasLtHandle_t lt, const Gemm& g, int want, void* ws, float* scale, const void* bias) {
  const bool bf16_in = g.a == CUDA_R_16BF;  // BF16 mode's GEMM: no scales
  const size_t in_bytes = bf16_in ? 2 : 1;
  const size_t a_bytes = in_bytes * g.k * g.m, b_bytes = in_bytes * g.k * g.n;
  const bool fp8_out = g.d != CUDA_R_16BF;  // an FP8 D: a D scale and its amax, C in bf16
  const size_t d_bytes = size_t{2} * g.m * g.n;
  uint8_t *A, *B, *D, *C = nullptr;  // C: bf16 (m x n) of its own under an FP8 D, else D's buffer
  CK(cudaMalloc(&A, a_bytes));
  CK(cudaMalloc(&B, b_bytes));
  CK(cudaMalloc(&D, d_bytes));
  if (fp8_out) {
    CK(cudaMalloc(&C, d_bytes));
    CK(cudaMemset(C, 0, d_bytes));
  }
  if (bf16_in) {  // every element 0x3C3C (~0.0115)
    CK(cudaMemset(A, 0x3C, a_bytes));
    CK(cudaMemset(B, 0x3C, b_bytes));
  } else {
    fill_bytes<<<1024, 256>>>(A, a_bytes, 17u, g.a == CUDA_R_8F_E5M2);
    fill_bytes<<<1024, 256>>>(B, b_bytes, 29u, g.b == CUDA_R_8F_E5M2);
  }
  CK(cudaMemset(D, 0, d_bytes));
  CK(cudaGetLastError());
  const bool nn = g.dgelu >= 0;
  const bool has_aux = g.dgelu >= 1 || g.gelu >= 1 || g.fp8_dgelu >= 1;
  uint8_t *aux = nullptr, *bgrad = nullptr;  // pre (m x n, bf16 room) and the bias gradient (m, f32 room)
  if (has_aux) {
    CK(cudaMalloc(&aux, d_bytes));
    CK(cudaMemset(aux, 0x3C, d_bytes));
  }
  if (g.dgelu >= 2) CK(cudaMalloc(&bgrad, size_t{4} * g.m));

  cublasLtMatmulDesc_t desc;
  LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, nn ? CUBLAS_OP_N : CUBLAS_OP_T);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  cublasLtEpilogue_t epilogue = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (g.dgelu >= 1) epilogue = g.dgelu == 1 ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if (g.gelu >= 1) epilogue = g.gelu == 1 ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (g.fp8_dgelu >= 1) epilogue = CUBLASLT_EPILOGUE_DGELU;
  set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (has_aux) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux));
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{g.m});
  }
  if (g.gelu >= 1) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, g.gelu == 3 ? g.d : CUDA_R_16BF);
  if (g.fp8_dgelu >= 1)
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, g.fp8_dgelu == 2 ? CUDA_R_8F_E4M3 : CUDA_R_16BF);
  if (g.fp8_dgelu == 2) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, static_cast<void*>(scale));
  if (g.gelu == 3) {  // pre as E4M3 codes: their scale (1.0) and amax in slots of their own
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, static_cast<void*>(scale));
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, static_cast<void*>(scale + 8));
  }
  if (g.dgelu >= 2) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, g.dgelu == 2 ? CUDA_R_16BF : CUDA_R_32F);
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(bgrad));
  }
  set_desc(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(g.fast_accum ? 1 : 0));
  if (!bf16_in) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale);
    set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale);
  }
  if (g.bias) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  if (fp8_out) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const float*>(scale));
    // Its own 16-byte aligned slot, as kernels/matmul.cu keeps FP8 scale pointers (cuBLASLt refused A/B scales at a
    // 4-byte offset).
    set_desc(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, scale + 4);
  }
  cublasLtMatrixLayout_t la, lb, lc, ld;
  if (nn)  // A (m x k) and B (k x n) column-major, as the weight (C, 4C) and dout (M, C) row-major are
    LK(cublasLtMatrixLayoutCreate(&la, g.a, g.m, g.k, g.m));
  else
    LK(cublasLtMatrixLayoutCreate(&la, g.a, g.k, g.m, g.k));
  LK(cublasLtMatrixLayoutCreate(&lb, g.b, g.k, g.n, g.k));
  LK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, g.m, g.n, g.m));
  LK(cublasLtMatrixLayoutCreate(&ld, g.d, g.m, g.n, g.m));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsz = kWorkspace;
  const uint32_t align = 256;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof(wsz)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    LK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(want);
  int found = 0;
  // A configuration cuBLASLt refuses outright (status 7 for DGELU_BGRAD into an f32 bias, cuBLASLt 13.1) reads as no
  // algorithm, and the sweep goes on.
  if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, want, results.data(), &found) !=
      CUBLAS_STATUS_SUCCESS)
    found = 0;

  std::vector<Timed> timed;
  for (int i = 0; i < found; ++i) {
    // Candidate 0 always, as fp8train runs it (kernels/matmul.cu); the others only where the heuristic says they can
    // run. So t[0] is the first choice, and t[0].us < 0 says it could not run.
    if (i > 0 && results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t& algo = results[i].algo;
    const float us = time_algo(lt, desc, A, la, B, lb, C ? C : D, lc, D, ld, g.beta, algo, ws, 15);
    timed.push_back({i, us, algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)});
  }
  LK(cublasLtMatmulPreferenceDestroy(pref));
  LK(cublasLtMatrixLayoutDestroy(la));
  LK(cublasLtMatrixLayoutDestroy(lb));
  LK(cublasLtMatrixLayoutDestroy(lc));
  LK(cublasLtMatrixLayoutDestroy(ld));
  LK(cublasLtMatmulDescDestroy(desc));
  CK(cudaFree(A));
  CK(cudaFree(B));
  CK(cudaFree(D));
  if (C) CK(cudaFree(C));
  if (aux) CK(cudaFree(aux));
  if (bgrad) CK(cudaFree(bgrad));
  return timed;
}

}  // namespace

int main(int argc, char** argv) {
  const int C = argc > 2 ? std::atoi(argv[1]) : 1600, M = argc > 2 ? std::atoi(argv[2]) : 16384;
  const int want = argc > 3 ? std::atoi(argv[3]) : 32;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cublasLtHandle_t lt;
  LK(cublasLtCreate(&lt));
  std::printf("device %s, %d SMs, cuBLASLt %zu; C=%d rows=%d, up to %d candidates\n", prop.name,
              prop.multiProcessorCount, cublasLtGetVersion(), C, M, want);
  void* ws;
  float* scale;
  void* bias;
  CK(cudaMalloc(&ws, kWorkspace));
  CK(cudaMalloc(&scale, 64));  // the A/B/D/aux scales (1.0) at scale[0], D's amax at scale[4], aux's at scale[8]
  CK(cudaMalloc(&bias, size_t{2} * 4 * C));
  CK(cudaMemset(bias, 0, size_t{2} * 4 * C));
  const float one[16] = {1.0f, 1.0f, 1.0f, 1.0f};
  CK(cudaMemcpy(scale, one, sizeof(one), cudaMemcpyHostToDevice));

  const cudaDataType_t e4 = CUDA_R_8F_E4M3, e5 = CUDA_R_8F_E5M2, h = CUDA_R_16BF;
  struct Linear {
    const char* name;
    int oc, ic;
  };
  const Linear linears[] = {{"qkv", 3 * C, C}, {"proj", C, C}, {"fc", 4 * C, C}, {"fc2", C, 4 * C}};
  std::vector<Gemm> gemms;
  static char names[64][40];
  int used = 0;
  for (const Linear& l : linears) {
    auto name = [&](const char* what) {
      std::snprintf(names[used], sizeof(names[used]), "%s %s", l.name, what);
      return names[used++];
    };
    gemms.push_back({name("fwd"), l.oc, M, l.ic, e4, e4, h, true, true, 0.0f});
    gemms.push_back({name("dgrad"), l.ic, M, l.oc, e4, e5, h, false, false, 0.0f});
    gemms.push_back({name("wgrad"), l.ic, l.oc, M, e4, e5, h, false, false, 1.0f});
    gemms.push_back({name("dgrad+fast"), l.ic, M, l.oc, e4, e5, h, false, true, 0.0f, true});
    gemms.push_back({name("wgrad+fast"), l.ic, l.oc, M, e4, e5, h, false, true, 1.0f, true});
    gemms.push_back({name("fwd-nobias"), l.oc, M, l.ic, e4, e4, h, false, true, 0.0f, true});
    gemms.push_back({name("fwd-e4m3-out"), l.oc, M, l.ic, e4, e4, e4, true, true, 0.0f, true});
    gemms.push_back({name("fwd-e4m3-nobias"), l.oc, M, l.ic, e4, e4, e4, false, true, 0.0f, true});
    gemms.push_back({name("bf16 fwd"), l.oc, M, l.ic, h, h, h, true, false, 0.0f, true});
    gemms.push_back({name("bf16 fwd-nobias"), l.oc, M, l.ic, h, h, h, false, false, 0.0f, true});
    if (l.oc == 4 * C) {  // fc: the GELU in the forward's epilogue, pre as the aux output, into bf16 and E4M3
      gemms.push_back({name("fwd-gelu-aux-bias"), l.oc, M, l.ic, e4, e4, h, true, true, 0.0f, true, -1, 1});
      gemms.push_back({name("fwd-e4m3-gelu-aux-bias"), l.oc, M, l.ic, e4, e4, e4, true, true, 0.0f, true, -1, 1});
      gemms.push_back({name("fwd-e4m3-gelu-aux"), l.oc, M, l.ic, e4, e4, e4, false, true, 0.0f, true, -1, 2});
      gemms.push_back({name("fwd-e4m3-gelu-e4aux-bias"), l.oc, M, l.ic, e4, e4, e4, true, true, 0.0f, true, -1, 3});
    }
    if (l.ic == 4 * C) {  // fc2: FP8 mode's dgrad into E5M2 codes, with the DGELU epilogue (pre as aux)
      gemms.push_back({name("dgrad-e5m2-out"), l.ic, M, l.oc, e4, e5, e5, false, true, 0.0f, true});
      gemms.push_back({name("dgrad-dgelu"), l.ic, M, l.oc, e4, e5, h, false, true, 0.0f, true, -1, 0, 1});
      gemms.push_back({name("dgrad-e5m2-dgelu"), l.ic, M, l.oc, e4, e5, e5, false, true, 0.0f, true, -1, 0, 1});
      gemms.push_back({name("dgrad-e5m2-dgelu-e4aux"), l.ic, M, l.oc, e4, e5, e5, false, true, 0.0f, true, -1, 0, 2});
      // BF16 mode's dgrad into d(pre), m = fc2's input channels (4C)
      const char* what[] = {"bf16 dgrad-nn", "bf16 dgrad-dgelu", "bf16 dgrad-dgelu-bgrad16",
                            "bf16 dgrad-dgelu-bgrad32"};
      for (int e = 0; e < 4; ++e)
        gemms.push_back({name(what[e]), l.ic, M, l.oc, h, h, h, false, false, 0.0f, true, e});
    }
  }
  std::printf("| GEMM | m | n | k | first us | first TFLOP/s | best us | best TFLOP/s | best index | first/best |"
              " first tile,stages,splitk,cluster | best tile,stages,splitk,cluster | candidates |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  double first_sum = 0, best_sum = 0;
  const char* only = std::getenv("GEMM_SWEEP_ONLY");  // rows whose name contains it; all when unset
  for (const Gemm& g : gemms) {
    if (only && !std::strstr(g.name, only)) continue;
    const std::vector<Timed> t = sweep(lt, g, want, ws, scale, bias);
    if (t.empty()) {
      std::printf("| %s | %d | %d | %d | no algorithm |\n", g.name, g.m, g.n, g.k);
      continue;
    }
    if (t[0].us < 0) {
      std::printf("| %s | %d | %d | %d | the first choice did not run (status %d; %zu candidates) |\n", g.name, g.m,
                  g.n, g.k, static_cast<int>(-t[0].us), t.size());
      continue;
    }
    const Timed* best = &t[0];
    for (const Timed& c : t)
      if (c.us > 0 && c.us < best->us) best = &c;
    const double flop = 2.0 * g.m * g.n * g.k;
    std::printf("| %s | %d | %d | %d | %.1f | %.0f | %.1f | %.0f | %d | %.3f | %d,%d,%d,%d | %d,%d,%d,%d | %zu |\n",
                g.name, g.m, g.n, g.k, t[0].us, flop / t[0].us * 1e-6, best->us, flop / best->us * 1e-6,
                best->index, t[0].us / best->us, t[0].tile, t[0].stages, t[0].splitk, t[0].cluster, best->tile,
                best->stages, best->splitk, best->cluster, t.size());
    if (!g.variant) first_sum += t[0].us, best_sum += best->us;
    if (argc > 4) {  // every candidate
      for (const Timed& c : t)
        std::printf("    candidate %d: %.1f us, tile %d stages %d splitk %d cluster %d\n", c.index, c.us, c.tile,
                    c.stages, c.splitk, c.cluster);
    }
  }
  std::printf("layer's 12 GEMMs (without the comparison rows): first choices %.1f us, best %.1f us (%.3f)\n", first_sum,
              best_sum, first_sum / best_sum);
  return 0;
}
