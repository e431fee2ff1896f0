// cuBLASLt GEMM wrapper: one context per device (handle, 32 MiB workspace, plan cache, memory and options). The
// bias-gradient column reduction (matmul_backward_bias) is in kernels/column_sum.cu.
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda_common.cuh"
#include "kernels/matmul.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// cuBLASLt plumbing

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::e4m3: return CUDA_R_8F_E4M3;
    case DType::e5m2: return CUDA_R_8F_E5M2;
    default: FP8T_FAIL("matmul: dtype {} is not a GEMM operand type", dtype_name(t));
  }
}

cublasLtEpilogue_t lt_epilogue(MatmulEpilogue e) {
  switch (e) {
    case MatmulEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case MatmulEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case MatmulEpilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case MatmulEpilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case MatmulEpilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case MatmulEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// cuBLASLt's scale mode of an FP8 operand (CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE, int32). Only per_tensor reaches
// here (matmul_cublaslt refuses the others); the mapping of the rest is what they will use.
int32_t lt_scale_mode(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::per_tensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case ScaleLayout::per_row: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case ScaleLayout::block_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScaleLayout::block_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}

struct PlanKey {
  int m, n, k;
  bool trans_a, trans_b, scaled_a, scaled_b, fast_accum;
  ScaleLayout scale_layout_a, scale_layout_b;  // FP8 operands only (per_tensor otherwise)
  DType a, b, d;
  MatmulEpilogue epilogue;
  int align_a, align_b, align_d, align_bias;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(k.m));
    mix(static_cast<uint64_t>(k.n));
    mix(static_cast<uint64_t>(k.k));
    mix((k.trans_a ? 1u : 0u) | (k.trans_b ? 2u : 0u) | (k.scaled_a ? 4u : 0u) | (k.scaled_b ? 8u : 0u) |
        (k.fast_accum ? 16u : 0u) | (static_cast<uint64_t>(k.scale_layout_a) << 8) |
        (static_cast<uint64_t>(k.scale_layout_b) << 16));
    mix((static_cast<uint64_t>(k.a) << 24) | (static_cast<uint64_t>(k.b) << 16) | (static_cast<uint64_t>(k.d) << 8) |
        static_cast<uint64_t>(k.epilogue));
    mix((static_cast<uint64_t>(k.align_a) << 48) | (static_cast<uint64_t>(k.align_b) << 32) |
        (static_cast<uint64_t>(k.align_d) << 16) | static_cast<uint64_t>(k.align_bias));
    return h;
  }
};

using MatmulDesc = CudaHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = CudaHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using MatmulPreference = CudaHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// Descriptors and the chosen algorithm for one key; pointers are set on the descriptor per call.
struct Plan {
  MatmulDesc desc;
  MatrixLayout a, b, d;
  cublasLtMatmulAlgo_t algo{};
  // Autotuning: the heuristic's candidates, timed on the first call that has real operands.
  // More than one: still to be timed (autotune() then clears them).
  std::array<cublasLtMatmulAlgo_t, 8> candidates{};
  int num_candidates = 0;
};

MatrixLayout make_layout(cudaDataType_t t, int rows, int cols) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, rows, cols, rows));
  return MatrixLayout(l);
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// One device's GEMM state: the options and memory its users set, and from its first GEMM on (made with the device
// current) the cuBLASLt handle, the workspace and the plans. mu guards every member.
struct DeviceContext {
  std::mutex mu;
  MatmulOptions options;
  MatmulMemory memory;
  CublasLtHandle handle;
  void* workspace = nullptr;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;

  void* allocate(size_t bytes) {
    if (memory.allocate) return memory.allocate(bytes);
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  // Before each GEMM, under mu.
  void ensure_started() {
    if (workspace) return;
    handle = make_cublaslt();
    // Held for the life of the process (from the caching allocator once it exists: it then outlives these
    // contexts at exit).
    workspace = allocate(kWorkspaceBytes);
  }
};

// The context of CUDA device `device`, made on first use and kept for the life of the process.
DeviceContext& device_context(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceContext>> contexts;
  std::lock_guard lk(mu);
  auto& ctx = contexts[device];
  if (!ctx) ctx = std::make_unique<DeviceContext>();
  return *ctx;
}

int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

Plan& get_plan(DeviceContext& ctx, const PlanKey& key) {
  if (auto it = ctx.plans.find(key); it != ctx.plans.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->desc = MatmulDesc(desc);
  const cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(key.epilogue));
  if (key.a == DType::e4m3 || key.a == DType::e5m2) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(key.fast_accum ? 1 : 0));
    set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(key.scale_layout_a));
    set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(key.scale_layout_b));
  }
  if (key.epilogue == MatmulEpilogue::bias || key.epilogue == MatmulEpilogue::gelu_bias ||
      key.epilogue == MatmulEpilogue::gelu_aux_bias)
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(key.d));
  if (key.epilogue == MatmulEpilogue::gelu_aux_bias || key.epilogue == MatmulEpilogue::dgelu)
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{key.m});
  plan->a = key.trans_a ? make_layout(cuda_type(key.a), key.k, key.m) : make_layout(cuda_type(key.a), key.m, key.k);
  plan->b = key.trans_b ? make_layout(cuda_type(key.b), key.n, key.k) : make_layout(cuda_type(key.b), key.k, key.n);
  plan->d = make_layout(cuda_type(key.d), key.m, key.n);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  MatmulPreference pref(pref_raw);
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_d));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_d));

  constexpr int kMaxCandidates = 8;  // Plan::candidates' size
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates]{};
  const int want = ctx.options.autotune ? kMaxCandidates : 1;
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc, plan->a, plan->b, plan->d, plan->d, pref, want,
                                              results, &found));
  FP8T_CHECK(found > 0,
             "cuBLASLt has no algorithm for D({}x{}, {}) = op(A {}{}) op(B {}{}), k={}, epilogue {}, "
             "alignments A/B/D {}/{}/{} bytes",
             key.m, key.n, dtype_name(key.d), dtype_name(key.a), key.trans_a ? "^T" : "", dtype_name(key.b),
             key.trans_b ? "^T" : "", key.k, static_cast<int>(key.epilogue), key.align_a, key.align_b, key.align_d);
  plan->algo = results[0].algo;
  for (int i = 0; i < found; ++i)
    if (i == 0 || results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates[plan->num_candidates++] = results[i].algo;
  Plan& p = *plan;
  ctx.plans[key] = std::move(plan);
  return p;
}

// Times each candidate of a new plan on this call's operands (3 runs after a warm-up) and keeps the fastest. The
// call does not accumulate (beta 0), so the timing runs write D and the GELU aux output in place: the chosen
// algorithm's run after them writes both again.
void autotune(DeviceContext& ctx, Plan& plan, const void* a, const void* b, void* d, float alpha, cudaStream_t stream) {
  const float beta = 0.0f;
  cudaEvent_t ev[2];
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  float best_ms = 0;
  int best = -1;
  for (int i = 0; i < plan.num_candidates; ++i) {
    // The first run is the warm-up; a candidate the heuristic offered but that cannot run is skipped.
    constexpr int kRuns = 4;
    bool ok = true;
    for (int r = 0; r < kRuns && ok; ++r) {
      if (r == 1) CUDA_CHECK(cudaEventRecord(ev[0], stream));
      ok = cublasLtMatmul(ctx.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d,
                          &plan.candidates[i], ctx.workspace, kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
    }
    if (!ok) continue;
    CUDA_CHECK(cudaEventRecord(ev[1], stream));
    CUDA_CHECK(cudaEventSynchronize(ev[1]));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    if (best < 0 || ms < best_ms) best = i, best_ms = ms;
  }
  CUDA_CHECK_LAUNCH();
  for (auto& e : ev) CUDA_CHECK(cudaEventDestroy(e));
  if (best >= 0) plan.algo = plan.candidates[best];
  plan.num_candidates = 0;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

namespace {

void matmul_lt(void* d, DType d_dtype, const MatmulOperand& a, bool trans_a, const MatmulOperand& b, bool trans_b,
               int m, int n, int k, float alpha, float beta, MatmulEpilogue epilogue, const void* bias, void* aux,
               bool fast_accum, cudaStream_t stream) {
  FP8T_CHECK(m > 0 && n > 0 && k > 0, "matmul: bad sizes m={} n={} k={}", m, n, k);
  FP8T_CHECK(d_dtype == DType::bf16 || d_dtype == DType::f32, "matmul: output dtype {} (bf16 or f32)",
             dtype_name(d_dtype));
  const bool has_bias = epilogue == MatmulEpilogue::bias || epilogue == MatmulEpilogue::gelu_bias ||
                        epilogue == MatmulEpilogue::gelu_aux_bias;
  FP8T_CHECK(!has_bias || bias != nullptr, "matmul: bias epilogue without a bias pointer");
  const bool has_aux = epilogue == MatmulEpilogue::gelu_aux_bias || epilogue == MatmulEpilogue::dgelu;
  FP8T_CHECK(!has_aux || aux != nullptr, "matmul: GELU aux epilogue without aux");
  const bool fp8 = a.dtype == DType::e4m3 || a.dtype == DType::e5m2;
  FP8T_CHECK(fp8 == (b.dtype == DType::e4m3 || b.dtype == DType::e5m2),
             "matmul: both operands must be FP8 or neither, got {} and {}", dtype_name(a.dtype), dtype_name(b.dtype));
  FP8T_CHECK(!fp8 || (trans_a && !trans_b), "matmul: FP8 GEMMs need the TN layout (both operands K-major)");
  // cublasLtMatmul answers only "not supported" for scale pointers at a 4-byte offset (H200, cuBLASLt 13).
  FP8T_CHECK(!fp8 || (alignment_of(a.scale) >= 16 && alignment_of(b.scale) >= 16),
             "matmul: FP8 scale pointers must be 16-byte aligned, got {} and {}",
             static_cast<const void*>(a.scale), static_cast<const void*>(b.scale));
  FP8T_CHECK(!fp8 || (m % 16 == 0 && n % 16 == 0 && k % 16 == 0),
             "matmul: FP8 GEMMs need every dimension to be a multiple of 16, got m={} n={} k={}", m, n, k);
  FP8T_CHECK(!(a.dtype == DType::e5m2 && b.dtype == DType::e5m2), "matmul: E5M2 x E5M2 is not supported by cuBLASLt");
  FP8T_CHECK(!fp8 || (a.scale_layout == ScaleLayout::per_tensor && b.scale_layout == ScaleLayout::per_tensor),
             "matmul: FP8 operands with per-row or block scales (layouts {} and {}) are not wired to cuBLASLt yet; "
             "only per-tensor scales are", static_cast<int>(a.scale_layout), static_cast<int>(b.scale_layout));

  DeviceContext& ctx = device_context(current_device());
  std::lock_guard lk(ctx.mu);
  ctx.ensure_started();
  const PlanKey key{m, n, k, trans_a, trans_b, a.scale != nullptr, b.scale != nullptr, fp8 && fast_accum,
                    a.scale_layout, b.scale_layout, a.dtype, b.dtype, d_dtype, epilogue, alignment_of(a.data),
                    alignment_of(b.data), alignment_of(d), has_bias ? alignment_of(bias) : 256};
  Plan& plan = get_plan(ctx, key);
  if (has_bias) set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (has_aux) set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  if (a.scale) set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.scale);
  if (b.scale) set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.scale);
  if (plan.num_candidates > 1) {
    // The plan keeps the heuristic's first choice when its first call accumulates (timing it would need a scratch
    // D, weight-sized for a wgrad, at the step's peak; the wgrads' first choices were the fastest in
    // scripts/bench/gemm_sweep.cu) or when its stream is being captured into a CUDA graph (timing waits on the host).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (beta == 0.0f && capture == cudaStreamCaptureStatusNone)
      autotune(ctx, plan, a.data, b.data, d, alpha, stream);
    else
      plan.num_candidates = 0;
  }
  CUBLAS_CHECK(cublasLtMatmul(ctx.handle, plan.desc, &alpha, a.data, plan.a, b.data, plan.b, &beta, d, plan.d, d,
                              plan.d, &plan.algo, ctx.workspace, kWorkspaceBytes, stream));
}

}  // namespace

void set_matmul_memory(int device, const MatmulMemory& memory) {
  DeviceContext& ctx = device_context(device);
  std::lock_guard lk(ctx.mu);
  ctx.memory = memory;
}

void set_matmul_options(int device, const MatmulOptions& options) {
  DeviceContext& ctx = device_context(device);
  std::lock_guard lk(ctx.mu);
  ctx.options = options;
}

void matmul_cublaslt(void* d, DType d_dtype, const MatmulOperand& a, bool trans_a, const MatmulOperand& b,
                     bool trans_b, int m, int n, int k, float alpha, float beta, MatmulEpilogue epilogue,
                     const void* bias, void* aux, cudaStream_t stream) {
  matmul_lt(d, d_dtype, a, trans_a, b, trans_b, m, n, k, alpha, beta, epilogue, bias, aux, /*fast_accum=*/false,
            stream);
}

void matmul_forward(void* out, DType out_dtype, const bf16* inp, const bf16* weight, const void* bias, int M, int K,
                    int N, cudaStream_t stream) {
  // Column-major view: out^T (N, M) = W (N, K) [stored (K, N), transposed] @ inp^T (K, M)
  matmul_cublaslt(out, out_dtype, {weight, DType::bf16}, true, {inp, DType::bf16}, false, N, M, K, 1.0f, 0.0f,
                  bias ? MatmulEpilogue::bias : MatmulEpilogue::none, bias, nullptr, stream);
}

void matmul_backward_input(bf16* dinp, const bf16* dout, const bf16* weight, int M, int K, int N, bool accumulate,
                           cudaStream_t stream) {
  // dinp^T (K, M) = W^T (K, N) [W stored (K, N) column-major] @ dout^T (N, M)
  matmul_cublaslt(dinp, DType::bf16, {weight, DType::bf16}, false, {dout, DType::bf16}, false, K, M, N, 1.0f,
                  accumulate ? 1.0f : 0.0f, MatmulEpilogue::none, nullptr, nullptr, stream);
}

void matmul_forward_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias, int M, int K,
                         int N, cudaStream_t stream) {
  // As matmul_forward; the aux output pre^T (N, M) has leading dimension N, as out^T does.
  matmul_cublaslt(out, DType::bf16, {weight, DType::bf16}, true, {inp, DType::bf16}, false, N, M, K, 1.0f, 0.0f,
                  MatmulEpilogue::gelu_aux_bias, bias, pre, stream);
}

void matmul_backward_input_dgelu(bf16* dpre, const bf16* dout, const bf16* weight, const bf16* pre, int M, int K,
                                 int N, cudaStream_t stream) {
  // As matmul_backward_input with beta 0; pre^T (K, M) has leading dimension K, as dpre^T does.
  matmul_cublaslt(dpre, DType::bf16, {weight, DType::bf16}, false, {dout, DType::bf16}, false, K, M, N, 1.0f, 0.0f,
                  MatmulEpilogue::dgelu, nullptr, const_cast<bf16*>(pre), stream);
}

void matmul_backward_weight(void* dweight, DType dweight_dtype, const bf16* dout, const bf16* inp, int M, int K, int N,
                            bool accumulate, cudaStream_t stream) {
  FP8T_CHECK(dweight_dtype == DType::f32 || dweight_dtype == DType::bf16,
             "matmul_backward_weight: dweight must be f32 or bf16, got {}", dtype_name(dweight_dtype));
  // dW^T (K, N) = inp^T (K, M) @ dout (M, N) [dout stored (N, M) column-major, transposed]
  matmul_cublaslt(dweight, dweight_dtype, {inp, DType::bf16}, false, {dout, DType::bf16}, true, K, N, M, 1.0f,
                  accumulate ? 1.0f : 0.0f, MatmulEpilogue::none, nullptr, nullptr, stream);
}

// FP8: cuBLASLt takes only op(A) = A^T, op(B) = B (TN), i.e. both operands K-major. A row-major (R, C)
// matrix is a column-major (C, R) one, so each GEMM below names which stored copy is K-major.

void matmul_fp8_forward(bf16* out, const MatmulOperand& inp, const MatmulOperand& weight, const bf16* bias, int M,
                        int K, int N, cudaStream_t stream, bool fast_accum) {
  // out^T (N, M) = weight (N, K) [stored (K, N) column-major, K-major] @ inp^T (K, M) [inp (M, K), K-major]
  matmul_lt(out, DType::bf16, weight, true, inp, false, N, M, K, 1.0f, 0.0f,
            bias ? MatmulEpilogue::bias : MatmulEpilogue::none, bias, nullptr, fast_accum, stream);
}

void matmul_fp8_backward_input(bf16* dinp, const MatmulOperand& dout, const MatmulOperand& weight_t, int M, int K,
                               int N, bool accumulate, cudaStream_t stream, bool fast_accum) {
  // dinp^T (K, M) = weight^T (K, N) [weight_t (K, N) row-major, N-major] @ dout^T (N, M) [dout (M, N), N-major]
  matmul_lt(dinp, DType::bf16, weight_t, true, dout, false, K, M, N, 1.0f, accumulate ? 1.0f : 0.0f,
            MatmulEpilogue::none, nullptr, nullptr, fast_accum, stream);
}

void matmul_fp8_backward_weight(void* dweight, DType dweight_dtype, const MatmulOperand& dout_t,
                                const MatmulOperand& inp_t, int M, int K, int N, bool accumulate, cudaStream_t stream,
                                bool fast_accum) {
  FP8T_CHECK(dweight_dtype == DType::f32 || dweight_dtype == DType::bf16,
             "matmul_fp8_backward_weight: dweight must be f32 or bf16, got {}", dtype_name(dweight_dtype));
  // dweight^T (K, N) = inp^T (K, M) [inp_t (K, M), M-major] @ dout (M, N) [dout_t (N, M), M-major]
  matmul_lt(dweight, dweight_dtype, inp_t, true, dout_t, false, K, N, M, 1.0f, accumulate ? 1.0f : 0.0f,
            MatmulEpilogue::none, nullptr, nullptr, fast_accum, stream);
}

}  // namespace fp8t::kernels
