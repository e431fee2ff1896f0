// One status check for every CUDA runtime, cuBLASLt and NCCL call (statement, error string, file:line),
// and RAII owners for streams, events and cuBLASLt handles.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <sstream>
#include <string>
#include <utility>

#ifndef __CUDACC__
#include "core/check.h"
#endif
#ifdef FP8T_HAVE_NCCL
#include <nccl.h>
#endif

namespace fp8t::detail {

// A small "{}" formatter for code compiled by nvcc, which cannot compile fmt's format-string checks.
inline void brace_format_into(std::ostringstream& os, const char* f) { os << f; }
template <typename T, typename... Rest>
void brace_format_into(std::ostringstream& os, const char* f, const T& v, const Rest&... rest) {
  for (; *f; ++f) {
    if (f[0] == '{' && f[1] == '}') {
      os << v;
      brace_format_into(os, f + 2, rest...);
      return;
    }
    os << *f;
  }
}
template <typename... Args>
std::string brace_format(const char* f, const Args&... args) {
  std::ostringstream os;
  brace_format_into(os, f, args...);
  return os.str();
}

// Throws fp8t::Error("<msg> (file:line)"); defined out of line so .cu files need not see fmt.
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

}  // namespace fp8t::detail

#ifdef __CUDACC__
// core/check.h's macros, for .cu files (same messages, "{}" placeholders only).
#define FP8T_CHECK(cond, ...)                                                                             \
  do {                                                                                                    \
    if (!(cond)) ::fp8t::detail::throw_error(__FILE__, __LINE__, ::fp8t::detail::brace_format(__VA_ARGS__)); \
  } while (0)
#define FP8T_FAIL(...) ::fp8t::detail::throw_error(__FILE__, __LINE__, ::fp8t::detail::brace_format(__VA_ARGS__))
#endif

#define FP8T_STATUS_CHECK_(stmt, ok, to_string)                                                      \
  do {                                                                                               \
    const auto fp8t_status_ = (stmt);                                                                \
    if (fp8t_status_ != (ok))                                                                        \
      ::fp8t::detail::throw_error(__FILE__, __LINE__,                                                \
                                  ::fp8t::detail::brace_format("{} failed: {}", #stmt, to_string(fp8t_status_))); \
  } while (0)

#define CUDA_CHECK(stmt) FP8T_STATUS_CHECK_(stmt, cudaSuccess, cudaGetErrorString)
#define CUBLAS_CHECK(stmt) FP8T_STATUS_CHECK_(stmt, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString)
#ifdef FP8T_HAVE_NCCL
#define NCCL_CHECK(stmt) FP8T_STATUS_CHECK_(stmt, ncclSuccess, ncclGetErrorString)
#endif
// After a kernel launch: reports launch-configuration errors at the launching line.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace fp8t {

// Owns a CUDA handle; Destroy is the API's destroy function. Errors on destruction are ignored:
// destructors may run after the CUDA runtime has shut down at process exit.
template <typename H, auto Destroy>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(H h) : h_(h) {}
  ~CudaHandle() {
    if (h_) (void)Destroy(h_);
  }
  CudaHandle(CudaHandle&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  CudaHandle& operator=(CudaHandle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  H get() const { return h_; }
  operator H() const { return h_; }

 private:
  H h_{};
};

using CudaStream = CudaHandle<cudaStream_t, cudaStreamDestroy>;
using CudaEvent = CudaHandle<cudaEvent_t, cudaEventDestroy>;
using CublasLtHandle = CudaHandle<cublasLtHandle_t, cublasLtDestroy>;

// A stream that orders with the legacy default stream (so cudaMemset/cudaMemcpy stay ordered).
inline CudaStream make_stream() {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
  return CudaStream(s);
}
inline CudaEvent make_event(bool timing = false) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return CudaEvent(e);
}
inline CublasLtHandle make_cublaslt() {
  cublasLtHandle_t h = nullptr;
  CUBLAS_CHECK(cublasLtCreate(&h));
  return CublasLtHandle(h);
}

}  // namespace fp8t
