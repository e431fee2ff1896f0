// A CUPTI injection library: records the start and end of every kernel, memset and memcpy that a CUDA process
// runs, and writes them as CSV when the process exits. It measures what a per-kernel profile cannot: how busy the
// device is during a running step and where the gaps between its kernels are (Nsight Systems, which does this,
// is not on the GPU machine). The CUDA driver loads it through CUDA_INJECTION64_PATH and calls
// InitializeInjection; the program itself needs no change.
//
// Output: $FP8T_TIMELINE_OUT (default timeline.csv), one row per activity: kind (kernel | memset | memcpy),
// start_ns, end_ns (device timestamps), stream, name (demangled, CSV-quoted). Analysis: scripts/bench/timeline.py.
// Build and run: scripts/bench/timeline.sh. Tracing concurrent kernels keeps them concurrent; it adds a small
// cost per launch on the host.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Activity {
  const char* kind;
  uint64_t start, end;
  uint32_t stream;
  std::string name;
};

std::mutex g_mutex;
std::vector<Activity> g_activities;
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
      got.push_back({"memset", m->start, m->end, m->streamId, std::to_string(m->bytes) + " bytes"});
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
  for (const Activity& a : g_activities)
    std::fprintf(f, "%s,%llu,%llu,%u,%s\n", a.kind, static_cast<unsigned long long>(a.start),
                 static_cast<unsigned long long>(a.end), a.stream, csv_quoted(demangled(a.name)).c_str());
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
  std::atexit(write_at_exit);
  return 1;
}
