// Helpers for model tests: a tiny GPT configuration, random token batches, one step's loss and gradients.
#pragma once
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "autograd/tape.h"
#include "config/config.h"
#include "core/tensor.h"
#include "core/tensor_ops.h"
#include "nn/gpt.h"

namespace fp8t::test {

// A GPT of n_layer blocks of width d_model with 2 heads, the vocabulary vocab_size (padded to a multiple of 128)
// and sequences of seq_len tokens.
inline ModelConfig gpt_config(int n_layer, int d_model, int vocab_size, int seq_len) {
  ModelConfig m;
  m.n_layer = n_layer;
  m.n_head = 2;
  m.d_model = d_model;
  m.vocab_size = vocab_size;
  m.seq_len = seq_len;
  return m;
}

// A GPT small enough for exact CPU checks: 2 heads, d_model 16, vocabulary 100 (padded to 128), T = 8.
inline ModelConfig small_model(int n_layer = 2) { return gpt_config(n_layer, 16, 100, 8); }

// (B, T) i32 tokens drawn uniformly from [0, V) by an mt19937 seeded with `seed`.
inline Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % V);
  return t;
}

// The loss and the flat gradient of one forward and backward of `model` on (x, y), from zeroed gradients.
inline std::pair<float, std::vector<float>> loss_and_grads(GPT& model, const Tensor& x, const Tensor& y,
                                                           bool recompute = false) {
  model.params().zero_grads();
  Tape tape;
  Var loss;
  {
    TapeScope s(&tape);
    loss = model.loss(x, y, recompute);
  }
  tape.backward(loss);
  return {loss->value.to_float_vector()[0], model.params().grads().to_float_vector()};
}

// loss_and_grads with the trainer's zeroing (ParameterStore::zero_grads_deferred, then zero_stale_grads) over
// gradients first filled with NaN: an op that adds into a stale gradient instead of overwriting it leaves NaN.
inline std::pair<float, std::vector<float>> loss_and_grads_deferred(GPT& model, const Tensor& x, const Tensor& y,
                                                                    bool recompute = false) {
  ParameterStore& P = model.params();
  fill_(P.grads(), std::numeric_limits<float>::quiet_NaN());
  P.zero_grads_deferred();
  Tape tape;
  Var loss;
  {
    TapeScope s(&tape);
    loss = model.loss(x, y, recompute);
  }
  tape.backward(loss);
  P.zero_stale_grads();
  return {loss->value.to_float_vector()[0], P.grads().to_float_vector()};
}

}  // namespace fp8t::test
