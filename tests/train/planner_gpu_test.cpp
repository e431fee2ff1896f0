// The memory planner on the GPU: what each activation storage keeps for backward, in bytes per token,
// channel and layer, against BF16 mode's (the bound the FP8 storage has to meet: 13 of BF16's 32).
#include <catch2/catch_test_macros.hpp>
#include <cstdio>
#include <fmt/format.h>

#include "config/config.h"
#include "train/planner.h"

using namespace fp8t;

namespace {
// Head size 64 (the attention kernels'), channels a multiple of 16 (FP8 GEMMs), a small vocabulary so
// that the logits do not dominate.
Config gpu_model(const char* precision) {
  return parse_config(fmt::format("model: {{n_layer: 4, n_head: 4, d_model: 256, vocab_size: 512, seq_len: 256}}\n"
                                  "run: {{device: cuda}}\n"
                                  "precision: {}\n",
                                  precision),
                      "plan_gpu.yaml");
}

double bytes_per_token_channel_layer(const MemoryPlan& p, const Config& c) {
  return p.saved_per_sample / (double(c.model.seq_len) * c.model.d_model * c.model.n_layer);
}
}  // namespace

TEST_CASE("plan on the GPU: fp8_all keeps at most 13/32 of BF16 mode's saved bytes", "[gpu][plan]") {
  const Config bf16 = gpu_model("{compute: bf16}");
  const Config fp8 = gpu_model("{compute: fp8, fp8: {activation_storage: fp8}}");
  const Config all = gpu_model("{compute: fp8, fp8: {activation_storage: fp8_all}}");
  const double b = bytes_per_token_channel_layer(plan_memory(bf16, 1), bf16);
  const double f = bytes_per_token_channel_layer(plan_memory(fp8, 1), fp8);
  const double a = bytes_per_token_channel_layer(plan_memory(all, 1), all);
  std::printf("saved for backward, bytes per token, channel and layer: bf16 %.2f, fp8 %.2f, fp8_all %.2f\n", b, f, a);
  // BF16 keeps 16 bf16 C-vectors per token and layer (32 bytes); fp8_all the block input and the
  // post-attention residual in bf16 (4), qkv (3) and the GELU input (4) as codes, attention's output once
  // as the projection's codes (1), plus the LayerNorm statistics and attention's log-sum-exp.
  CHECK(b > 30.0);
  CHECK(a < f);
  CHECK(a <= 13.0 / 32.0 * b);
}
