// GPT-2 model: parameter layout and count, initialisation statistics, flat-buffer views,
// activation recompute equivalence, deferred gradient zeroing.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/allocator.h"
#include "nn/gpt.h"
#include "ops/ops.h"
#include "tests/util/model_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("nn: GPT-2 124M has the reference parameter count", "[nn]") {
  ModelConfig m;  // defaults are GPT-2 small
  int64_t n = 0;
  for (const auto& s : gpt2_param_specs(m)) n += s.numel();
  CHECK(m.padded_vocab() == 50304);
  CHECK(n == 124475904);  // 124,439,808 with the unpadded 50257 vocabulary + 47 x 768 padding rows
}

TEST_CASE("nn: GPT-2 init follows std 0.02 and scaled residual projections", "[nn]") {
  ModelConfig m = small_model();
  m.d_model = 64;
  m.n_layer = 4;
  GPT model(m, Device::cpu(), DType::f32, 7);
  model.init(1);
  auto& P = model.params();
  CHECK(P.padded_numel() % 7 == 0);
  auto stdev = [&](const std::string& name, int64_t limit = -1) {
    const Tensor& t = P.var(name)->value;
    const int64_t n = limit < 0 ? t.numel() : limit;
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      s += t.data<float>()[i];
      s2 += double(t.data<float>()[i]) * t.data<float>()[i];
    }
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  CHECK(stdev("h.0.attn.c_attn.weight") == Catch::Approx(0.02).epsilon(0.05));
  CHECK(stdev("h.1.mlp.c_fc.weight") == Catch::Approx(0.02).epsilon(0.05));
  CHECK(stdev("h.2.mlp.c_proj.weight") == Catch::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(stdev("h.3.attn.c_proj.weight") == Catch::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  const Tensor& wte = P.var("wte")->value;
  for (int64_t i = int64_t(m.vocab_size) * m.d_model; i < wte.numel(); ++i) REQUIRE(wte.data<float>()[i] == 0.0f);
  for (float x : P.var("h.0.ln_1.weight")->value.to_float_vector()) REQUIRE(x == 1.0f);
  for (float x : P.var("h.0.attn.c_attn.bias")->value.to_float_vector()) REQUIRE(x == 0.0f);
  // Views alias the flat buffers.
  P.var("ln_f.bias")->value.data<float>()[3] = 5.0f;
  CHECK(P.master().data<float>()[P.specs().back().offset + 3] == 5.0f);
  // Decay: matrices and embeddings only.
  for (const auto& seg : P.segments(0, P.padded_numel())) {
    for (const auto& s : P.specs()) {
      if (s.offset >= seg.begin && s.offset < seg.end) CHECK(seg.decay == (s.shape.size() == 2));
    }
  }
}

TEST_CASE("nn: initial loss is ln(V) and recompute gives identical gradients", "[nn]") {
  const ModelConfig m = small_model();
  GPT model(m, Device::cpu(), DType::f32);
  model.init(3);
  const Tensor x = random_tokens(2, 8, m.vocab_size, 11), y = random_tokens(2, 8, m.vocab_size, 12);
  const auto [l0, g0] = loss_and_grads(model, x, y, false);
  const auto [l1, g1] = loss_and_grads(model, x, y, true);
  CHECK(l0 == Catch::Approx(std::log(100.0)).epsilon(0.02));
  CHECK(l0 == l1);
  REQUIRE(g0.size() == g1.size());
  double nz = 0;
  for (size_t i = 0; i < g0.size(); ++i) {
    REQUIRE(g0[i] == Catch::Approx(g1[i]).margin(1e-7));
    nz += g0[i] != 0.0f;
  }
  CHECK(nz > g0.size() / 2);
}

TEST_CASE("nn: LayerNorm recompute gives bit-identical gradients and keeps less for backward", "[nn]") {
  const ModelConfig m = small_model();
  GPT model(m, Device::cpu(), DType::f32);
  model.init(5);
  const Tensor x = random_tokens(2, 8, m.vocab_size, 21), y = random_tokens(2, 8, m.vocab_size, 22);
  Allocator& alloc = allocator_for(Device::cpu());
  auto run = [&](bool recompute_ln) {
    model.set_recompute_layernorm(recompute_ln);
    model.params().zero_grads();
    const int64_t before = alloc.stats().cur(MemCategory::activations);
    Tape tape;
    Var loss;
    {
      TapeScope s(&tape);
      loss = model.loss(x, y);
    }
    const int64_t kept = alloc.stats().cur(MemCategory::activations) - before;
    tape.backward(loss);
    return std::make_tuple(loss->value.to_float_vector()[0], model.params().grads().to_float_vector(), kept);
  };
  const auto [l0, g0, kept0] = run(false);
  const auto [l1, g1, kept1] = run(true);
  model.set_recompute_layernorm(false);
  CHECK(l0 == l1);
  REQUIRE(g0 == g1);  // the recomputed LayerNorm outputs are the same bits
  // Two of the C-vectors per token each block keeps (ln_1 and ln_2 outputs) go.
  const int64_t expected = int64_t{m.n_layer} * 2 * 2 * 8 * m.d_model * 4;
  INFO("kept without " << kept0 << ", with " << kept1);
  CHECK(kept0 - kept1 >= expected);
}

TEST_CASE("nn: bf16 gradients over 8 micro-batches track f32 gradients at half the bytes", "[nn]") {
  const ModelConfig m = small_model();
  for (ComputeMode mode : {ComputeMode::fp32, ComputeMode::fp8}) {
    INFO("compute " << (mode == ComputeMode::fp8 ? "fp8 (emulated)" : "fp32"));
    PrecisionConfig p32, p16;
    p32.compute = p16.compute = mode;
    p32.fp8.layers = p16.fp8.layers = {"qkv", "proj", "fc", "fc2"};
    p32.grad_dtype = GradDtype::fp32;
    p16.grad_dtype = GradDtype::bf16;
    Allocator& alloc = allocator_for(Device::cpu());
    const int64_t grads_before = alloc.stats().cur(MemCategory::gradients);
    GPT a(m, Device::cpu(), DType::f32, 1, p32);
    const int64_t grads_f32 = alloc.stats().cur(MemCategory::gradients) - grads_before;
    GPT b(m, Device::cpu(), DType::f32, 1, p16);
    const int64_t grads_bf16 = alloc.stats().cur(MemCategory::gradients) - grads_before - grads_f32;
    CHECK(b.params().grads().dtype() == DType::bf16);
    CHECK(grads_bf16 * 2 == grads_f32);
    a.init(9);
    b.init(9);
    const int kMicro = 8;
    auto accumulate = [&](GPT& model) {
      model.params().zero_grads();
      for (int micro = 0; micro < kMicro; ++micro) {
        const Tensor x = random_tokens(2, 8, m.vocab_size, 100 + micro), y = random_tokens(2, 8, m.vocab_size, 200 + micro);
        Tape tape;
        Var loss;
        {
          TapeScope s(&tape);
          loss = model.loss(x, y, false, 1.0f / kMicro);
        }
        tape.backward(loss, 1.0f / kMicro);
      }
      return model.params().grads().to_float_vector();
    };
    const std::vector<float> g32 = accumulate(a), g16 = accumulate(b);
    // Per parameter: the bf16 sum rounds once per op and micro-batch (relative 2^-9 each), so the
    // accumulated gradient stays within about 1% of the f32 one in norm.
    for (const auto& s : a.params().specs()) {
      double err = 0, ref = 0;
      for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
        err += (double(g16[i]) - g32[i]) * (double(g16[i]) - g32[i]);
        ref += double(g32[i]) * g32[i];
      }
      INFO(s.name << ": |g_bf16 - g_f32| / |g_f32| = " << std::sqrt(err / ref));
      CHECK(ref > 0);
      CHECK(std::sqrt(err / ref) < 1e-2);
    }
  }
}

TEST_CASE("nn: parameters read only by FP8 GEMMs have no compute copy; the rest stay packed", "[nn]") {
  ModelConfig m = small_model();
  std::vector<ParamSpec> specs = gpt2_param_specs(m);
  const std::vector<std::string> master_only = {"h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight"};
  ParameterStore P(specs, Device::cpu(), DType::bf16, 4, DType::bf16, master_only);
  int64_t expected = 0;
  for (const auto& s : P.specs()) {
    const bool fp8_only = std::find(master_only.begin(), master_only.end(), s.name) != master_only.end();
    CHECK((s.compute_offset < 0) == fp8_only);
    if (!fp8_only) {
      CHECK(s.compute_offset == expected);
      expected += s.numel();
    }
    const size_t i = static_cast<size_t>(&s - P.specs().data());
    CHECK(P.var(i)->value.dtype() == (fp8_only ? DType::f32 : DType::bf16));
    CHECK(P.var(i)->grad.dtype() == DType::bf16);
  }
  CHECK(P.compute().numel() == expected);
  // sync_compute rounds each master value into its packed slot; master-only parameters are the master.
  float* w = P.master().data<float>();
  for (int64_t i = 0; i < P.numel(); ++i) w[i] = 0.001f * static_cast<float>(i % 997) + 1.0f / 3.0f;
  P.sync_compute();
  for (const auto& s : P.specs()) {
    const std::vector<float> v = P.var(s.name)->value.to_float_vector();
    for (int64_t j = 0; j < s.numel(); j += 7) {
      const float master = w[s.offset + j];
      REQUIRE(v[static_cast<size_t>(j)] == (s.compute_offset < 0 ? master : bf16_to_float(float_to_bf16(master))));
    }
  }
  // Segments carry the compute offset of their first element and never straddle a copy/no-copy edge.
  for (const DecaySegment& seg : P.segments(5, P.padded_numel() - 3)) {
    for (const auto& s : P.specs()) {
      const int64_t b = std::max(seg.begin, s.offset), e = std::min(seg.end, s.offset + s.numel());
      if (b >= e) continue;
      CHECK((seg.compute < 0) == (s.compute_offset < 0));
      if (seg.compute >= 0) CHECK(seg.compute + (b - seg.begin) == s.compute_offset + (b - s.offset));
    }
  }
}

TEST_CASE("nn: a sharded master keeps its shard; copies and codes are cut for an all-gather by shard", "[nn]") {
  ModelConfig m = small_model();
  const std::vector<std::string> master_only = {"h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight"};
  constexpr int R = 3;
  std::vector<float> full;
  for (int r = 0; r < R; ++r) {
    INFO("shard " << r << " of " << R);
    ParameterStore P(gpt2_param_specs(m), Device::cpu(), DType::bf16, R, DType::bf16, master_only, {},
                     FlatShard{r, R});
    REQUIRE(P.master_sharded());
    const int64_t shard = P.padded_numel() / R;
    CHECK(P.master().numel() == shard);
    CHECK(P.master_begin() == r * shard);
    if (full.empty()) {
      full.resize(static_cast<size_t>(P.numel()));
      for (size_t i = 0; i < full.size(); ++i) full[i] = 0.001f * static_cast<float>(i % 991) - 0.37f;
    }
    P.set_master(full.data());
    // The master holds this shard's values (the padding zeros).
    const std::vector<float> got = P.master().to_float_vector();
    for (int64_t i = 0; i < shard; ++i) {
      const int64_t x = r * shard + i;
      REQUIRE(got[static_cast<size_t>(i)] == (x < P.numel() ? full[static_cast<size_t>(x)] : 0.0f));
    }
    // FP8-only weights are codes; the rest have compute copies, together the whole model.
    int64_t codes = 0, copies = 0;
    for (size_t i = 0; i < P.specs().size(); ++i) {
      const bool fp8_only = std::find(master_only.begin(), master_only.end(), P.specs()[i].name) != master_only.end();
      CHECK(P.var(i)->value.dtype() == (fp8_only ? DType::e4m3 : DType::bf16));
      (fp8_only ? codes : copies) += P.specs()[i].numel();
    }
    CHECK(P.codes().numel() == codes);
    CHECK(P.compute().numel() == copies);
    // Cuts: rank k's elements of the packed buffers, ascending from 0 to the end.
    const std::vector<int64_t> cc = P.compute_cuts(), kc = P.codes_cuts();
    REQUIRE(cc.size() == R + 1);
    REQUIRE(kc.size() == R + 1);
    CHECK(cc.front() == 0);
    CHECK(cc.back() == copies);
    CHECK(kc.front() == 0);
    CHECK(kc.back() == codes);
    for (int k = 0; k < R; ++k) CHECK(cc[k + 1] - cc[k] + kc[k + 1] - kc[k] <= shard);
    // sync_compute wrote exactly the copies of this shard's elements: the others are still zero.
    for (size_t i = 0; i < P.specs().size(); ++i) {
      const ParamSpec& s = P.specs()[i];
      if (s.compute_offset < 0) continue;
      const std::vector<float> v = P.var(i)->value.to_float_vector();
      for (int64_t j = 0; j < s.numel(); ++j) {
        const int64_t x = s.offset + j;
        const bool mine = x >= r * shard && x < (r + 1) * shard;
        const float want = mine ? bf16_to_float(float_to_bf16(full[static_cast<size_t>(x)])) : 0.0f;
        REQUIRE(v[static_cast<size_t>(j)] == want);
      }
    }
  }
}

TEST_CASE("nn: FP8 weights of a sharded master must be published before a forward", "[nn]") {
  const ModelConfig m = small_model();
  PrecisionConfig pc;
  pc.compute = ComputeMode::fp8;
  GPT g(m, Device::cpu(), DType::f32, 2, pc, {}, FlatShard{0, 2});
  g.init(3);
  const Tensor x = random_tokens(2, 8, m.vocab_size, 1), y = random_tokens(2, 8, m.vocab_size, 2);
  CHECK_THROWS_WITH(g.loss(x, y), Catch::Matchers::ContainsSubstring("GPT::publish_weights must run"));
  g.publish_weights({});  // one process: its own half of every FP8 weight, the rest zeros
  CHECK(std::isfinite(g.loss(x, y)->value.to_float_vector()[0]));
  g.on_optimizer_step();  // a new weight version: the codes are stale until published again
  CHECK_THROWS_WITH(g.loss(x, y), Catch::Matchers::ContainsSubstring("GPT::publish_weights must run"));
}

TEST_CASE("nn: armed f32 accumulators give the bf16 gradients of zeroed temporaries bit for bit", "[nn]") {
  // ParameterStore::arm_accumulators: the biases' and LayerNorm weights' f32 sums go to accumulators zeroed once
  // per micro-step instead of a zeroed temporary per op; each op's sum is still added into the bf16 gradient once,
  // right away or (deferred) by commit_accumulators after the backward.
  const ModelConfig m = small_model();
  enum class Arm { none, immediate, deferred };
  for (ComputeMode mode : {ComputeMode::fp32, ComputeMode::fp8}) {
    INFO("compute " << (mode == ComputeMode::fp8 ? "fp8 (emulated)" : "fp32"));
    PrecisionConfig p;
    p.compute = mode;
    p.fp8.layers = {"qkv", "proj", "fc", "fc2"};
    p.grad_dtype = GradDtype::bf16;
    auto accumulate = [&](Arm arm) {
      GPT model(m, Device::cpu(), DType::f32, 1, p);
      model.init(5);
      ParameterStore& P = model.params();
      P.zero_grads();
      for (int micro = 0; micro < 3; ++micro) {
        if (arm != Arm::none) P.arm_accumulators(arm == Arm::deferred);
        const Tensor x = random_tokens(2, 8, m.vocab_size, 300 + micro);
        const Tensor y = random_tokens(2, 8, m.vocab_size, 400 + micro);
        Tape tape;
        Var loss;
        {
          TapeScope s(&tape);
          loss = model.loss(x, y, false, 1.0f / 3);
        }
        tape.backward(loss, 1.0f / 3);
        // Every one-dimensional parameter's accumulator was taken by its op (its add pending when deferred); the
        // matrices have none.
        for (size_t i = 0; arm != Arm::none && i < P.specs().size(); ++i) {
          const GradCell& cell = *P.var(i)->grad_cell;
          const bool vector = P.specs()[i].shape.size() == 1;
          INFO(P.specs()[i].name);
          CHECK(cell.accumulator.defined() == vector);
          CHECK_FALSE(cell.accumulator_armed);
          CHECK(cell.accumulator_pending == (vector && arm == Arm::deferred));
        }
        P.commit_accumulators();
      }
      return P.grads().to_float_vector();
    };
    const std::vector<float> plain = accumulate(Arm::none);
    for (Arm arm : {Arm::immediate, Arm::deferred}) {
      INFO((arm == Arm::deferred ? "deferred" : "immediate"));
      const std::vector<float> armed = accumulate(arm);
      REQUIRE(plain.size() == armed.size());
      int64_t differ = 0;
      for (size_t i = 0; i < plain.size(); ++i) differ += std::memcmp(&plain[i], &armed[i], sizeof(float)) != 0;
      CHECK(differ == 0);
    }
  }
  PrecisionConfig f32;  // f32 gradients: the ops sum into the gradient itself, so there is nothing to arm
  GPT model(m, Device::cpu(), DType::f32, 1, f32);
  model.params().arm_accumulators(true);
  for (size_t i = 0; i < model.params().specs().size(); ++i)
    CHECK_FALSE(model.params().var(i)->grad_cell->accumulator.defined());
}

TEST_CASE("nn: deferred zeroing - stale matrices until written - the step's gradients bit for bit", "[nn]") {
  // ParameterStore::zero_grads_deferred (the trainer's step): the vectors' gradients are zeroed, the matrices' only
  // marked stale; grad_of zeroes a stale one before an op adds into it, zero_stale_grads zeroes those left.
  const ModelConfig m = small_model();
  {
    GPT model(m, Device::cpu(), DType::f32);
    ParameterStore& P = model.params();
    fill_(P.grads(), 7.0f);
    P.zero_grads_deferred();
    for (size_t i = 0; i < P.specs().size(); ++i) {
      const bool matrix = P.specs()[i].shape.size() == 2;
      INFO(P.specs()[i].name);
      CHECK(P.var(i)->grad_cell->stale == matrix);
      const std::vector<float> g = P.var(i)->grad.to_float_vector();
      CHECK(std::all_of(g.begin(), g.end(), [&](float v) { return v == (matrix ? 7.0f : 0.0f); }));
    }
    const Var& wpe = P.var("wpe");
    const std::vector<float> g = grad_of(wpe).to_float_vector();
    CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
    CHECK_FALSE(wpe->grad_cell->stale);
    CHECK(P.var("wte")->grad_cell->stale);
    P.zero_stale_grads();
    const std::vector<float> all = P.grads().to_float_vector();
    CHECK(std::all_of(all.begin(), all.end(), [](float v) { return v == 0.0f; }));
    for (size_t i = 0; i < P.specs().size(); ++i) CHECK_FALSE(P.var(i)->grad_cell->stale);
  }
  for (ComputeMode mode : {ComputeMode::fp32, ComputeMode::fp8}) {
    for (GradDtype grad : {GradDtype::fp32, GradDtype::bf16}) {
      INFO("compute " << (mode == ComputeMode::fp8 ? "fp8 (emulated)" : "fp32") << ", "
                      << (grad == GradDtype::bf16 ? "bf16" : "f32") << " gradients");
      PrecisionConfig p;
      p.compute = mode;
      p.grad_dtype = grad;
      GPT a(m, Device::cpu(), DType::f32, 1, p), b(m, Device::cpu(), DType::f32, 1, p);
      a.init(5);
      b.init(5);
      const Tensor x = random_tokens(2, 8, m.vocab_size, 21), y = random_tokens(2, 8, m.vocab_size, 22);
      for (bool recompute : {false, true}) {
        INFO("block recompute " << recompute);
        const auto [la, ga] = loss_and_grads(a, x, y, recompute);
        const auto [lb, gb] = loss_and_grads_deferred(b, x, y, recompute);
        CHECK(la == lb);
        REQUIRE(ga.size() == gb.size());
        int64_t differ = 0;
        for (size_t i = 0; i < ga.size(); ++i) differ += std::memcmp(&ga[i], &gb[i], sizeof(float)) != 0;
        CHECK(differ == 0);
      }
    }
  }
}
