// The MPI communicator (CPU tensors): non-blocking collectives polled against a deadline, so a
// dead or stuck peer ends the job with a message instead of a hang.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/check.h"
#include "core/dtype.h"
#include "dist/comm.h"

namespace fp8t {

namespace {

// Prints "fp8train: rank R: <what>" to stderr and takes the whole job down: after a failed or
// timed-out collective the ranks disagree on where they are, so no rank can continue.
[[noreturn]] void mpi_abort(MPI_Comm comm, const std::string& what) {
  int rank = -1, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "fp8train: rank %d: %s\n", rank, what.c_str());
  std::fflush(stderr);
  MPI_Abort(comm, 1);
  std::_Exit(1);  // MPI_Abort does not return; this is for the compiler
}

[[noreturn]] void mpi_fail(MPI_Comm comm, const char* stmt, int rc, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  mpi_abort(comm, fmt::format("{} failed: {} ({}:{}); a peer rank probably died", stmt, msg, file, line));
}

}  // namespace

}  // namespace fp8t

// Every MPI call goes through this: on error it names the call, MPI's message and file:line.
#define MPI_CHECK(comm, stmt)                                                  \
  do {                                                                         \
    const int fp8t_mpi_rc_ = (stmt);                                           \
    if (fp8t_mpi_rc_ != MPI_SUCCESS) ::fp8t::mpi_fail(comm, #stmt, fp8t_mpi_rc_, __FILE__, __LINE__); \
  } while (0)

namespace fp8t {

namespace {

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI_Init_thread once per process; finalised at exit when we initialised it.
void ensure_mpi_initialized() {
  int initialized = 0;
  MPI_CHECK(MPI_COMM_WORLD, MPI_Initialized(&initialized));
  if (initialized) return;
  int provided = 0;
  MPI_CHECK(MPI_COMM_WORLD, MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  std::atexit(finalize_mpi);
}

// bf16 reductions (precision.grad_dtype: bf16): MPI has no bf16 type, so the elements travel as
// uint16 and these ops combine them in f32 and round to bf16 at every step, as NCCL's bf16 sum does.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(std::fmax(bf16_to_float(a[i]), bf16_to_float(b[i])));
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::f32) return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  static const std::pair<MPI_Op, MPI_Op> bf16_ops = [] {
    std::pair<MPI_Op, MPI_Op> ops;
    MPI_Op_create(&bf16_sum, /*commute=*/1, &ops.first);
    MPI_Op_create(&bf16_max, /*commute=*/1, &ops.second);
    return ops;
  }();
  return op == ReduceOp::sum ? bf16_ops.first : bf16_ops.second;
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::f32 ? MPI_FLOAT : MPI_UINT16_T; }

void check_float_cpu(const Tensor& t, const char* what) {
  FP8T_CHECK((t.dtype() == DType::f32 || t.dtype() == DType::bf16) && t.device().is_cpu(),
             "mpi {}: needs an f32 or bf16 CPU tensor, got {} (CUDA tensors use the NCCL communicator)", what,
             t.str());
}

void check_same_dtype(const Tensor& in, const Tensor& out, const char* what) {
  FP8T_CHECK(in.dtype() == out.dtype(), "mpi {}: in {} and out {} differ in dtype", what, in.str(), out.str());
}

// MPI counts are int; our buffers are far below 2^31 elements per collective, but say so if not.
int mpi_count(int64_t n, const char* what) {
  FP8T_CHECK(n >= 0 && n <= INT32_MAX, "mpi {}: {} elements exceed MPI's int count; lower distributed.bucket_mb",
             what, n);
  return static_cast<int>(n);
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return pa < pb + bn && pb < pa + an;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    ensure_mpi_initialized();
    MPI_CHECK(MPI_COMM_WORLD, MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    // Errors from a dead peer come back as return codes, which MPI_CHECK turns into a message.
    MPI_CHECK(comm_, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_float_cpu(t, "all_reduce");
    MPI_Request req;
    MPI_CHECK(comm_, MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t.numel(), "all_reduce"), mpi_type(t.dtype()),
                                    mpi_op(op, t.dtype()), comm_, &req));
    wait(req, "all_reduce");
  }

  void reduce(Tensor& t, ReduceOp op, int root) override {
    check_float_cpu(t, "reduce");
    MPI_Request req;
    const int n = mpi_count(t.numel(), "reduce");
    // The root reduces in place; the others only send (their receive buffer is ignored).
    const void* send = rank_ == root ? MPI_IN_PLACE : t.raw();
    MPI_CHECK(comm_, MPI_Ireduce(send, t.raw(), n, mpi_type(t.dtype()), mpi_op(op, t.dtype()), root, comm_, &req));
    wait(req, "reduce");
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    check_float_cpu(in, "reduce_scatter");
    check_same_dtype(in, out, "reduce_scatter");
    const MPI_Datatype type = mpi_type(in.dtype());
    const MPI_Op mop = mpi_op(op, in.dtype());
    const int64_t n = out.numel();
    FP8T_CHECK(in.numel() == n * size_, "reduce_scatter: in has {} elements, expected {} ranks x {}", in.numel(),
               size_, n);
    const int count = mpi_count(n, "reduce_scatter");
    const char* own = static_cast<const char*>(in.raw()) + rank_ * out.nbytes();  // in's slice for this rank
    MPI_Request req;
    if (out.raw() == own) {
      // out is in's own slice. MPI_IN_PLACE would leave the result at the *start* of the buffer
      // (and may use the rest as scratch), so reduce into a shard-sized buffer and copy it over.
      Tensor tmp = Tensor::empty({n}, in.dtype(), Device::cpu(), MemCategory::comm);
      MPI_CHECK(comm_, MPI_Ireduce_scatter_block(in.raw(), tmp.raw(), count, type, mop, comm_, &req));
      wait(req, "reduce_scatter");
      out.copy_from(tmp);
      return;
    }
    FP8T_CHECK(!overlaps(in.raw(), in.nbytes(), out.raw(), out.nbytes()),
               "reduce_scatter: out may be in's own rank slice or disjoint from in, not another overlap");
    MPI_CHECK(comm_, MPI_Ireduce_scatter_block(in.raw(), out.raw(), count, type, mop, comm_, &req));
    wait(req, "reduce_scatter");
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_float_cpu(in, "all_gather");
    check_same_dtype(in, out, "all_gather");
    const MPI_Datatype type = mpi_type(in.dtype());
    const int64_t n = in.numel();
    FP8T_CHECK(out.numel() == n * size_, "all_gather: out has {} elements, expected {} ranks x {}", out.numel(),
               size_, n);
    const int count = mpi_count(n, "all_gather");
    const char* own = static_cast<const char*>(out.raw()) + rank_ * in.nbytes();
    MPI_Request req;
    if (in.raw() == own) {
      MPI_CHECK(comm_, MPI_Iallgather(MPI_IN_PLACE, 0, type, out.raw(), count, type, comm_, &req));
    } else {
      FP8T_CHECK(!overlaps(in.raw(), in.nbytes(), out.raw(), out.nbytes()),
                 "all_gather: in may be out's own rank slice or disjoint from out, not another overlap");
      MPI_CHECK(comm_, MPI_Iallgather(in.raw(), count, type, out.raw(), count, type, comm_, &req));
    }
    wait(req, "all_gather");
  }

  void broadcast(Tensor& t, int root) override {
    FP8T_CHECK(t.device().is_cpu(), "mpi broadcast: needs a CPU tensor, got {}", t.str());
    MPI_Request req;
    FP8T_CHECK(t.nbytes() <= INT32_MAX, "mpi broadcast: {} bytes exceed MPI's int count", t.nbytes());
    MPI_CHECK(comm_, MPI_Ibcast(t.raw(), static_cast<int>(t.nbytes()), MPI_BYTE, root, comm_, &req));
    wait(req, "broadcast");
  }

  void barrier() override {
    MPI_Request req;
    MPI_CHECK(comm_, MPI_Ibarrier(comm_, &req));
    wait(req, "barrier");
  }

 private:
  // Polls `req` until it completes or the deadline passes. Open MPI progresses non-blocking
  // collectives inside MPI_Test, so the first polls spin; later ones sleep a little to leave the
  // core to compute threads on small machines.
  void wait(MPI_Request& req, const char* op) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      MPI_CHECK(comm_, MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 100000 ? 1000 : 50));
      if (timeout_s_ > 0 && (polls & 63) == 0 &&
          std::chrono::duration<double>(Clock::now() - start).count() > timeout_s_)
        mpi_abort(comm_, fmt::format("{} did not complete within {} s (a peer rank probably died); aborting", op,
                                     timeout_s_));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace fp8t
