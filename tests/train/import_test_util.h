// Helpers for the import tests: safetensors files read into and written from a name -> tensor map (to
// rename, reshape, drop or re-type tensors of our own export), and short runs started from a checkpoint.
#pragma once
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "checkpoint_test_util.h"

namespace fp8t::test {

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
using StMap = std::map<std::string, StTensor>;

inline StMap read_safetensors(const fs::path& p) {
  const std::string file = slurp(p);
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const auto h = nlohmann::json::parse(file.substr(8, n));
  StMap m;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    const auto b = t["data_offsets"][0].get<size_t>(), e = t["data_offsets"][1].get<size_t>();
    m[name] = {t["dtype"].get<std::string>(), t["shape"].get<std::vector<int64_t>>(), file.substr(8 + n + b, e - b)};
  }
  return m;
}

inline void write_safetensors(const fs::path& p, const StMap& m) {
  nlohmann::json h = nlohmann::json::object();
  std::string payload;
  for (const auto& [name, t] : m) {
    const size_t begin = payload.size(), end = begin + t.bytes.size();
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, end}}};
    payload += t.bytes;
  }
  const std::string head = h.dump();
  const uint64_t n = head.size();
  spit(p, std::string(reinterpret_cast<const char*>(&n), 8) + head + payload);
}

inline std::vector<float> floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// F32 bytes as BF16 bytes, each value rounded to nearest even.
inline std::string to_bf16(const std::string& f32) {
  const std::vector<float> v = floats(f32);
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  return {reinterpret_cast<const char*>(b.data()), b.size() * 2};
}

// model.bin with every value rounded to BF16 and back.
inline std::string bf16_rounded(const std::string& model_bin) {
  std::vector<float> v = floats(model_bin);
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return {reinterpret_cast<const char*>(v.data()), v.size() * 4};
}

inline std::string model_bin(const fs::path& ckpt) { return slurp(ckpt / "model.bin"); }
inline fs::path latest_of(const fs::path& run) {
  return run / "checkpoints" / slurp(run / "checkpoints" / "latest");
}

// A fresh run `name` of `steps` steps started from `init_from`'s weights.
inline TrainResult train_from(const fs::path& init_from, const std::string& name, int steps = 1) {
  auto comm = make_single_communicator();
  Config cfg = tiny_run(name, steps);
  cfg.train.init_from = init_from.string();
  fs::remove_all(cfg.run.out_dir);
  return train(cfg, *comm);
}

}  // namespace fp8t::test
