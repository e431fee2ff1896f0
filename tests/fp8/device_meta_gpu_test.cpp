// The device arena path that training uses (fp8/device_meta.h, Fp8DeviceArena: every FP8 linear's slots in one
// buffer, one copy each way per step, as GPT sets it up) against linears with their own slots: the same
// outputs, gradients, statistics and scales, bit for bit, over several optimizer steps, for both recipes.
#include <catch2/catch_test_macros.hpp>
#include <vector>

#include "autograd/tape.h"
#include "fp8/device_meta.h"
#include "ops/fp8_linear.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

struct StepResult {
  std::vector<float> y, dx, dw, db;
};

// One optimizer step of two micro-batches through st (fresh tensors from the same values each step).
StepResult step(Fp8LinearState& st, const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>& b, const std::vector<float>& dy, int64_t M, int64_t IC, int64_t OC) {
  Var xv = make_var(upload(x, {M, IC}, DType::bf16), true), wv = make_var(upload(w, {OC, IC}, DType::bf16), true),
      bv = make_var(upload(b, {OC}, DType::bf16), true);
  wv->grad = Tensor::zeros({OC, IC}, DType::f32, kGpu, MemCategory::gradients);
  bv->grad = Tensor::zeros({OC}, DType::f32, kGpu, MemCategory::gradients);
  Tape tape;
  Var y;
  {
    TapeScope scope(&tape);
    y = fp8_linear(xv, wv, bv, st);
    y = fp8_linear(xv, wv, bv, st);
  }
  grad_of(y).copy_from(upload(dy, {M, OC}, DType::bf16));
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  return {download(y->value), download(grad_of(xv)), download(wv->grad), download(bv->grad)};
}

}  // namespace

TEST_CASE("fp8 device arena: linears in one arena equal linears with their own slots - both recipes - steps",
          "[gpu][fp8]") {
  const int64_t M = 256, IC = 128, OC = 384;
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    INFO("current scaling " << (scaling == Fp8Scaling::current));
    Fp8Config cfg;
    cfg.scaling = scaling;
    cfg.amax_history_len = 3;
    // Three linears share the arena, so the one compared sits at a non-zero offset in it.
    Fp8LinearState own("own", cfg), first("first", cfg), mid("mid", cfg), last("last", cfg);
    Fp8DeviceArena arena;
    arena.init(kGpu, {{&first.device, first.metas()}, {&mid.device, mid.metas()}, {&last.device, last.metas()}});
    REQUIRE(arena.active());
    for (int s = 0; s < 4; ++s) {
      INFO("step " << s);
      // Each step's values differ in scale, so delayed scales move from step to step.
      const float g = 1.0f + 0.75f * static_cast<float>(s);
      const auto x = round_bf16(randn(M * IC, 1.5f * g)), w = round_bf16(randn(OC * IC, 0.03f));
      const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 2e-4f * g));
      const StepResult ro = step(own, x, w, b, dy, M, IC, OC);
      const StepResult rm = step(mid, x, w, b, dy, M, IC, OC);
      step(first, x, w, b, dy, M, IC, OC);  // the neighbours' slots are written too
      CHECK(rm.y == ro.y);
      CHECK(rm.dx == ro.dx);
      CHECK(rm.dw == ro.dw);
      CHECK(rm.db == ro.db);
      // The end of a step as GPT does it: collect, every linear's end_step, one upload for the arena.
      own.on_optimizer_step();
      for (Fp8LinearState* st : {&first, &mid, &last}) st->on_optimizer_step();
      arena.upload();
      using MetaPair = std::pair<const Fp8TensorMeta*, const Fp8TensorMeta*>;
      for (auto [mo, mm] : {MetaPair{&own.input, &mid.input}, MetaPair{&own.weight, &mid.weight},
                            MetaPair{&own.grad_output, &mid.grad_output}}) {
        CHECK(mm->last_amax == mo->last_amax);
        CHECK(mm->last_amax > 0.0f);
        CHECK(mm->last_saturated == mo->last_saturated);
        CHECK(mm->scale == mo->scale);
        CHECK(mm->history_oldest_first() == mo->history_oldest_first());
      }
      CHECK(last.input.last_amax == 0.0f);  // never cast: its slot stayed untouched by its neighbours
      CHECK(mid.weight_casts == own.weight_casts);
    }
  }
}
