// The peak table: dense tensor-core TFLOP/s from NVIDIA's data sheets (their sparse figures halved).
#include "train/peak_flops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

#ifdef FP8T_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace fp8t {

namespace {

struct PeakRow {
  const char* label;                        // what the log calls the device
  std::array<const char*, 2> all;           // lower-case parts the name must contain (nullptr: none)
  const char* none;                         // ... and one it must not (nullptr: none)
  double bf16, fp8, tf32;                   // TFLOP/s; fp8 0: no FP8 tensor cores
};

// First match wins. "NVIDIA H100 80GB HBM3" is the SXM part; the NVL parts (other clocks and peaks) are
// left out, so they get no MFU unless run.peak_tflops is set. GH200's GPU matches the H200 row, whose
// peaks it shares.
const std::array<PeakRow, 4> kPeaks{{
    {"H100 PCIe", {"h100", "pcie"}, nullptr, 756.0, 1513.0, 378.0},
    {"H100 SXM", {"h100", nullptr}, "nvl", 989.4, 1978.9, 494.7},
    {"H200", {"h200", nullptr}, "nvl", 989.4, 1978.9, 494.7},
    {"A100", {"a100", nullptr}, nullptr, 312.0, 0.0, 156.0},
}};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

const char* mode_name(ComputeMode m) {
  return m == ComputeMode::fp8 ? "FP8" : m == ComputeMode::bf16 ? "BF16" : "TF32";
}

}  // namespace

PeakFlops peak_flops(std::string_view device_name, ComputeMode mode, double override_tflops) {
  if (override_tflops > 0) return {override_tflops, fmt::format("{:g} TFLOP/s (run.peak_tflops)", override_tflops)};
  const std::string name = lower(device_name);
  for (const PeakRow& row : kPeaks) {
    const auto has = [&](const char* part) { return part && name.find(part) != std::string::npos; };
    const auto has_or_unset = [&](const char* part) { return !part || has(part); };
    if (!std::all_of(row.all.begin(), row.all.end(), has_or_unset) || has(row.none)) continue;
    if (mode == ComputeMode::fp8 && row.fp8 == 0)
      return {row.bf16, fmt::format("{:g} TFLOP/s, the dense BF16 peak of {} ({}): it has no FP8 tensor cores, so "
                                    "MFU is against its BF16 peak", row.bf16, row.label, device_name)};
    const double t = mode == ComputeMode::fp8 ? row.fp8 : mode == ComputeMode::bf16 ? row.bf16 : row.tf32;
    return {t, fmt::format("{:g} TFLOP/s, the dense {} peak of {} ({})", t, mode_name(mode), row.label, device_name)};
  }
  return {0, fmt::format("no MFU: device '{}' is not in the peak table (src/train/peak_flops.cpp); set "
                         "run.peak_tflops to its peak TFLOP/s for this compute mode to get one",
                         device_name)};
}

std::string device_name(Device d) {
  if (d.is_cpu()) return "cpu";
#ifdef FP8T_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, d.index) == cudaSuccess) return prop.name;
  (void)cudaGetLastError();  // the name is for MFU only: no reason to stop the run
#endif
  return "";
}

}  // namespace fp8t
