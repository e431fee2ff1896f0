// Accounting shared by all allocators, and the host caching allocator.
#include "core/allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace fp8t {

std::string_view category_name(MemCategory c) {
  static constexpr std::array<std::string_view, kNumMemCategories> names = {
      "parameters", "gradients", "optimizer", "activations", "fp8_cache", "workspace", "comm"};
  return names[static_cast<size_t>(c)];
}

std::string format_bytes(int64_t b) {
  const double x = static_cast<double>(b);
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", x / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", x / (1 << 20));
  if (b >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", x / (1 << 10));
  return fmt::format("{} B", b);
}

std::string MemoryStats::breakdown() const {
  std::string s;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {} (peak {})", category_name(static_cast<MemCategory>(i)), format_bytes(current[i]),
                     format_bytes(peak[i]));
  }
  return s;
}

bool pool_block_fits(size_t block, size_t rounded) {
  if (block < rounded) return false;
  return rounded < (size_t{1} << 20) ? block <= 2 * rounded : block <= rounded + rounded / 8;
}

size_t round_block_size(size_t bytes) {
  constexpr size_t kSmall = 1 << 10, kLarge = 2 << 20;
  if (bytes == 0) bytes = 1;
  if (bytes < (1 << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

namespace {
thread_local const char* t_role = nullptr;
}  // namespace

ActivationRole::ActivationRole(const char* role) : prev_(t_role) { t_role = role; }
ActivationRole::~ActivationRole() { t_role = prev_; }
const char* ActivationRole::current() { return t_role; }

void* Allocator::allocate(size_t bytes, MemCategory cat) {
  std::lock_guard lk(mu_);
  void* p = raw_allocate(bytes, cat);
  if (t_role && cat == MemCategory::activations) {
    role_of_[p] = t_role;
    role_bytes_[t_role] += static_cast<int64_t>(bytes);
  }
  const size_t i = static_cast<size_t>(cat);
  stats_.current[i] += static_cast<int64_t>(bytes);
  stats_.peak[i] = std::max(stats_.peak[i], stats_.current[i]);
  stats_.total_current += static_cast<int64_t>(bytes);
  stats_.total_peak = std::max(stats_.total_peak, stats_.total_current);
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes, MemCategory cat) {
  if (!ptr) return;
  std::lock_guard lk(mu_);
  raw_deallocate(ptr, bytes);
  if (!role_of_.empty()) {
    if (auto it = role_of_.find(ptr); it != role_of_.end()) {
      role_bytes_[it->second] -= static_cast<int64_t>(bytes);
      role_of_.erase(it);
    }
  }
  stats_.current[static_cast<size_t>(cat)] -= static_cast<int64_t>(bytes);
  stats_.total_current -= static_cast<int64_t>(bytes);
}

std::map<std::string, int64_t> Allocator::role_bytes() const {
  std::lock_guard lk(mu_);
  std::map<std::string, int64_t> out;
  for (const auto& [role, bytes] : role_bytes_)
    if (bytes != 0) out[std::string(role)] = bytes;
  return out;
}

MemoryStats Allocator::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Allocator::reset_peaks() {
  std::lock_guard lk(mu_);
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
}

void Allocator::note_replay(const MemoryStats& at_capture) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < kNumMemCategories; ++i) stats_.peak[i] = std::max(stats_.peak[i], at_capture.peak[i]);
  stats_.total_peak = std::max(stats_.total_peak, at_capture.total_peak);
}

CpuAllocator::~CpuAllocator() { release_cached(); }

void* CpuAllocator::raw_allocate(size_t bytes, MemCategory cat) {
  const size_t sz = round_block_size(bytes);
  if (auto it = free_.find(sz); it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    return p;
  }
  void* p = std::aligned_alloc(64, sz);
  if (!p) {
    release_cached();
    p = std::aligned_alloc(64, sz);
  }
  FP8T_CHECK(p, "host out of memory allocating {} for {}; in use: {}. Reduce train.micro_batch or model size",
             format_bytes(static_cast<int64_t>(bytes)), category_name(cat), stats_.breakdown());
  stats_.reserved += static_cast<int64_t>(sz);
  return p;
}

void CpuAllocator::raw_deallocate(void* ptr, size_t bytes) { free_.emplace(round_block_size(bytes), ptr); }

void Allocator::set_limit(int64_t bytes) {
  FP8T_CHECK(bytes >= 0, "memory limit must be >= 0 bytes, got {}", bytes);
  std::lock_guard lk(mu_);
  limit_ = bytes;
}

int64_t Allocator::limit() const {
  std::lock_guard lk(mu_);
  return limit_;
}

int64_t CpuAllocator::capacity() const {
  const int64_t phys = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
  std::lock_guard lk(mu_);
  return limit_ > 0 ? std::min(limit_, phys) : phys;  // planned to, not enforced on the host
}

void CpuAllocator::release_cached() {
  for (auto& [sz, p] : free_) {
    std::free(p);
    stats_.reserved -= static_cast<int64_t>(sz);
  }
  free_.clear();
}

#ifndef FP8T_HAVE_CUDA
std::string cuda_unavailable_reason() {
  return "this build has no CUDA support: rebuild with -DFP8T_CUDA=ON, or set run.device: cpu";
}

Allocator& cuda_allocator(int index) { FP8T_FAIL("cuda:{} requested, but {}", index, cuda_unavailable_reason()); }
#else
Allocator& cuda_allocator(int index);  // core/cuda_allocator.cpp
#endif

Allocator& allocator_for(Device d) {
  static CpuAllocator cpu;
  if (d.is_cpu()) return cpu;
  return cuda_allocator(d.index);
}

}  // namespace fp8t
