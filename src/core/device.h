// Device: where a tensor's storage lives (host memory or one CUDA device).
#pragma once
#include <cstdint>
#include <string>

namespace fp8t {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
};

}  // namespace fp8t
