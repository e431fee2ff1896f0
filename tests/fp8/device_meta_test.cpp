// The FP8 device-state arena's protocol, on host memory (the arena only moves bytes, so a CPU
// buffer stands in for the device): statistics recorded once, saturations counted once across
// repeated collects, new scales and zeroed statistics written by one upload.
#include <catch2/catch_test_macros.hpp>

#include "config/config.h"
#include "fp8/device_meta.h"

using namespace fp8t;

TEST_CASE("fp8 device arena: one collect and one upload per step", "[fp8]") {
  Fp8Config cfg;
  cfg.amax_history_len = 2;
  Fp8TensorMeta in_a(Fp8Format::e4m3, cfg), w_a(Fp8Format::e4m3, cfg), g_a(Fp8Format::e5m2, cfg);
  Fp8TensorMeta in_b(Fp8Format::e4m3, cfg), w_b(Fp8Format::e4m3, cfg), g_b(Fp8Format::e5m2, cfg);
  const Fp8Metas ma{&in_a, &w_a, &g_a}, mb{&in_b, &w_b, &g_b};
  Fp8DeviceState a, b;
  Fp8DeviceArena arena;
  arena.init(Device::cpu(), {{&a, ma}, {&b, mb}});
  REQUIRE(arena.active());
  Fp8DeviceSlot* sa = a.slots(Device::cpu(), ma);
  Fp8DeviceSlot* sb = b.slots(Device::cpu(), mb);
  CHECK(sb == sa + 3);  // one buffer
  CHECK(sa[0].scale == 1.0f);

  // A "cast" of a's input and of b's output gradient.
  sa[0].amax = 3.5f;
  sa[0].saturated = 2;
  a.mark_pending(Fp8Role::input);
  sb[2].amax = 100.0f;
  b.mark_pending(Fp8Role::grad_output);
  arena.collect();
  CHECK(in_a.amax_this_step == 3.5f);
  CHECK(in_a.saturated_this_step == 2);
  CHECK(g_b.amax_this_step == 100.0f);
  CHECK_FALSE(w_a.recorded_this_step);
  arena.collect();  // nothing pending: no double count
  CHECK(in_a.saturated_this_step == 2);
  // Another cast before the upload: the device kept accumulating; only the new saturations count.
  sa[0].amax = 4.0f;
  sa[0].saturated = 5;
  a.mark_pending(Fp8Role::input);
  a.collect(ma);  // a state's own collect goes through the arena
  CHECK(in_a.amax_this_step == 4.0f);
  CHECK(in_a.saturated_this_step == 5);

  for (Fp8TensorMeta* m : {&in_a, &w_a, &g_a, &in_b, &w_b, &g_b}) m->end_step();
  arena.upload();
  CHECK(sa[0].scale == in_a.scale);
  CHECK(sa[0].scale_inv == in_a.scale_inv);
  CHECK(in_a.scale == 448.0f / 4.0f);
  CHECK(sb[2].scale == g_b.scale);
  CHECK(g_b.scale == 57344.0f / 100.0f);
  for (int r = 0; r < 3; ++r) {
    CHECK(sa[r].amax == 0.0f);
    CHECK(sa[r].saturated == 0);
    CHECK(sb[r].amax == 0.0f);
  }
  // A scale changed on the host outside the step (a checkpoint load) is uploaded by slots().
  in_b.scale = 2.0f;
  in_b.scale_inv = 0.5f;
  CHECK(b.slots(Device::cpu(), mb)[0].scale == 2.0f);
}
