// A ZeRO-sharded master on the GPU (nn/params.h, GPT::publish_weights): three models holding one master shard
// each, their collectives emulated in this process, publish the BF16 copies and the FP8 weight codes (and their
// transposed copies) that a model with the whole master casts itself, bit for bit, and compute its loss.
#include <catch2/catch_test_macros.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "config/config.h"
#include "nn/gpt.h"
#include "util/gpu_test_util.h"
#include "tests/util/model_test_util.h"

using namespace fp8t;
using test::kGpu;

namespace {

ModelConfig sharded_model() { return test::gpt_config(2, 128, 300, 64); }

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu(), MemCategory::workspace);
  std::vector<uint8_t> out(h.nbytes());
  std::memcpy(out.data(), h.raw(), out.size());
  return out;
}

// The collectives of R ranks that run one after another in this process: a rank's all-gather copies its part
// into a host image of the whole buffer and takes the image back; its max-reduce folds its values into a host
// running max. A rank sees every other rank's part once they all ran, so ranks 0 .. R-2 publish twice (the second
// time their own parts are the same and they take the completed images).
struct SequentialCollectives {
  std::map<DType, std::vector<uint8_t>> image;  // one per gathered buffer (compute copies, codes)
  std::vector<float> amax;

  WeightCollectives of_rank(int r) {
    WeightCollectives c;
    c.all_reduce_max = [this](Tensor& t) {
      std::vector<float> v = t.to_float_vector();
      amax.resize(v.size(), 0.0f);
      for (size_t i = 0; i < v.size(); ++i) amax[i] = std::max(amax[i], v[i]);
      t.copy_from(Tensor::from_vector(amax, t.shape()));
    };
    c.all_gather_v = [this, r](Tensor& t, const std::vector<int64_t>& cuts) {
      const size_t width = dtype_size(t.dtype());
      std::vector<uint8_t>& img = image[t.dtype()];
      img.resize(t.nbytes());
      const std::vector<uint8_t> mine = bytes_of(t);
      std::memcpy(img.data() + cuts[r] * width, mine.data() + cuts[r] * width, (cuts[r + 1] - cuts[r]) * width);
      Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::cpu(), MemCategory::workspace);
      std::memcpy(h.raw(), img.data(), img.size());
      t.copy_from(h);
    };
    return c;
  }
};

}  // namespace

TEST_CASE("gpu: a sharded master publishes the copies and FP8 codes a whole master casts - bit for bit",
          "[gpu][model]") {
  constexpr int R = 3;
  const ModelConfig mc = sharded_model();
  for (const Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    INFO((scaling == Fp8Scaling::delayed ? "delayed" : "current") << " scaling");
    PrecisionConfig pc;
    pc.compute = ComputeMode::fp8;
    pc.fp8.scaling = scaling;
    GPT whole(mc, kGpu, DType::bf16, R, pc);
    std::vector<std::unique_ptr<GPT>> ranks;
    for (int r = 0; r < R; ++r)
      ranks.push_back(std::make_unique<GPT>(mc, kGpu, DType::bf16, R, pc, FlatShard{}, FlatShard{r, R}));
    REQUIRE(ranks[0]->params().master_sharded());
    REQUIRE(ranks[0]->params().codes().defined());
    // The shard cuts fall inside FP8 weights: their codes come from two ranks.
    const ParameterStore& W = whole.params();
    bool cut_inside = false;
    for (const std::string& layer : whole.fp8_layers()) {
      if (layer == "lm_head") continue;
      for (const ParamSpec& s : W.specs())
        if (s.name == layer + ".weight")
          for (int r = 1; r < R; ++r) {
            const int64_t cut = r * W.padded_numel() / R;
            cut_inside |= s.offset < cut && cut < s.offset + s.numel();
          }
    }
    CHECK(cut_inside);

    Tensor tokens = Tensor::empty({2, mc.seq_len}, DType::i32), targets = Tensor::empty({2, mc.seq_len}, DType::i32);
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 5) % mc.vocab_size);
      targets.data<int32_t>()[i] = static_cast<int32_t>((i * 11 + 2) % mc.vocab_size);
    }
    const Tensor x = tokens.to(kGpu), y = targets.to(kGpu);

    // Version 0 (after init); with current scaling also version 1, after a change of the master.
    for (int version = 0; version < (scaling == Fp8Scaling::current ? 2 : 1); ++version) {
      INFO("weight version " << version);
      std::vector<float> master(static_cast<size_t>(W.numel()));
      if (version == 0) {
        whole.init(21);
        for (auto& m : ranks) m->init(21);
      } else {
        master = whole.params().master().to_float_vector();
        for (size_t i = 0; i < static_cast<size_t>(W.numel()); ++i) master[i] *= 1.0f + 0.25f * ((i % 7) / 7.0f);
        whole.params().set_master(master.data());
        for (auto& m : ranks) m->params().set_master(master.data());
        whole.on_optimizer_step();
        for (auto& m : ranks) m->on_optimizer_step();
      }
      SequentialCollectives c;
      for (int r = 0; r < R; ++r) ranks[r]->publish_weights(c.of_rank(r));
      for (int r = 0; r + 1 < R; ++r) ranks[r]->publish_weights(c.of_rank(r));

      const float want = whole.loss(x, y)->value.to_float_vector()[0];  // casts the whole model's FP8 weights
      for (int r = 0; r < R; ++r) {
        INFO("rank " << r);
        GPT& m = *ranks[r];
        ParameterStore& S = m.params();
        for (size_t i = 0; i < W.specs().size(); ++i) {
          const Tensor& v = S.var(i)->value;
          if (v.dtype() == DType::bf16) {
            INFO(W.specs()[i].name);
            CHECK(bytes_of(v) == bytes_of(whole.params().var(i)->value));
          }
        }
        CHECK(m.loss(x, y)->value.to_float_vector()[0] == want);
        for (const std::string& layer : whole.fp8_layers()) {
          INFO(layer);
          const QuantizedTensor& a = m.fp8_state(layer)->weight_fp8;
          const QuantizedTensor& b = whole.fp8_state(layer)->weight_fp8;
          CHECK(bytes_of(a.codes) == bytes_of(b.codes));
          CHECK(bytes_of(a.codes_t) == bytes_of(b.codes_t));
          CHECK(a.scale_inv.to_float_vector() == b.scale_inv.to_float_vector());
        }
      }
    }
  }
}
