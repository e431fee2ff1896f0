// The NCCL communicator (CUDA tensors): collectives on a dedicated communication stream, ordered
// after the compute stream's work, and a watchdog thread that ends the job with a message when a
// collective fails (ncclCommGetAsyncError) or has not completed within the timeout.
#ifdef FP8T_HAVE_NCCL
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>

#include "core/cuda_check.h"
#include "dist/comm.h"
#include "kernels/stream.cuh"

namespace fp8t {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    default: FP8T_FAIL("nccl {}: unsupported dtype in {}; use f32 or bf16", op, t.str());
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

void check_cuda_tensor(const Tensor& t, const char* op) {
  FP8T_CHECK(t.device().is_cuda(), "nccl {}: needs a CUDA tensor, got {}", op, t.str());
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world, int device, double timeout_s,
                   const std::function<void(std::span<char>)>& share_id)
      : rank_(rank), size_(world), device_(device), timeout_s_(timeout_s) {
    CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id{};
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    share_id(std::span<char>(id.internal, sizeof(id.internal)));
    NCCL_CHECK(ncclCommInitRank(&comm_, world, id, rank));
    cudaStream_t s = nullptr;
    // Non-blocking: it must not serialise with the legacy default stream, or nothing overlaps.
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = CudaStream(s);
    ready_ = make_event();
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    (void)cudaStreamSynchronize(stream_);
    (void)ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_cuda_tensor(t, "all_reduce");
    issue("all_reduce", true, [&](cudaStream_t s) {
      return ncclAllReduce(t.raw(), t.raw(), t.numel(), nccl_type(t, "all_reduce"), nccl_op(op), comm_, s);
    });
  }

  // Left running on the communication stream (ZeRO-2 overlaps it with the backward); the
  // compute stream waits for it in synchronize().
  void reduce(Tensor& t, ReduceOp op, int root) override {
    check_cuda_tensor(t, "reduce");
    issue("reduce", false, [&](cudaStream_t s) {
      return ncclReduce(t.raw(), t.raw(), t.numel(), nccl_type(t, "reduce"), nccl_op(op), root, comm_, s);
    });
  }

  // NCCL is in place when out is in's own rank slice, which is how the trainer calls it.
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    check_cuda_tensor(in, "reduce_scatter");
    check_cuda_tensor(out, "reduce_scatter");
    FP8T_CHECK(in.numel() == out.numel() * size_ && in.dtype() == out.dtype(),
               "reduce_scatter: in {} must hold {} ranks x out {}", in.str(), size_, out.str());
    issue("reduce_scatter", true, [&](cudaStream_t s) {
      return ncclReduceScatter(in.raw(), out.raw(), out.numel(), nccl_type(out, "reduce_scatter"), nccl_op(op),
                               comm_, s);
    });
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_cuda_tensor(in, "all_gather");
    check_cuda_tensor(out, "all_gather");
    FP8T_CHECK(out.numel() == in.numel() * size_ && in.dtype() == out.dtype(),
               "all_gather: out {} must hold {} ranks x in {}", out.str(), size_, in.str());
    issue("all_gather", true, [&](cudaStream_t s) {
      return ncclAllGather(in.raw(), out.raw(), in.numel(), nccl_type(in, "all_gather"), comm_, s);
    });
  }

  void broadcast(Tensor& t, int root) override {
    check_cuda_tensor(t, "broadcast");
    issue("broadcast", true, [&](cudaStream_t s) {
      return ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclChar, root, comm_, s);
    });
  }

  // One group of broadcasts, rank k's part from rank k, which NCCL runs together (NCCL's all-gather with
  // per-rank counts). Bytes, so any dtype.
  void all_gather_v(Tensor& t, const std::vector<int64_t>& cuts) override {
    check_cuda_tensor(t, "all_gather_v");
    check_gather_cuts(t, cuts);
    const auto width = static_cast<int64_t>(dtype_size(t.dtype()));
    issue("all_gather_v", true, [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      for (int k = 0; k < size_ && r == ncclSuccess; ++k) {
        if (cuts[k + 1] == cuts[k]) continue;
        char* part = static_cast<char*>(t.raw()) + cuts[k] * width;
        r = ncclBroadcast(part, part, static_cast<size_t>((cuts[k + 1] - cuts[k]) * width), ncclChar, k, comm_, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  // Host-level: returns when every rank got here (a one-element all-reduce, waited for).
  void barrier() override {
    if (!token_.defined()) token_ = Tensor::zeros({1}, DType::f32, Device::cuda(device_), MemCategory::comm);
    issue("barrier", true, [&](cudaStream_t s) {
      return ncclAllReduce(token_.raw(), token_.raw(), 1, ncclFloat32, ncclSum, comm_, s);
    });
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void synchronize() override {
    CUDA_CHECK(cudaEventRecord(ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(kernels::compute_stream(), ready_, 0));
  }

  uint64_t ticket() override { return issued_; }

  // Collectives complete in issue order on the one communication stream, so waiting for number
  // `ticket` covers those before it. One the watchdog already dropped has completed.
  void wait(uint64_t ticket) override {
    FP8T_CHECK(ticket <= issued_, "nccl wait: ticket {} but only {} collectives were issued", ticket, issued_);
    std::lock_guard lock(mu_);
    for (const Pending& p : pending_)
      if (p.seq == ticket) {
        CUDA_CHECK(cudaStreamWaitEvent(kernels::compute_stream(), p.done, 0));
        return;
      }
  }

 private:
  // Runs `call` on the communication stream after the compute stream's work so far; with
  // `ordered`, later compute-stream work waits for it. The watchdog follows its completion.
  template <typename F>
  void issue(const char* op, bool ordered, F&& call) {
    const cudaStream_t compute = kernels::compute_stream();
    CUDA_CHECK(cudaEventRecord(ready_, compute));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    NCCL_CHECK(call(stream_.get()));
    CudaEvent done = make_event();
    CUDA_CHECK(cudaEventRecord(done, stream_));
    if (ordered) CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));
    std::lock_guard lock(mu_);
    pending_.push_back({op, std::move(done), Clock::now(), ++issued_});
    cv_.notify_all();
  }

  // The watchdog: a peer that died leaves our collectives waiting forever, and a failed
  // connection reports only through ncclCommGetAsyncError; either ends every rank of the job.
  void watch() {
    (void)cudaSetDevice(device_);
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) pending_.pop_front();
      if (pending_.empty()) continue;
      const Pending& p = pending_.front();
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        abort_job(p.op, fmt::format("failed: {}", ncclGetErrorString(async)));
      const double waited = std::chrono::duration<double>(Clock::now() - p.issued).count();
      if (timeout_s_ > 0 && waited > timeout_s_)
        abort_job(p.op, fmt::format("did not complete within {} s (a peer rank probably died); aborting", timeout_s_));
    }
  }

  [[noreturn]] void abort_job(const char* op, const std::string& why) {
    std::fprintf(stderr, "fp8train: rank %d: %s %s\n", rank_, op, why.c_str());
    std::fflush(stderr);
    (void)ncclCommAbort(comm_);  // frees the other collectives' kernels so the process can exit
    std::_Exit(1);               // the launcher (mpirun, srun) then ends the other ranks
  }

  struct Pending {
    const char* op;
    CudaEvent done;
    Clock::time_point issued;
    uint64_t seq;  // its ticket
  };

  int rank_, size_, device_;
  std::atomic<double> timeout_s_;
  ncclComm_t comm_ = nullptr;
  CudaStream stream_;
  CudaEvent ready_;
  Tensor token_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;  // issued and not yet seen complete by the watchdog
  uint64_t issued_ = 0;          // collectives issued (written under mu_, read by the issuing thread)
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world, int device, double timeout_s,
                                                     const std::function<void(std::span<char>)>& share_id) {
  return std::make_unique<NcclCommunicator>(rank, world, device, timeout_s, share_id);
}

}  // namespace fp8t
#endif  // FP8T_HAVE_NCCL
