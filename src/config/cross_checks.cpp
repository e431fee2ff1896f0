// Cross-field config checks and ModelConfig::parameter_count. Every size is computed in 64 bits,
// saturating, and held to a bound far above any run this trainer can hold, so that nothing the
// model or the step loop derives from these values (element and byte counts) can overflow.
#include "config/cross_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace fp8t {
namespace {

using yaml_util::fail;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The bounds, each with the text a message shows for it.
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;  // one weight or one activation
constexpr const char* kMaxTensorText = "2^40 = 1.1e12";
constexpr int64_t kMaxParameters = int64_t{1} << 40;  // every rank holds all of them (ZeRO <= 2)
constexpr const char* kMaxParametersText = "2^40 = 1.1e12";
constexpr int64_t kMaxMicroBatchTokens = 0x7fffffff;  // rows of a (B*T, C) activation: an int in kernels
constexpr const char* kMaxMicroBatchTokensText = "2^31 - 1";
constexpr int64_t kMaxMicroBatchesPerStep = int64_t{1} << 20;  // gradient accumulation per step
constexpr const char* kMaxMicroBatchesText = "2^20 = 1048576";
constexpr int64_t kMaxRunTokens = int64_t{1} << 50;  // the run's token counter, times the ranks
constexpr const char* kMaxRunTokensText = "2^50 = 1.1e15";

// Saturating: a result beyond int64 reads as kInt64Max, which exceeds every bound above.
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kInt64Max : r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kInt64Max : r;
}

// A count as a reader takes it in: exact when short, else three digits.
std::string count_text(int64_t n) {
  if (n == kInt64Max) return "more than 9.2e18";
  if (n < 100'000'000) return fmt::format("{}", n);
  return fmt::format("{:.3g}", static_cast<double>(n));
}

void check_model(const ModelConfig& m, const OriginOf& origin_of) {
  if (m.d_model % m.n_head != 0) {
    auto [key, at] = origin_of({"model.d_model", "model.n_head"});
    fail(at, key,
         fmt::format("d_model = {} must be divisible by n_head = {}", m.d_model, m.n_head));
  }
  // vocab_size's own range keeps padded_vocab() inside int.
  const int64_t C = m.d_model, Vp = m.padded_vocab(), T = m.seq_len;
  struct Weight {
    std::string_view key;  // the key that makes it large
    const char* name;
    int64_t rows;
    const char* rows_text;
  };
  const Weight weights[] = {{"model.vocab_size", "wte", Vp, "padded vocab_size"},
                            {"model.d_model", "mlp.c_fc.weight", 4 * C, "4 x d_model"},
                            {"model.seq_len", "wpe", T, "seq_len"}};
  for (const Weight& w : weights) {
    const int64_t elements = mul(w.rows, C);
    if (elements <= kMaxTensorElements) continue;
    auto [key, at] = origin_of({w.key, "model.d_model"});
    fail(at, key,
         fmt::format("the weight {} ({} x d_model = {} x {}) would hold {} elements, more than the {} "
                     "one tensor may hold; lower {}",
                     w.name, w.rows_text, w.rows, C, count_text(elements), kMaxTensorText,
                     w.key == "model.d_model" ? std::string(w.key) : fmt::format("{} or model.d_model", w.key)));
  }
  const int64_t params = m.parameter_count();
  if (params > kMaxParameters) {
    const bool blocks_dominate = mul(m.n_layer, mul(12 * C, C)) >= mul(Vp, C);
    auto [key, at] = blocks_dominate ? origin_of({"model.n_layer", "model.d_model"})
                                     : origin_of({"model.vocab_size", "model.d_model"});
    fail(at, key,
         fmt::format("the model would have {} parameters (n_layer = {}, d_model = {}, vocab_size = {}, "
                     "seq_len = {}), more than the {} one rank can hold; lower model.n_layer, "
                     "model.d_model or model.vocab_size",
                     count_text(params), m.n_layer, m.d_model, m.vocab_size, m.seq_len,
                     kMaxParametersText));
  }
}

void check_batch(const Config& c, const OriginOf& origin_of) {
  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  // micro_batch auto (0) is checked once the planner has picked it (resolve_micro_batch, train/planner.h).
  if (t.micro_batch == 0) return;
  const int64_t per_micro = int64_t{t.micro_batch} * m.seq_len;  // two ints: cannot overflow
  if (per_micro > kMaxMicroBatchTokens) {
    auto [key, at] = origin_of({"train.micro_batch", "model.seq_len"});
    fail(at, key,
         fmt::format("micro_batch x seq_len = {} x {} = {} tokens per micro-batch, more than {}; "
                     "lower train.micro_batch",
                     t.micro_batch, m.seq_len, per_micro, kMaxMicroBatchTokensText));
  }
  const int64_t widest = std::max<int64_t>(4 * int64_t{m.d_model}, m.padded_vocab());
  if (const int64_t elements = mul(per_micro, widest); elements > kMaxTensorElements) {
    const bool by_vocab = m.padded_vocab() > 4 * int64_t{m.d_model};
    auto [key, at] = origin_of({"train.micro_batch", "model.seq_len"});
    fail(at, key,
         fmt::format("one micro-batch's activations (micro_batch x seq_len x max(4 x d_model, padded "
                     "vocab_size) = {} x {} x {}) would hold {} elements, more than the {} one tensor may "
                     "hold; lower train.micro_batch, model.seq_len or {}",
                     t.micro_batch, m.seq_len, widest, count_text(elements), kMaxTensorText,
                     by_vocab ? "model.vocab_size" : "model.d_model"));
  }

  const int64_t total = t.total_batch_tokens;
  if (total != 0 && total % per_micro != 0) {
    auto [key, at] = origin_of({"train.total_batch_tokens"});
    const int64_t lower = total / per_micro * per_micro, upper = add(lower, per_micro);
    const bool take_lower = lower > 0 && (upper == kInt64Max || total - lower <= upper - total);
    fail(at, key,
         fmt::format("{} must be 0 or a multiple of micro_batch * seq_len = {} * {} = {}; "
                     "nearest valid value: {}",
                     total, t.micro_batch, m.seq_len, per_micro, take_lower ? lower : upper));
  }
  if (const int64_t micro_batches = total / per_micro; micro_batches > kMaxMicroBatchesPerStep) {
    auto [key, at] = origin_of({"train.total_batch_tokens"});
    fail(at, key,
         fmt::format("{} tokens per step are {} micro-batches of micro_batch x seq_len = {} tokens, more "
                     "than the {} one optimizer step may accumulate; lower train.total_batch_tokens or "
                     "raise train.micro_batch",
                     total, count_text(micro_batches), per_micro, kMaxMicroBatchesText));
  }
  const int64_t per_step = total != 0 ? total : per_micro;
  if (const int64_t run_tokens = mul(per_step, t.max_steps); run_tokens > kMaxRunTokens) {
    auto [key, at] = origin_of({"train.max_steps", "train.total_batch_tokens"});
    fail(at, key,
         fmt::format("max_steps x tokens per step = {} x {} = {} tokens, more than the {} a run may "
                     "count; lower train.max_steps or train.total_batch_tokens",
                     t.max_steps, per_step, count_text(run_tokens), kMaxRunTokensText));
  }
}

void check_precision(const Config& c, const OriginOf& origin_of) {
  const Fp8Config& f = c.precision.fp8;
  const int64_t high = int64_t{f.bf16_first_blocks} + f.bf16_last_blocks;
  if (high > c.model.n_layer) {
    auto [key, at] = origin_of(
        {"precision.fp8.bf16_first_blocks", "precision.fp8.bf16_last_blocks", "model.n_layer"});
    fail(at, key,
         fmt::format("bf16_first_blocks + bf16_last_blocks = {} + {} = {} blocks, but the model has "
                     "n_layer = {}; lower them (precision.compute: bf16 runs every block in BF16)",
                     f.bf16_first_blocks, f.bf16_last_blocks, high, c.model.n_layer));
  }
}

}  // namespace

int64_t ModelConfig::parameter_count() const {
  const int64_t C = d_model;
  // wte (V, C) + wpe (T, C) + per block 12 C^2 + 13 C (attention and MLP weights, biases, two
  // LayerNorms) + ln_f 2 C.
  const int64_t per_block = add(mul(12 * C, C), 13 * C);
  return add(add(mul(add(vocab_size, seq_len), C), mul(n_layer, per_block)), 2 * C);
}

void check_cross_fields(const Config& c, const OriginOf& origin_of) {
  check_model(c.model, origin_of);
  check_batch(c, origin_of);
  check_precision(c, origin_of);
}

}  // namespace fp8t
