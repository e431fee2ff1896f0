// A CUPTI injection library: records the start and end of every kernel, memset and memcpy that a CUDA process
// runs, and writes them as CSV when the process exits. It measures what a per-kernel profile cannot: how busy the
// device is during a running step and where the gaps between its kernels are (Nsight Systems, which does this,
// is not on the GPU machine). The CUDA driver loads it through CUDA_INJECTION64_PATH and calls
// InitializeInjection; the program itself needs no change.
//
// Output: $FP8T_TIMELINE_OUT (default timeline.csv), one row per activity: kind (kernel | memset | memcpy),
// start_ns, end_ns (device timestamps), stream, name (demangled, CSV-quoted; a memset's also says which module asked
// for it, e.g. "4 bytes from libcublasLt.so.13", from the host stack at its API call). Analysis:
// scripts/bench/timeline.py.
// Build and run: scripts/bench/timeline.sh. Tracing concurrent kernels keeps them concurrent; it adds a small
// cost per launch on the host.
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Activity {
  const char* kind;
  uint64_t start, end;
  uint32_t stream;
  std::string name;
  uint32_t correlation = 0;  // memsets: the API call that asked for it (g_callers)
};

std::mutex g_mutex;
std::vector<Activity> g_activities;
std::unordered_map<uint32_t, std::string> g_callers;  // memset API calls' correlation ids -> the calling module
constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Activity> got;
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      got.push_back({"kernel", k->start, k->end, k->streamId, k->name ? k->name : "?"});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      got.push_back({"memset", m->start, m->end, m->streamId, std::to_string(m->bytes) + " bytes", m->correlationId});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      got.push_back({"memcpy", m->start, m->end, m->streamId, std::to_string(m->bytes) + " bytes"});
    }
  }
  std::size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
    std::fprintf(stderr, "timeline: CUPTI dropped %zu records\n", dropped);
  std::free(buffer);
  std::lock_guard lock(g_mutex);
  for (Activity& a : got) g_activities.push_back(std::move(a));
}

std::string demangled(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : name;
}

std::string csv_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The module of the first frame outside CUDA's own libraries and this one: which code asked for a memset (the
// fp8train executable, or a library such as libcublasLt).
std::string caller_module() {
  void* frames[32];
  const int n = backtrace(frames, 32);
  for (int i = 1; i < n; ++i) {
    Dl_info info{};
    if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
    std::string mod = info.dli_fname;
    mod = mod.substr(mod.find_last_of('/') + 1);
    if (mod.starts_with("libcupti") || mod.starts_with("libcuda.") || mod.starts_with("libcudart") ||
        mod.starts_with("libfp8t_timeline"))
      continue;
    return mod;
  }
  return "?";
}

void CUPTIAPI on_memset_call(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  std::string who = caller_module();
  std::lock_guard lock(g_mutex);
  g_callers[cb->correlationId] = std::move(who);
}

// Memset API calls, runtime and driver, call back on_memset_call (a memset record carries the correlation id of the
// call that launched it).
void watch_memset_calls() {
  CUpti_SubscriberHandle subscriber = nullptr;
  if (cuptiSubscribe(&subscriber, on_memset_call, nullptr) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "timeline: cuptiSubscribe failed; memsets are not attributed\n");
    return;
  }
  for (CUpti_CallbackId id : {CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000})
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id);
  for (CUpti_CallbackId id :
       {CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2, CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2,
        CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
        CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
        CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds, CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds,
        CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz})
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
}

void write_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* env = std::getenv("FP8T_TIMELINE_OUT");
  const std::string path = env && *env ? env : "timeline.csv";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "timeline: cannot write %s\n", path.c_str());
    return;
  }
  std::lock_guard lock(g_mutex);
  std::fprintf(f, "kind,start_ns,end_ns,stream,name\n");
  for (const Activity& a : g_activities) {
    std::string name = demangled(a.name);
    if (const auto it = a.correlation ? g_callers.find(a.correlation) : g_callers.end(); it != g_callers.end())
      name += " from " + it->second;
    std::fprintf(f, "%s,%llu,%llu,%u,%s\n", a.kind, static_cast<unsigned long long>(a.start),
                 static_cast<unsigned long long>(a.end), a.stream, csv_quoted(name).c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "timeline: %zu activities -> %s\n", g_activities.size(), path.c_str());
}

}  // namespace

extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "timeline: cuptiActivityRegisterCallbacks failed; nothing is recorded\n");
    return 0;
  }
  for (CUpti_ActivityKind kind :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMCPY})
    if (cuptiActivityEnable(kind) != CUPTI_SUCCESS) std::fprintf(stderr, "timeline: cannot enable kind %d\n", kind);
  watch_memset_calls();
  std::atexit(write_at_exit);
  return 1;
}
