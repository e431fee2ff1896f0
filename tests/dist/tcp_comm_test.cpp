// The TCP communicator (plain srun on CPU), with its ranks as threads of this process: every
// collective against a sum in rank order (bit-exact), aliased buffers, and peers that never come or die.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/dtype.h"
#include "dist/comm.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& what) {
  const fs::path d = fs::temp_directory_path() / ("fp8t_tcp_" + what + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs body(comm) on `world` threads, one rank each; returns each rank's error ("" when none). Catch2's
// assertions are not thread-safe, so the bodies record what they saw and the caller checks it.
std::vector<std::string> run_ranks(int world, const fs::path& rendezvous, double timeout_s,
                                   const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = make_tcp_communicator(r, world, rendezvous, timeout_s);
        body(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Small integers plus quarters: every sum below is exact in f32 and in bf16's 8 bits.
std::vector<float> values(int64_t n, int rank) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 7 + rank * 13) % 29 - 14) / 4;
  return v;
}

}  // namespace

TEST_CASE("tcp: collectives over three ranks match the rank-order reduction", "[dist][tcp]") {
  const int R = 3;
  const int64_t n = 1037;  // odd, so nothing lines up by accident
  std::vector<float> sum(n * R, 0.0f), mx(n * R, -INFINITY), gathered;
  for (int r = 0; r < R; ++r) {
    const auto v = values(n * R, r);
    for (int64_t i = 0; i < n * R; ++i) {
      sum[i] += v[i];
      mx[i] = std::fmax(mx[i], v[i]);
    }
    gathered.insert(gathered.end(), v.begin() + r * n, v.begin() + (r + 1) * n);
  }
  auto slice = [&](const std::vector<float>& v, int r) {
    return std::vector<float>(v.begin() + r * n, v.begin() + (r + 1) * n);
  };
  // What each rank saw, checked after the threads are done; mismatches are named.
  std::vector<std::vector<std::string>> wrong(R);
  const fs::path dir = fresh_dir("collectives");
  const auto errors = run_ranks(R, dir / "rendezvous", 30, [&](Communicator& comm) {
    const int me = comm.rank();
    auto& bad = wrong[static_cast<size_t>(me)];
    auto expect = [&](bool ok, const char* what) {
      if (!ok) bad.push_back(what);
    };
    expect(comm.size() == R && comm.backend() == "tcp", "size/backend");
    Tensor t = Tensor::from_vector(values(n * R, me), {n * R});
    comm.all_reduce(t, ReduceOp::sum);
    expect(t.to_float_vector() == sum, "all_reduce sum");
    t = Tensor::from_vector(values(n * R, me), {n * R});
    comm.all_reduce(t, ReduceOp::max);
    expect(t.to_float_vector() == mx, "all_reduce max");

    Tensor b = Tensor::from_vector(values(n * R, me), {n * R});  // bf16: the same exact sums
    Tensor b16 = Tensor::empty({n * R}, DType::bf16);
    for (int64_t i = 0; i < n * R; ++i) b16.data<uint16_t>()[i] = float_to_bf16(b.data<float>()[i]);
    comm.all_reduce(b16, ReduceOp::sum);
    expect(b16.to_float_vector() == sum, "all_reduce bf16 sum");

    Tensor in = Tensor::from_vector(values(n * R, me), {n * R});
    Tensor out = Tensor::zeros({n}, DType::f32);
    comm.reduce_scatter(in, out, ReduceOp::sum);
    expect(out.to_float_vector() == slice(sum, me), "reduce_scatter");
    expect(in.to_float_vector() == values(n * R, me), "reduce_scatter leaves in");
    Tensor mine = in.slice_flat(me * n, {n});  // out aliases in's own slice
    comm.reduce_scatter(in, mine, ReduceOp::sum);
    expect(mine.to_float_vector() == slice(sum, me), "reduce_scatter in place");

    Tensor part = Tensor::from_vector(slice(values(n * R, me), me), {n});
    Tensor all = Tensor::zeros({n * R}, DType::f32);
    comm.all_gather(part, all);
    expect(all.to_float_vector() == gathered, "all_gather");
    Tensor all2 = Tensor::from_vector(values(n * R, me), {n * R});
    Tensor own = all2.slice_flat(me * n, {n});  // in aliases out's own slice
    comm.all_gather(own, all2);
    expect(all2.to_float_vector() == gathered, "all_gather in place");

    for (int root : {0, 2}) {
      Tensor x = Tensor::from_vector(values(n, me), {n});
      comm.broadcast(x, root);
      expect(x.to_float_vector() == values(n, root), root == 0 ? "broadcast from 0" : "broadcast from 2");
    }
    comm.barrier();
  });
  for (int r = 0; r < R; ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
    for (const auto& w : wrong[r]) FAIL_CHECK(w);
  }
  CHECK(!fs::exists(dir / "rendezvous"));  // rank 0 removes it once everyone is in
  fs::remove_all(dir);
}

TEST_CASE("tcp: a rank whose rank 0 never comes fails naming the rendezvous file", "[dist][tcp]") {
  const fs::path dir = fresh_dir("no_rank0");
  std::string error;
  try {
    make_tcp_communicator(1, 2, dir / "rendezvous", 0.5);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Matchers::ContainsSubstring("could not reach rank 0") &&
                        Catch::Matchers::ContainsSubstring((dir / "rendezvous").string()));
  fs::remove_all(dir);
}

TEST_CASE("tcp: rank 0 waiting for a rank that never comes times out", "[dist][tcp]") {
  const fs::path dir = fresh_dir("no_rank1");
  std::string error;
  try {
    make_tcp_communicator(0, 2, dir / "rendezvous", 0.5);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Matchers::ContainsSubstring("did not complete within 0.5 s"));
  fs::remove_all(dir);
}

TEST_CASE("tcp: a peer that dies mid-run ends the collective with a message", "[dist][tcp]") {
  const fs::path dir = fresh_dir("dead_peer");
  const auto errors = run_ranks(2, dir / "rendezvous", 10, [](Communicator& comm) {
    if (comm.rank() == 1) return;  // its communicator closes its socket: a dead rank
    Tensor t = Tensor::from_vector({1, 2, 3}, {3});
    comm.all_reduce(t, ReduceOp::sum);
  });
  CHECK_THAT(errors[0], Catch::Matchers::ContainsSubstring("rank 1 closed the connection"));
  CHECK(errors[1].empty());
  fs::remove_all(dir);
}
