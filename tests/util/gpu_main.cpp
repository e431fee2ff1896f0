// GPU test runner: exits 4 (ctest SKIP_RETURN_CODE) with a clear message when no CUDA device is present.
#include <cuda_runtime.h>

#include <catch2/catch_session.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("fp8t gpu tests: SKIPPED — no CUDA device present (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return 4;
  }
  return Catch::Session().run(argc, argv);
}
