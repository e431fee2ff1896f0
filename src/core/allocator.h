// Category-tagged caching allocator interface and per-category memory accounting.
// Every byte of tensor storage comes from an Allocator, so current and peak bytes per
// category (parameters, gradients, ...) are always known: metrics, OOM reports and the planner use them.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"

namespace fp8t {

enum class MemCategory : uint8_t { parameters, gradients, optimizer, activations, fp8_cache, workspace, comm };
constexpr size_t kNumMemCategories = 7;
std::string_view category_name(MemCategory c);

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;
  int64_t reserved = 0;  // bytes held by the allocator's pools, used or cached
  int64_t cur(MemCategory c) const { return current[static_cast<size_t>(c)]; }
  int64_t pk(MemCategory c) const { return peak[static_cast<size_t>(c)]; }
  std::string breakdown() const;  // "parameters 1.2 GiB, gradients ..." for error messages and logs
};

std::string format_bytes(int64_t bytes);

// While an ActivationRole is open on a thread, the activation allocations made there are also counted
// under its role (a string literal: "attention", "residual stream", ...), per allocator, until freed:
// the planner's account of which saved tensor costs what. Roles nest; the innermost counts.
class ActivationRole {
 public:
  explicit ActivationRole(const char* role);
  ~ActivationRole();
  ActivationRole(const ActivationRole&) = delete;
  ActivationRole& operator=(const ActivationRole&) = delete;
  static const char* current();

 private:
  const char* prev_;
};

// Base class: does the accounting; subclasses provide raw memory and the pool.
class Allocator {
 public:
  virtual ~Allocator() = default;
  void* allocate(size_t bytes, MemCategory cat);
  void deallocate(void* ptr, size_t bytes, MemCategory cat);
  MemoryStats stats() const;
  void reset_peaks();
  // Current activation bytes by ActivationRole (allocations made outside any role are not listed).
  std::map<std::string, int64_t> role_bytes() const;
  virtual Device device() const = 0;
  virtual void release_cached() {}  // return pooled blocks to the system
  // Bytes this device can hold in all (GPU memory, or the host's physical memory), or the limit if lower.
  virtual int64_t capacity() const = 0;
  // Caps what the device pool may reserve (run.memory_limit_gib; 0: no cap), so that a run on a large
  // card behaves as on a smaller one: an allocation past it fails with the out-of-memory report, and
  // capacity() reports the cap. The host allocator reports it as its capacity but does not enforce it.
  void set_limit(int64_t bytes);
  int64_t limit() const;
  // A CUDA graph's private pool (core/graph_capture.h): between begin and end every block handed out or given
  // back becomes the graph's, and from then on is handed out only inside later captures, never to code
  // outside a graph, which could hold it across a replay that writes it. Host allocators have no graphs.
  virtual void begin_graph_pool() {}
  virtual void end_graph_pool() {}
  // A replayed graph allocates nothing here, but its step held what its capture did: the peaks rise to those.
  void note_replay(const MemoryStats& at_capture);

 protected:
  virtual void* raw_allocate(size_t bytes, MemCategory cat) = 0;  // throws Error with a report on failure
  virtual void raw_deallocate(void* ptr, size_t bytes) = 0;
  mutable std::mutex mu_;
  MemoryStats stats_;
  int64_t limit_ = 0;

 private:
  std::map<void*, const char*> role_of_;           // live role-counted allocations
  std::map<std::string_view, int64_t> role_bytes_;  // their bytes by role
};

// Host allocator: 64-byte aligned blocks cached by rounded size.
class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override;
  Device device() const override { return Device::cpu(); }
  void release_cached() override;
  int64_t capacity() const override;

 protected:
  void* raw_allocate(size_t bytes, MemCategory cat) override;
  void raw_deallocate(void* ptr, size_t bytes) override;

 private:
  std::multimap<size_t, void*> free_;  // rounded size -> block
};

// The allocator serving a device; CUDA allocators are created on first use (needs FP8T_CUDA).
Allocator& allocator_for(Device d);

// Empty when this process can use at least one CUDA device; else why not (no CUDA in this build, no driver, no
// device visible) and what to do, for an error message.
std::string cuda_unavailable_reason();

// Rounded block size used by the pools (1 KiB granularity under 1 MiB, 2 MiB above).
size_t round_block_size(size_t bytes);

// Whether a cached block of `block` bytes may serve a request rounded to `rounded` bytes: at least that
// big, and at most twice it under 1 MiB but only 1/8 more above (a large block handed to a much
// smaller request is memory the pool holds and nobody uses: at GPT-2 124M with micro-batch 719, the
// old "up to twice" rule left 17 GiB of 138 in such blocks and the run ran out of memory).
bool pool_block_fits(size_t block, size_t rounded);

}  // namespace fp8t
