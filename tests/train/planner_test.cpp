// Memory planner: its linear fit predicts a micro-batch it did not measure, recompute shrinks the
// per-sequence cost, and the largest micro-batch is the last one under the headroom.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <random>

#include "config/config.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "train/planner.h"

using namespace fp8t;

namespace {
Config small(const char* recompute) {
  return parse_config(fmt::format("model: {{n_layer: 3, n_head: 2, d_model: 32, vocab_size: 500, seq_len: 32}}\n"
                                  "train: {{micro_batch: 6, recompute: {}}}\n",
                                  recompute),
                      "plan.yaml");
}

int64_t measured_peak(const Config& cfg, int b) {
  GPT model(cfg.model, Device::cpu(), DType::f32, 1, cfg.precision);
  model.init(1);
  AdamW optim(cfg.optim, model.params(), 0, model.params().padded_numel());
  Tensor x = Tensor::empty({b, 32}, DType::i32), y = Tensor::empty({b, 32}, DType::i32);
  std::mt19937 rng(7);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>(rng() % 500);
    y.data<int32_t>()[i] = static_cast<int32_t>(rng() % 500);
  }
  allocator_for(Device::cpu()).reset_peaks();
  Tape tape;
  Var loss;
  {
    TapeScope s(&tape);
    loss = model.loss(x, y, cfg.train.recompute == Recompute::block);
  }
  tape.backward(loss);
  return allocator_for(Device::cpu()).stats().total_peak;
}
}  // namespace

TEST_CASE("plan: the fitted line predicts an unmeasured micro-batch", "[plan]") {
  const Config cfg = small("none");
  const MemoryPlan p = plan_memory(cfg, 1);
  // Measured where every micro-batch fills a chunk of the head and loss (4,096 tokens: 128 sequences).
  CHECK(p.measured[0] == 128);
  CHECK(p.measured[1] == 129);
  const int b = p.measured[1] + 7;
  const double predicted = p.peak(b), actual = static_cast<double>(measured_peak(cfg, b));
  INFO("predicted " << predicted << " actual " << actual);
  CHECK(std::abs(predicted - actual) / actual < 0.03);
  const int64_t padded = GPT(cfg.model, Device::cpu(), DType::f32).params().padded_numel();
  CHECK(p.category(MemCategory::optimizer, b) == 8.0 * padded);  // two f32 moments
  CHECK(p.per_sample[static_cast<size_t>(MemCategory::parameters)] == 0);
  CHECK(p.peak(p.max_micro_batch) <= p.capacity * p.headroom);
  CHECK(p.peak(p.max_micro_batch + 1) > p.capacity * p.headroom);
  CHECK_THAT(p.table(), Catch::Matchers::ContainsSubstring("largest micro_batch that fits"));
}

TEST_CASE("plan: activation recompute and ZeRO sharding shrink what they should", "[plan]") {
  const MemoryPlan full = plan_memory(small("none"), 1), recompute = plan_memory(small("block"), 1);
  CHECK(recompute.per_sample[static_cast<size_t>(MemCategory::activations)] <
        full.per_sample[static_cast<size_t>(MemCategory::activations)]);
  Config sharded = small("none");
  sharded.distributed.zero_stage = 1;
  const MemoryPlan two = plan_memory(sharded, 2);
  const auto opt = static_cast<size_t>(MemCategory::optimizer);
  const int64_t padded2 = GPT(sharded.model, Device::cpu(), DType::f32, 2).params().padded_numel();
  CHECK(two.fixed[opt] == 8.0 * padded2 / 2);  // this rank's half of both moments
  CHECK(two.fixed[opt] < 0.51 * full.fixed[opt]);
}

TEST_CASE("plan: FP8 activation storage shrinks what the tape keeps for backward", "[plan][fp8]") {
  // Per layer the tape keeps (in C-vectors per token): fp32 mode 16 (LN inputs 2, linear inputs 1+1+1+4,
  // qkv 3, GELU input 4); FP8 storage keeps the four linear inputs as 1-byte codes: 11.75 of 16.
  // A small vocabulary, so the logits do not dominate.
  const Config base = parse_config("model: {n_layer: 3, n_head: 2, d_model: 64, vocab_size: 64, seq_len: 32}\n", "q.yaml");
  const MemoryPlan f32 = plan_memory(base, 1);
  Config fp8 = base;
  fp8.precision.compute = ComputeMode::fp8;
  const MemoryPlan q = plan_memory(fp8, 1);
  INFO("fp32 " << f32.saved_per_sample << " fp8 " << q.saved_per_sample);
  CHECK(q.saved_per_sample < 0.8 * f32.saved_per_sample);
  Config bf16_storage = fp8;
  bf16_storage.precision.fp8.activation_storage = ActivationStorage::bf16;
  CHECK(plan_memory(bf16_storage, 1).saved_per_sample > 0.95 * f32.saved_per_sample);
  // fp8_all also keeps qkv (3 C-vectors) and the GELU input (4) as codes: 21 of the 47 bytes per C
  // that fp8 storage keeps go, leaving 26 of fp32 mode's 64 (0.41x; on the GPU, against BF16's 32
  // bytes per C, 20 of 32: 0.625x).
  Config all = fp8;
  all.precision.fp8.activation_storage = ActivationStorage::fp8_all;
  const MemoryPlan qa = plan_memory(all, 1);
  INFO("fp8_all " << qa.saved_per_sample);
  CHECK(qa.saved_per_sample < 0.65 * q.saved_per_sample);
  CHECK(qa.saved_per_sample < 0.5 * f32.saved_per_sample);
  // LayerNorm recompute drops the two LayerNorm outputs per block (8 of fp32 mode's 64 bytes per C).
  Config ln = base;
  ln.train.recompute = Recompute::layernorm;
  const MemoryPlan l = plan_memory(ln, 1);
  INFO("layernorm recompute " << l.saved_per_sample);
  CHECK(l.saved_per_sample < 0.92 * f32.saved_per_sample);
}

TEST_CASE("plan: ZeRO stage 2 keeps 1/N of the gradients plus staging buckets", "[plan][zero]") {
  Config cfg = small("none");
  cfg.distributed.bucket_mb = 0.01;  // 2,621 floats: the buckets are small next to the buffer
  const MemoryPlan stage0 = plan_memory(cfg, 8);  // stage 0: the whole gradient buffer
  cfg.distributed.zero_stage = 2;
  const MemoryPlan stage2 = plan_memory(cfg, 8);
  const auto grads = static_cast<size_t>(MemCategory::gradients), opt = static_cast<size_t>(MemCategory::optimizer);
  const int64_t padded = GPT(cfg.model, Device::cpu(), DType::f32, 8).params().padded_numel();
  CHECK(stage0.grad_kept_bytes == 4 * padded);
  CHECK(stage0.fixed[grads] == 4.0 * padded);
  CHECK(stage2.grad_buffer_bytes == 4 * padded);
  CHECK(stage2.grad_kept_bytes * 8 == 4 * padded);  // this rank's shard
  CHECK(stage2.fixed[opt] * 8 == stage0.fixed[opt]);
  // Measured: the shard and the staging peak (wte's bucket, as large as wte, and a few small ones).
  INFO("stage 2 gradients " << stage2.fixed[grads] << " of " << stage0.fixed[grads]);
  CHECK(stage2.fixed[grads] > stage2.grad_kept_bytes);
  CHECK(stage2.fixed[grads] < 0.8 * stage0.fixed[grads]);
  CHECK(stage2.per_sample[grads] == 0);
  CHECK_THAT(stage2.table(), Catch::Matchers::ContainsSubstring("(1/8 of the"));
}

TEST_CASE("plan: a memory limit is the capacity planned to, and the largest micro-batch follows it", "[plan]") {
  const Config cfg = small("none");
  const MemoryPlan whole = plan_memory(cfg, 1);
  Config capped = cfg;
  // Room for exactly 10 sequences at the planner's headroom.
  const double bytes = (whole.total_fixed + 10.5 * whole.total_per_sample) / whole.headroom;
  capped.run.memory_limit_gib = bytes / double(int64_t{1} << 30);
  const MemoryPlan p = plan_memory(capped, 1);
  allocator_for(Device::cpu()).set_limit(0);
  CHECK(std::llabs(p.capacity - std::llround(bytes)) <= 1);
  CHECK(p.max_micro_batch == 10);
  CHECK(allocator_for(Device::cpu()).capacity() == whole.capacity);  // lifted again
}

TEST_CASE("plan: --compare lists each alternative once and times a step of each", "[plan]") {
  Config cfg = small("none");
  cfg.precision.compute = ComputeMode::fp8;
  const std::vector<PlanOption> options = plan_options(cfg, 2);
  std::vector<std::string> names;
  for (const auto& o : options) names.push_back(o.name);
  const std::vector<std::string> expected{"as configured",   "activation_storage bf16", "activation_storage fp8_all",
                                          "state_dtype bf16", "state_dtype fp8",         "recompute layernorm",
                                          "recompute block", "zero_stage 1",            "zero_stage 2",
                                          "BF16 mode"};
  CHECK(names == expected);
  CHECK(options[2].cfg.precision.fp8.activation_storage == ActivationStorage::fp8_all);
  CHECK(options.back().cfg.precision.compute == ComputeMode::bf16);
  CHECK(options.back().cfg.optim.state_dtype == StateDtype::fp32);
  // Two of them planned and timed, on the CPU.
  const std::vector<PlanOption> two{options[0], options[6]};
  std::vector<MemoryPlan> plans;
  for (const auto& o : two) plans.push_back(plan_memory(o.cfg, 1, 1));
  CHECK(plans[0].step_seconds > 0);
  CHECK(plans[0].timed_micro_batch == 6);
  CHECK(plans[1].saved_per_sample < plans[0].saved_per_sample);
  const std::string table = compare_table(two, plans);
  CHECK_THAT(table, Catch::Matchers::ContainsSubstring("recompute block"));
  CHECK_THAT(table, Catch::Matchers::ContainsSubstring("1.000x"));
}

TEST_CASE("plan: saved bytes by tensor role add up to what the tape keeps", "[plan]") {
  const MemoryPlan p = plan_memory(small("none"), 1);
  REQUIRE(!p.saved_by_role.empty());
  double sum = 0;
  for (const auto& [role, bytes] : p.saved_by_role) sum += bytes;
  INFO("roles " << p.saved_by_role.size() << " sum " << sum << " saved " << p.saved_per_sample);
  CHECK(std::fabs(sum - p.saved_per_sample) <= 0.01 * p.saved_per_sample);
  // fp32 mode per block: the residual stream keeps the two block inputs (x and x1), 4 + 4 bytes per channel.
  const double per_tcl = p.tokens_channels_layers;
  CHECK(p.saved_by_role.at("block input / residual") / per_tcl > 7.0);
  CHECK(p.saved_by_role.count("attention (qkv, log-sum-exp)") == 1);
  CHECK_THAT(p.table(), Catch::Matchers::ContainsSubstring("saved for backward by tensor role"));
}

TEST_CASE("plan: train.micro_batch auto takes the largest that fits and divides the step", "[plan]") {
  const Config parsed = parse_config(
      "model: {n_layer: 3, n_head: 2, d_model: 32, vocab_size: 500, seq_len: 32}\ntrain: {micro_batch: auto}\n",
      "auto.yaml");
  CHECK(parsed.train.micro_batch == 0);
  CHECK_THAT(parsed.to_yaml(), Catch::Matchers::ContainsSubstring("micro_batch: auto"));
  CHECK_THROWS_WITH(parse_config("train: {micro_batch: automatic}\n", "bad.yaml"),
                    Catch::Matchers::ContainsSubstring("train.micro_batch: expected an integer, got 'automatic'"));
  const MemoryPlan whole = plan_memory(small("none"), 1);
  Config cfg = parsed;
  // Room for exactly 10 sequences at the planner's headroom.
  cfg.run.memory_limit_gib =
      (whole.total_fixed + 10.5 * whole.total_per_sample) / whole.headroom / double(int64_t{1} << 30);
  std::string why;
  CHECK(resolve_micro_batch(cfg, 1, &why).train.micro_batch == 10);
  CHECK_THAT(why, Catch::Matchers::ContainsSubstring("the plan fits 10"));
  cfg.train.total_batch_tokens = 8 * 32 * 3;  // 24 sequences per step: 10 and 9 do not divide it, 8 does
  CHECK(resolve_micro_batch(cfg, 1, &why).train.micro_batch == 8);
  CHECK_THAT(why, Catch::Matchers::ContainsSubstring("divides train.total_batch_tokens"));
  allocator_for(Device::cpu()).set_limit(0);
  Config fixed = cfg;
  fixed.train.micro_batch = 4;
  CHECK(resolve_micro_batch(fixed, 1, nullptr).train.micro_batch == 4);  // not auto: unchanged
}
