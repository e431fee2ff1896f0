// Under mpirun -np 2 and -np 3: every collective of the MPI communicator on random data, against sums and maxima
// made here, with the in-place forms (a rank's own slice as input or output) included.
#include <algorithm>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "dist/comm.h"
#include "tests/mpi/mpi_test_util.h"

using namespace fp8t;

namespace {

// |a - b| <= tol * max(1, |b|) elementwise.
bool close(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > tol * std::max(1.0f, std::abs(b[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("mpi: collectives on random data - including aliased buffers", "[mpi]") {
  auto comm = test::mpi_comm();
  const int R = comm->size(), me = comm->rank();
  REQUIRE(R >= 2);
  REQUIRE(comm->backend() == "mpi");
  const int64_t n = 1037;  // odd, so nothing lines up by accident
  std::vector<std::vector<float>> data;  // every rank's input, regenerated locally from its seed
  for (int r = 0; r < R; ++r) data.push_back(test::seeded_normal(n * R, 100 + r));
  std::vector<float> sum(n * R, 0.0f), mx(n * R, -INFINITY);
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < n * R; ++i) {
      sum[i] += data[r][i];
      mx[i] = std::max(mx[i], data[r][i]);
    }
  auto slice = [&](const std::vector<float>& v, int r) {
    return std::vector<float>(v.begin() + r * n, v.begin() + (r + 1) * n);
  };
  const double tol = 1e-5;  // FP32 sums in another order

  Tensor t = Tensor::from_vector(data[me], {n * R});
  comm->all_reduce(t, ReduceOp::sum);
  CHECK(close(t.to_float_vector(), sum, tol));
  t = Tensor::from_vector(data[me], {n * R});
  comm->all_reduce(t, ReduceOp::max);
  CHECK(t.to_float_vector() == mx);  // max is exact

  // reduce_scatter into a separate buffer, then into in's own slice (aliased).
  Tensor in = Tensor::from_vector(data[me], {n * R});
  Tensor out = Tensor::zeros({n}, DType::f32);
  comm->reduce_scatter(in, out, ReduceOp::sum);
  CHECK(close(out.to_float_vector(), slice(sum, me), tol));
  CHECK(in.to_float_vector() == data[me]);  // input untouched
  Tensor mine = in.slice_flat(me * n, {n});
  comm->reduce_scatter(in, mine, ReduceOp::sum);
  CHECK(close(mine.to_float_vector(), slice(sum, me), tol));
  Tensor in_max = Tensor::from_vector(data[me], {n * R});
  Tensor mine_max = in_max.slice_flat(me * n, {n});
  comm->reduce_scatter(in_max, mine_max, ReduceOp::max);
  CHECK(mine_max.to_float_vector() == slice(mx, me));

  // all_gather from a separate buffer, then from out's own slice (aliased).
  std::vector<float> gathered;
  for (int r = 0; r < R; ++r) {
    const auto s = slice(data[r], r);
    gathered.insert(gathered.end(), s.begin(), s.end());
  }
  Tensor part = Tensor::from_vector(slice(data[me], me), {n});
  Tensor all = Tensor::zeros({n * R}, DType::f32);
  comm->all_gather(part, all);
  CHECK(all.to_float_vector() == gathered);
  Tensor all2 = Tensor::from_vector(data[me], {n * R});
  Tensor own = all2.slice_flat(me * n, {n});
  comm->all_gather(own, all2);
  CHECK(all2.to_float_vector() == gathered);

  // reduce to a root, broadcast from a non-zero root, barrier.
  Tensor red = Tensor::from_vector(data[me], {n * R});
  comm->reduce(red, ReduceOp::sum, R - 1);
  if (me == R - 1) CHECK(close(red.to_float_vector(), sum, tol));
  Tensor b = Tensor::from_vector(data[me], {n * R});
  comm->broadcast(b, 1);
  CHECK(b.to_float_vector() == data[1]);
  comm->barrier();
}
