// Elementwise kernels over flat buffers (grid-stride): fill, in-place add and scale, cast. The add op's
// out = a + b is kernels/add.cu.
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

template <typename T>
__device__ __forceinline__ float to_f(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_f<bf16>(bf16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f(float x) {
  return static_cast<T>(x);
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
__global__ void fill_kernel(T* x, size_t n, float value) {
  const T v = from_f<T>(value);
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) x[i] = v;
}

// dst = dst * s (+ src when src is given), converted through f32.
template <typename D, typename S>
__global__ void axpy_kernel(D* dst, const S* src, size_t n, float s) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    float v = to_f(dst[i]) * s;
    if (src) v += to_f(src[i]);
    dst[i] = from_f<D>(v);
  }
}

struct AddRuns {
  AddRun run[kMaxAddRuns];
};
static_assert(sizeof(AddRuns) <= 4000, "kernel arguments up to 4 KB");

// Block b adds run b: dst = bf16(f32(dst) + src), as axpy_kernel<bf16, float> with s = 1.
__global__ void add_runs_kernel(bf16* dst, const float* src, AddRuns runs) {
  const AddRun r = runs.run[blockIdx.x];
  for (int i = threadIdx.x; i < r.n; i += blockDim.x)
    dst[r.dst_offset + i] = from_f<bf16>(to_f(dst[r.dst_offset + i]) + src[r.src_offset + i]);
}

struct ZeroRuns {
  ZeroRun run[kMaxAddRuns];
};
static_assert(sizeof(ZeroRuns) <= 4000, "kernel arguments up to 4 KB");

// Block b zeroes run b.
template <typename W>
__global__ void zero_runs_kernel(W* dst, ZeroRuns runs) {
  const ZeroRun r = runs.run[blockIdx.x];
  for (int64_t i = threadIdx.x; i < r.n; i += blockDim.x) dst[r.offset + i] = W{0};
}

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = from_f<D>(to_f(src[i]));
}

// ------------------------------------------------------------------------------------------------
// kernel launchers

constexpr int kThreads = 256;
int grid_for(size_t n) { return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 65536)); }

void check_dtype(DType t, const char* what) {
  FP8T_CHECK(t == DType::f32 || t == DType::bf16, "{}: dtype {} not supported (f32 or bf16)", what, dtype_name(t));
}

template <typename D, typename S>
void launch_axpy(void* dst, const void* src, size_t n, float s, cudaStream_t stream) {
  axpy_kernel<D, S><<<grid_for(n), kThreads, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n, s);
  CUDA_CHECK_LAUNCH();
}

template <typename D, typename S>
void launch_cast(void* dst, const void* src, size_t n, cudaStream_t stream) {
  cast_kernel<D, S><<<grid_for(n), kThreads, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill(void* x, DType dtype, size_t n, float value, cudaStream_t stream) {
  check_dtype(dtype, "fill");
  if (n == 0) return;
  if (dtype == DType::f32)
    fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<float*>(x), n, value);
  else
    fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<bf16*>(x), n, value);
  CUDA_CHECK_LAUNCH();
}

void add_inplace(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream) {
  check_dtype(dst_dtype, "add_inplace");
  check_dtype(src_dtype, "add_inplace");
  FP8T_CHECK(src != nullptr, "add_inplace: null source");
  if (n == 0) return;
  const bool df = dst_dtype == DType::f32, sf = src_dtype == DType::f32;
  if (df && sf) launch_axpy<float, float>(dst, src, n, 1.0f, stream);
  if (df && !sf) launch_axpy<float, bf16>(dst, src, n, 1.0f, stream);
  if (!df && sf) launch_axpy<bf16, float>(dst, src, n, 1.0f, stream);
  if (!df && !sf) launch_axpy<bf16, bf16>(dst, src, n, 1.0f, stream);
}

void add_runs(uint16_t* dst, const float* src, const AddRun* runs, int count, cudaStream_t stream) {
  for (int first = 0; first < count; first += kMaxAddRuns) {
    const int n = std::min(kMaxAddRuns, count - first);
    AddRuns arg{};
    std::copy(runs + first, runs + first + n, arg.run);
    add_runs_kernel<<<n, kThreads, 0, stream>>>(reinterpret_cast<bf16*>(dst), src, arg);
    CUDA_CHECK_LAUNCH();
  }
}

void zero_runs(void* dst, int elem_bytes, const ZeroRun* runs, int count, cudaStream_t stream) {
  FP8T_CHECK(elem_bytes == 2 || elem_bytes == 4, "zero_runs: elements of {} bytes (2 or 4)", elem_bytes);
  for (int first = 0; first < count; first += kMaxAddRuns) {
    const int n = std::min(kMaxAddRuns, count - first);
    ZeroRuns arg{};
    std::copy(runs + first, runs + first + n, arg.run);
    if (elem_bytes == 2)
      zero_runs_kernel<<<n, kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), arg);
    else
      zero_runs_kernel<<<n, kThreads, 0, stream>>>(static_cast<uint32_t*>(dst), arg);
    CUDA_CHECK_LAUNCH();
  }
}

void scale_inplace(void* x, DType dtype, size_t n, float s, cudaStream_t stream) {
  check_dtype(dtype, "scale_inplace");
  if (n == 0) return;
  if (dtype == DType::f32)
    launch_axpy<float, float>(x, nullptr, n, s, stream);
  else
    launch_axpy<bf16, bf16>(x, nullptr, n, s, stream);
}

void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream) {
  check_dtype(dst_dtype, "cast");
  check_dtype(src_dtype, "cast");
  if (n == 0) return;
  const bool df = dst_dtype == DType::f32, sf = src_dtype == DType::f32;
  if (df && sf) launch_cast<float, float>(dst, src, n, stream);
  if (df && !sf) launch_cast<float, bf16>(dst, src, n, stream);
  if (!df && sf) launch_cast<bf16, float>(dst, src, n, stream);
  if (!df && !sf) launch_cast<bf16, bf16>(dst, src, n, stream);
}

}  // namespace fp8t::kernels
