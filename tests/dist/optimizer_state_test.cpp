// Optimizer state in checkpoints (save_optimizer_state / load_optimizer_state): exact resume for every
// state dtype, resharding between ZeRO layouts, and conversion between state dtypes.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "dist/zero.h"
#include "train/optimizer_checkpoint.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

// Rank r of a world of n, for writing the files rank r would write (save needs no collective).
std::unique_ptr<Communicator> RankOf(int r, int n) { return make_standin_communicator(r, n); }

const char* name_of(StateDtype s) { return s == StateDtype::fp32 ? "fp32" : s == StateDtype::bf16 ? "bf16" : "fp8"; }

OptimConfig config(StateDtype s) {
  OptimConfig c;
  c.state_dtype = s;
  return c;
}

// 217 + 45 + 300 + 3 = 565 elements in four decay segments.
std::vector<ParamSpec> specs() {
  return {{"w", {7, 31}, true}, {"b", {45}, false}, {"u", {300}, true}, {"c", {3}, false}};
}

void step_all(ParameterStore& P, std::initializer_list<AdamW*> opts, int step) {
  for (int64_t i = 0; i < P.numel(); ++i) P.grads().data<float>()[i] = 0.1f * (1 + i % 5) * std::sin(0.3f * i + step);
  for (AdamW* o : opts) o->step(step, 1e-2, 1.0);
}

void init(ParameterStore& P) {
  for (int64_t i = 0; i < P.numel(); ++i) P.master().data<float>()[i] = std::cos(0.1f * i);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw());
  return {p, p + t.nbytes()};
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("fp8t_optstate_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("optimizer state: save after 5 steps - load - 5 more equals 10 uninterrupted", "[dist][optim]") {
  const StateDtype s = GENERATE(StateDtype::fp32, StateDtype::bf16, StateDtype::fp8);
  INFO(name_of(s));
  const fs::path dir = fresh_dir(name_of(s));
  ParameterStore A(specs(), Device::cpu(), DType::f32, 1), B(specs(), Device::cpu(), DType::f32, 1);
  init(A);
  AdamW oa(config(s), A, 0, A.padded_numel());
  for (int step = 1; step <= 5; ++step) step_all(A, {&oa}, step);
  save_optimizer_state(dir, *RankOf(0, 1), 0, oa);
  CHECK(fs::exists(dir / "optim_state.json"));
  CHECK(fs::exists(dir / "optim_mscale_rank0.bin") == (s == StateDtype::fp8));
  CHECK(fs::file_size(dir / "optim_rank0.bin") == oa.m().nbytes());

  B.master().copy_from(A.master());
  AdamW ob(config(s), B, 0, B.padded_numel());
  CHECK(load_optimizer_state(dir, 1, 0, ob).empty());
  for (int step = 6; step <= 10; ++step) {
    step_all(A, {&oa}, step);
    step_all(B, {&ob}, step);
  }
  CHECK(bytes_of(A.master()) == bytes_of(B.master()));
  CHECK(bytes_of(oa.m()) == bytes_of(ob.m()));
  CHECK(bytes_of(oa.v()) == bytes_of(ob.v()));
  if (s == StateDtype::fp8) CHECK(bytes_of(oa.m_scale()) == bytes_of(ob.m_scale()));
  fs::remove_all(dir);
}

TEST_CASE("optimizer state: two ZeRO shards load into one range exactly when blocks line up", "[dist][optim]") {
  const StateDtype s = GENERATE(StateDtype::fp32, StateDtype::bf16, StateDtype::fp8);
  INFO(name_of(s));
  // pad 256: 768 elements, shards of 384 = 3 blocks each; pad 2: 566, shards of 283 (not whole blocks).
  for (int64_t pad : {256, 2}) {
    INFO("padded to a multiple of " << pad);
    const fs::path dir = fresh_dir(fmt::format("{}_{}", name_of(s), pad));
    ParameterStore P(specs(), Device::cpu(), DType::f32, pad);
    init(P);
    const int64_t n = P.padded_numel(), half = n / 2;
    AdamW s0(config(s), P, 0, half), s1(config(s), P, half, n);
    for (int step = 1; step <= 4; ++step) step_all(P, {&s0, &s1}, step);
    save_optimizer_state(dir, *RankOf(0, 2), 1, s0);
    save_optimizer_state(dir, *RankOf(1, 2), 1, s1);

    ParameterStore Q(specs(), Device::cpu(), DType::f32, pad);
    AdamW whole(config(s), Q, 0, n);
    const std::string note = load_optimizer_state(dir, 2, 1, whole);
    std::vector<float> m = s0.m_values(), v = s0.v_values();
    for (float x : s1.m_values()) m.push_back(x);
    for (float x : s1.v_values()) v.push_back(x);
    CHECK(whole.v_values() == v);
    if (s != StateDtype::fp8 || half % kMomentBlock == 0) {
      CHECK(note.empty());
      CHECK(whole.m_values() == m);
      continue;
    }
    // 283-element shards: the whole range's blocks [256, 384), [384, 512) and [512, 566) straddle.
    CHECK_THAT(note, Catch::Matchers::ContainsSubstring("3 of 5 fp8 first-moment blocks") &&
                         Catch::Matchers::ContainsSubstring("re-quantized"));
    const std::vector<float> got = whole.m_values();
    for (int64_t k = 0; k < moment_blocks(n); ++k) {
      float amax = 0;
      for (int64_t i = k * 128; i < std::min(n, (k + 1) * 128); ++i) amax = std::max(amax, std::abs(m[i]));
      for (int64_t i = k * 128; i < std::min(n, (k + 1) * 128); ++i) {
        if (k < 2) REQUIRE(got[i] == m[i]);                        // lies in one checkpoint block: exact
        REQUIRE(std::abs(got[i] - m[i]) <= std::ldexp(amax, -4));  // re-quantized: half an E4M3 ulp
      }
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("optimizer state: a checkpoint of another state dtype is converted through f32", "[dist][optim]") {
  const StateDtype from = GENERATE(StateDtype::fp32, StateDtype::bf16, StateDtype::fp8);
  const StateDtype to = GENERATE(StateDtype::fp32, StateDtype::bf16, StateDtype::fp8);
  if (from == to) return;
  INFO(name_of(from) << " -> " << name_of(to));
  const fs::path dir = fresh_dir(fmt::format("{}_{}", name_of(from), name_of(to)));
  ParameterStore P(specs(), Device::cpu(), DType::f32, 1);
  init(P);
  AdamW a(config(from), P, 0, P.padded_numel());
  for (int step = 1; step <= 3; ++step) step_all(P, {&a}, step);
  save_optimizer_state(dir, *RankOf(0, 1), 0, a);
  AdamW b(config(to), P, 0, P.padded_numel());
  CHECK_THAT(load_optimizer_state(dir, 1, 0, b), Catch::Matchers::ContainsSubstring("converted"));
  const std::vector<float> m0 = a.m_values(), v0 = a.v_values(), m1 = b.m_values(), v1 = b.v_values();
  float m_amax = 0;
  for (float x : m0) m_amax = std::max(m_amax, std::abs(x));
  for (size_t i = 0; i < m0.size(); ++i) {
    if (to == StateDtype::fp32) {  // f32 holds every bf16 and fp8 value
      REQUIRE(m1[i] == m0[i]);
      REQUIRE(v1[i] == v0[i]);
    } else {
      REQUIRE(std::abs(v1[i] - v0[i]) <= std::ldexp(std::abs(v0[i]), -8));
      // bf16 m: half a bf16 ulp; fp8 m: half an E4M3 ulp of the block amax (at most the range's amax).
      const float bound = to == StateDtype::bf16 ? std::ldexp(std::abs(m0[i]), -8) : std::ldexp(m_amax, -4);
      REQUIRE(std::abs(m1[i] - m0[i]) <= bound);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("optimizer state: checkpoints without optim_state.json hold f32 moments", "[dist][optim]") {
  const fs::path dir = fresh_dir("legacy");
  ParameterStore P(specs(), Device::cpu(), DType::f32, 1);
  init(P);
  AdamW a(config(StateDtype::fp32), P, 0, P.padded_numel());
  for (int step = 1; step <= 2; ++step) step_all(P, {&a}, step);
  save_optimizer_state(dir, *RankOf(0, 1), 0, a);
  fs::remove(dir / "optim_state.json");
  AdamW b(config(StateDtype::fp32), P, 0, P.padded_numel());
  CHECK(load_optimizer_state(dir, 1, 0, b).empty());
  CHECK(b.m_values() == a.m_values());
  // A damaged file is named.
  fs::resize_file(dir / "optim_v_rank0.bin", 12);
  REQUIRE_THROWS_WITH(load_optimizer_state(dir, 1, 0, b), Catch::Matchers::ContainsSubstring("optim_v_rank0.bin"));
  fs::remove_all(dir);
}
