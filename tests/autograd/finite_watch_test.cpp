// FiniteWatch on a hand-built graph: an op's non-finite output, a backward that writes a non-finite
// gradient, and one that receives it from a node that is not checked; without a watch nothing is checked.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>

#include "autograd/finite_watch.h"
#include "ops/ops.h"

using namespace fp8t;

namespace {
Var weight(float nan_at = -1) {  // (3, 4)
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  if (nan_at >= 0) w.data<float>()[static_cast<int>(nan_at)] = NAN;
  return make_var(w, true, "l.weight");
}
Var input() { return make_var(Tensor::from_vector({1, 0, 0, 0, 0, 1, 0, 0}, {2, 4}), true); }

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const NonfiniteFound& e) {
    return e.what();
  }
  return "(nothing found)";
}
}  // namespace

TEST_CASE("finite_watch: no watch, no checks", "[autograd][nonfinite]") {
  CHECK(finite_watch() == nullptr);
  const Var y = linear(input(), weight(5), nullptr);  // row 1 of w holds a NaN
  CHECK(std::isnan(y->value.data<float>()[1]));
  CHECK(y->name.empty());  // outputs are named only while a watch runs
}

TEST_CASE("finite_watch: a forward op's non-finite output, named by its weight", "[autograd][nonfinite]") {
  FiniteWatch watch;
  FiniteWatchScope watching(&watch);
  // out[m, o] = x[m] . w[o]: w[1, 1] (element 5) turns column 1 NaN (0 * NaN is NaN too).
  CHECK(message_of([] { linear(input(), weight(5), nullptr); }) ==
        "the output of l (linear), shape [2, 3], element 1 [0, 1] is nan; its input l.weight was already non-finite "
        "(element 5 is nan)");
}

TEST_CASE("finite_watch: backward names the node that wrote or received a non-finite gradient",
          "[autograd][nonfinite]") {
  FiniteWatch watch;
  FiniteWatchScope watching(&watch);
  Tape tape;
  const Var w = weight();
  const bool written = GENERATE(true, false);
  {
    TapeScope scope(&tape);
    const Var y = linear(input(), w, nullptr);
    if (written) {
      w->value.data<float>()[5] = NAN;  // read by backward only: d(x) = d(y) @ w
      fill_(grad_of(y), 1.0f);
    } else {
      // A node that no watch_op follows writes y's gradient non-finite.
      tape.record("unchecked", [yg = grad_ref(y)] {
        fill_(grad_of(yg), 1.0f);
        grad_of(yg).data<float>()[4] = INFINITY;
      });
    }
  }
  watch.begin_backward();
  if (written)
    CHECK(message_of([&] { tape.run_backward(); }) ==
          "the backward of l (linear) wrote the gradient of input 1 of linear, shape [2, 4], element 1 [0, 1] is nan; "
          "the gradient it read (of l output) was finite");
  else
    CHECK(message_of([&] { tape.run_backward(); }) ==
          "the gradient of l output reaching the backward of l (linear), shape [2, 3], element 4 [1, 1] is inf; it "
          "was written non-finite by an op that is not checked");
}
