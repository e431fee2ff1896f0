// fp8train sample --checkpoint DIR --vocab DIR --prompt "..." [--tokens N] [--temperature T] [--top-k K]
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "cli/commands.h"
#include "config/config.h"
#include "nn/gpt.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#ifdef FP8T_HAVE_PCRE2
#include "data/bpe.h"
#endif

namespace fp8t::cli {

void add_sample(CLI::App& app) {
  struct Opts {
    std::string checkpoint, vocab = "data/gpt2-vocab", prompt = "\n";
    int tokens = 64, top_k = 40;
    double temperature = 0.8;
    uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("sample", "generate text from a checkpoint (on the CPU)");
  cmd->add_option("--checkpoint", o->checkpoint, "run directory or checkpoint directory")->required();
  cmd->add_option("--vocab", o->vocab, "directory with encoder.json and vocab.bpe");
  cmd->add_option("--prompt", o->prompt, "text to continue");
  cmd->add_option("--tokens", o->tokens, "tokens to generate");
  cmd->add_option("--temperature", o->temperature, "softmax temperature");
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely tokens");
  cmd->add_option("--seed", o->seed, "sampling seed");
  cmd->callback([o] {
#ifndef FP8T_HAVE_PCRE2
    FP8T_FAIL("sample needs the GPT-2 tokenizer, which this build lacks: install libpcre2-dev and rebuild");
#else
    const ModelCheckpoint ck = open_model_checkpoint(o->checkpoint);
    if (!ck.warning.empty()) fmt::print(stderr, "fp8train: warning: {}\n", ck.warning);
    const Config& cfg = ck.config;
    GPT model(cfg.model, Device::cpu(), DType::f32, 1);
    load_model_weights(ck.dir, ck.state.world_size, model.params());
    const auto tok = Gpt2Tokenizer::load(o->vocab);
    std::vector<int> ids = tok.encode(o->prompt);
    if (ids.empty()) ids.push_back(tok.eot());
    std::mt19937_64 rng(o->seed);
    NoGradScope ng;
    fmt::print("{}", o->prompt);
    for (int i = 0; i < o->tokens; ++i) {
      const int T = std::min<int>(static_cast<int>(ids.size()), cfg.model.seq_len);
      Tensor in = Tensor::empty({1, T}, DType::i32);
      std::copy(ids.end() - T, ids.end(), in.data<int32_t>());
      const Var logits = model.logits(in);
      const float* row = logits->value.data<float>() + static_cast<int64_t>(T - 1) * cfg.model.padded_vocab();
      std::vector<std::pair<float, int>> cand;
      for (int v = 0; v < cfg.model.vocab_size; ++v) cand.push_back({row[v], v});
      const int k = std::clamp(o->top_k, 1, cfg.model.vocab_size);
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), std::greater<>());
      std::vector<double> w(k);
      for (int j = 0; j < k; ++j) w[j] = std::exp((cand[j].first - cand[0].first) / std::max(o->temperature, 1e-6));
      const int next = cand[std::discrete_distribution<int>(w.begin(), w.end())(rng)].second;
      ids.push_back(next);
      // Raw bytes: a character split over two tokens is completed by the next one in the terminal.
      fmt::print("{}", tok.decode_bytes(std::span<const int>(&ids.back(), 1)));
      std::fflush(stdout);
    }
    fmt::print("\n");
#endif
  });
}

}  // namespace fp8t::cli
