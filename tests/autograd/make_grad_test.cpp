// Lazily supplied gradients (GradCell::make_grad, what ZeRO-2's staging buckets use): the hook runs
// once, when a gradient is first needed, and ops accumulate into what it returns, even those that
// would otherwise assign a gradient tensor of their own (add's shortcut).
#include <catch2/catch_test_macros.hpp>

#include "autograd/tape.h"
#include "ops/ops.h"

using namespace fp8t;

namespace {

// A "bucket" of n floats, and Vars whose gradients are views of it at the given offsets.
struct Bucket {
  Tensor buffer;
  int made = 0;  // make_grad calls
  void bind(const Var& v, int64_t offset) {
    v->grad_cell->make_grad = [this, offset, shape = v->value.shape()] {
      ++made;
      if (!buffer.defined()) buffer = Tensor::zeros({16}, DType::f32);
      return buffer.slice_flat(offset, shape);
    };
  }
};

}  // namespace

TEST_CASE("autograd: make_grad supplies a parameter's gradient once, on first use", "[autograd]") {
  Bucket bucket;
  Var p = make_var(Tensor::from_vector({1.0f, 2.0f}, {2}), true, "p");
  bucket.bind(p, 3);
  CHECK_FALSE(p->grad.defined());  // nothing allocated before it is needed
  CHECK(bucket.made == 0);
  CHECK(grad_exists(p));  // a supplied gradient counts as existing, so ops accumulate into it
  CHECK(bucket.made == 1);
  CHECK(p->grad.raw() == static_cast<float*>(bucket.buffer.raw()) + 3);
  grad_of(p);
  grad_of(grad_ref(p));
  CHECK(bucket.made == 1);
  // Reset (a bucket was reduced and released): the next use asks again.
  p->grad = Tensor();
  grad_of(grad_ref(p));
  CHECK(bucket.made == 2);
}

TEST_CASE("autograd: ops accumulate into a make_grad gradient instead of assigning their own", "[autograd]") {
  // y = (p + x) + p: add's backward would hand its output gradient to a gradient that does not
  // exist yet; a parameter's gradient must still land in the bucket, summed.
  Bucket bucket;
  Var p = make_var(Tensor::from_vector({1.0f, 2.0f, 3.0f}, {3}), true, "p");
  Var q = make_var(Tensor::from_vector({0.5f, 0.5f, 0.5f}, {3}), true, "q");
  bucket.bind(p, 0);
  bucket.bind(q, 8);
  Var x = make_var(Tensor::from_vector({4.0f, 5.0f, 6.0f}, {3}), true);
  Tape tape;
  Var y;
  {
    TapeScope scope(&tape);
    y = add(add(p, x), add(p, q));
  }
  fill_(grad_of(y), 2.0f);
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  const std::vector<float> all = bucket.buffer.to_float_vector();
  CHECK(std::vector<float>(all.begin(), all.begin() + 3) == std::vector<float>{4.0f, 4.0f, 4.0f});  // 2 + 2
  CHECK(std::vector<float>(all.begin() + 8, all.begin() + 11) == std::vector<float>{2.0f, 2.0f, 2.0f});
  CHECK(p->grad.raw() == bucket.buffer.raw());
  CHECK(x->grad.to_float_vector() == std::vector<float>{2.0f, 2.0f, 2.0f});  // no hook: a tensor of its own
  CHECK(bucket.made == 2);

  // A linear's weight and bias gradients land in the bucket too, accumulated over two backwards.
  Bucket lin;
  Var w = make_var(Tensor::from_vector({1.0f, 0.0f, 0.0f, 1.0f}, {2, 2}), true, "w");
  Var b = make_var(Tensor::from_vector({0.0f, 0.0f}, {2}), true, "b");
  lin.bind(w, 0);
  lin.bind(b, 4);
  for (int pass = 0; pass < 2; ++pass) {
    Tape t;
    Var out;
    {
      TapeScope scope(&t);
      out = linear(make_var(Tensor::from_vector({1.0f, 2.0f}, {1, 2}), false), w, b);
    }
    fill_(grad_of(out), 1.0f);
    TapeScope none(nullptr);
    t.run_backward();
  }
  // dW = dy^T x per pass: rows (1, 2); db = 1 per pass.
  const std::vector<float> g = lin.buffer.to_float_vector();
  CHECK(std::vector<float>(g.begin(), g.begin() + 6) == std::vector<float>{2.0f, 4.0f, 2.0f, 4.0f, 2.0f, 2.0f});
  CHECK(lin.made == 2);
}

TEST_CASE("autograd: a checkpoint's inner backward reports progress to the outer hook", "[autograd]") {
  // ZeRO-2 sees a recomputed block's parameter gradients complete inside its checkpoint node.
  Var w = make_var(Tensor::from_vector({2.0f, 3.0f}, {2}), true, "w");
  Var x = make_var(Tensor::from_vector({1.0f, 1.0f}, {2}), true);
  Tape tape;
  Var y;
  {
    TapeScope scope(&tape);
    y = checkpoint([&](const Var& in) { return add(add(in, w), w); }, x);  // 2 inner nodes, 1 outer
  }
  std::vector<bool> w_done;  // at each report: no inner node holds w's gradient any more
  tape.set_progress_hook([&](size_t) { w_done.push_back(w->grad_cell.use_count() == 1); });
  fill_(grad_of(y), 1.0f);
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  REQUIRE(w_done.size() == 3);  // two inner nodes, then the checkpoint node
  CHECK(w_done == std::vector<bool>{false, true, true});
  CHECK(w->grad.to_float_vector() == std::vector<float>{2.0f, 2.0f});
}
