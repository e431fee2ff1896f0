// Caching device allocator: cudaMalloc'd blocks pooled by rounded size, one instance per device.
// After the first training step every request is served from the pool, so no step calls cudaMalloc.
#ifdef FP8T_HAVE_CUDA  // CPU-only builds get the stub in allocator.cpp
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "core/allocator.h"
#include "core/cuda_check.h"
#include "kernels/matmul.cuh"

namespace fp8t {

void detail::throw_error(const char* file, int line, const std::string& msg) { fail_at(file, line, msg); }

namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  ~CudaAllocator() override {
    // The runtime may already be shutting down at exit: ignore errors here.
    for (auto& [sz, p] : free_) (void)cudaFree(p);
    for (auto& [sz, p] : graph_free_) (void)cudaFree(p);
  }
  Device device() const override { return Device::cuda(index_); }
  int64_t capacity() const override {
    DeviceGuard guard(index_);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    std::lock_guard lk(mu_);
    return limit_ > 0 ? std::min<int64_t>(limit_, static_cast<int64_t>(total_b)) : static_cast<int64_t>(total_b);
  }
  void release_cached() override {
    std::lock_guard lk(mu_);
    release_cached_locked();
  }
  void begin_graph_pool() override {
    std::lock_guard lk(mu_);
    in_graph_capture_ = true;
  }
  void end_graph_pool() override {
    std::lock_guard lk(mu_);
    in_graph_capture_ = false;
  }

 protected:
  void* raw_allocate(size_t bytes, MemCategory cat) override {
    const size_t sz = round_block_size(bytes);
    // Inside a capture, the graphs' own free blocks first; then, as outside one, the shared pool or a new block,
    // which becomes the graphs'.
    if (in_graph_capture_) {
      if (void* p = take_free(graph_free_, sz)) return p;
      void* p = allocate_shared(bytes, sz, cat);
      graph_owned_.insert(p);
      return p;
    }
    return allocate_shared(bytes, sz, cat);
  }

  void raw_deallocate(void* ptr, size_t bytes) override {
    auto it = block_size_.find(ptr);
    const size_t sz = it != block_size_.end() ? it->second : round_block_size(bytes);
    if (it != block_size_.end()) block_size_.erase(it);
    // A block given back inside a capture may be read by the graph before that point: the graphs' from now on.
    if (in_graph_capture_) graph_owned_.insert(ptr);
    (graph_owned_.contains(ptr) ? graph_free_ : free_).emplace(sz, ptr);
  }

 private:
  // Best fit, within pool_block_fits (large blocks stay for large asks); nullptr if none fits.
  void* take_free(std::multimap<size_t, void*>& pool, size_t sz) {
    auto it = pool.lower_bound(sz);
    if (it == pool.end() || !pool_block_fits(it->first, sz)) return nullptr;
    void* p = it->second;
    block_size_[p] = it->first;
    pool.erase(it);
    return p;
  }

  void* allocate_shared(size_t bytes, size_t sz, MemCategory cat) {
    if (void* p = take_free(free_, sz)) return p;
    DeviceGuard guard(index_);
    void* p = nullptr;
    // Under a limit, an allocation that would take the pool past it first returns the cached blocks.
    auto over_limit = [&] { return limit_ > 0 && stats_.reserved + static_cast<int64_t>(sz) > limit_; };
    if (over_limit()) release_cached_locked();
    if (over_limit()) {
      FP8T_FAIL(
          "out of memory under run.memory_limit_gib = {:.2f} GiB on cuda:{}: allocating {} for {} would take the "
          "pool to {}; this process holds: {}. To fit: reduce train.micro_batch (`fp8train plan --memory-gib "
          "{:.0f}` finds the largest that fits), raise distributed.zero_stage, set "
          "precision.fp8.activation_storage: fp8_all, or set train.recompute: block",
          double(limit_) / double(1LL << 30), index_, format_bytes(static_cast<int64_t>(bytes)), category_name(cat),
          format_bytes(stats_.reserved + static_cast<int64_t>(sz)), stats_.breakdown(),
          double(limit_) / double(1LL << 30));
    }
    cudaError_t err = cudaMalloc(&p, sz);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state of the failed malloc
      release_cached_locked();
      err = cudaMalloc(&p, sz);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      FP8T_FAIL(
          "CUDA out of memory on cuda:{} allocating {} for {} ({}); device free {} of {}; "
          "this process holds: {}; reserved by the pool {}. To fit: reduce train.micro_batch (`fp8train plan` "
          "finds the largest that fits; train.micro_batch: auto uses it), raise distributed.zero_stage, set "
          "precision.fp8.activation_storage: fp8 or fp8_all, or set train.recompute: block",
          index_, format_bytes(static_cast<int64_t>(bytes)), category_name(cat), cudaGetErrorString(err),
          format_bytes(static_cast<int64_t>(free_b)), format_bytes(static_cast<int64_t>(total_b)),
          stats_.breakdown(), format_bytes(stats_.reserved));
    }
    stats_.reserved += static_cast<int64_t>(sz);
    block_size_[p] = sz;
    return p;
  }

  struct DeviceGuard {
    int prev = 0;
    explicit DeviceGuard(int index) {
      CUDA_CHECK(cudaGetDevice(&prev));
      if (prev != index) CUDA_CHECK(cudaSetDevice(index));
    }
    ~DeviceGuard() { (void)cudaSetDevice(prev); }
  };

  void release_cached_locked() {
    if (free_.empty()) return;
    DeviceGuard guard(index_);
    CUDA_CHECK(cudaDeviceSynchronize());  // cached blocks may still be read by queued kernels
    for (auto& [sz, p] : free_) {
      CUDA_CHECK(cudaFree(p));
      stats_.reserved -= static_cast<int64_t>(sz);
    }
    free_.clear();
  }

  int index_;
  std::multimap<size_t, void*> free_;         // block size -> cached block
  // The CUDA graphs' private pool: blocks a capture used, and those of them free (handed out only in captures).
  std::set<void*> graph_owned_;
  std::multimap<size_t, void*> graph_free_;
  bool in_graph_capture_ = false;
  std::map<void*, size_t> block_size_;        // live block -> its actual (pooled) size
};

}  // namespace

Allocator& cuda_allocator(int index);

namespace {

// The GEMM wrapper's workspace and scratch, from the current device's pool (accounted as workspace).
void* gemm_allocate(size_t bytes) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return cuda_allocator(dev).allocate(bytes, MemCategory::workspace);
}

}  // namespace

std::string cuda_unavailable_reason() {
  constexpr const char* kAdvice = "run where an NVIDIA GPU and its driver are visible (nvidia-smi lists it; under "
                                  "Slurm, request one, e.g. --gpus-per-node=1), or set run.device: cpu";
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    return fmt::format("no CUDA device can be used here ({}): {}", cudaGetErrorString(err), kAdvice);
  }
  return count > 0 ? std::string() : fmt::format("the CUDA runtime sees no device here: {}", kAdvice);
}

Allocator& cuda_allocator(int index) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<CudaAllocator>> allocators;
  std::lock_guard lk(mu);
  auto& a = allocators[index];
  if (!a) {
    const std::string why = cuda_unavailable_reason();
    FP8T_CHECK(why.empty(), "cuda:{} requested, but {}", index, why);
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    FP8T_CHECK(index >= 0 && index < count, "cuda:{} requested but this machine has {} CUDA device(s)", index,
               count);
    a = std::make_unique<CudaAllocator>(index);
    kernels::set_matmul_memory(index, {gemm_allocate});
  }
  return *a;
}

}  // namespace fp8t
#endif  // FP8T_HAVE_CUDA
