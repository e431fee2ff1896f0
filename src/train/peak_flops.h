// MFU's denominator: the dense (no sparsity) tensor-core peak of a device in a compute mode, from a
// small table matched on the CUDA device name, or run.peak_tflops.
#pragma once
#include <string>
#include <string_view>

#include "config/config.h"
#include "core/device.h"

namespace fp8t {

struct PeakFlops {
  double tflops = 0;  // 0: unknown, no MFU
  std::string about;  // for the log: where the number comes from, or why there is none
};

// `override_tflops` (run.peak_tflops) when > 0; else the table's peak of `device_name` for `mode`
// (fp8: FP8, bf16: BF16, fp32: TF32): H100 SXM and H200, H100 PCIe, A100 (no FP8: its BF16 peak).
// Names are matched case-insensitively; any other device (the CPU included) gets 0.
PeakFlops peak_flops(std::string_view device_name, ComputeMode mode, double override_tflops = 0);

// The name the CUDA runtime gives device d ("NVIDIA H100 80GB HBM3"); "cpu" for the CPU, "" when it
// cannot be read.
std::string device_name(Device d);

}  // namespace fp8t
