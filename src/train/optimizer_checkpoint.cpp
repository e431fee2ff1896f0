// The optimizer's part of checkpoints: the moments of every rank's shard, each in its stored dtype, and
// loading them into another world size, ZeRO stage or state dtype.
#include "train/optimizer_checkpoint.h"

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "train/checkpoint.h"

namespace fp8t {

namespace fs = std::filesystem;

// Optimizer state in checkpoints: per rank m (optim_rankR.bin), v (optim_v_rankR.bin) and, for fp8
// state, m's block scales (optim_mscale_rankR.bin), each in its stored dtype; optim_state.json names the
// dtypes (absent in checkpoints from before it: f32 moments).

namespace {

constexpr const char* kStateFile = "optim_state.json";

// The checkpoint's moments, each read as one logical vector: the rank files in order.
struct StoredMoments {
  DType m_dtype = DType::f32, v_dtype = DType::f32;
  std::vector<fs::path> m_files, v_files;
  std::vector<int64_t> starts;             // logical index of each file's first element, then the total
  std::vector<std::vector<float>> scales;  // e4m3 m: each file's block scales

  int64_t total() const { return starts.back(); }
  size_t file_of(int64_t x) const {  // x < total()
    return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), x) - starts.begin() - 1);
  }
  // Identifies the checkpoint block holding element x (< total()): {file, block within it}.
  std::pair<size_t, int64_t> block_of(int64_t x) const {
    const size_t f = file_of(x);
    return {f, (x - starts[f]) / kMomentBlock};
  }
  float scale_of(int64_t x) const {
    const auto [f, k] = block_of(x);
    return scales[f][static_cast<size_t>(k)];
  }
};

int64_t file_elements(const fs::path& f, DType dtype) {
  std::error_code ec;
  const auto bytes = static_cast<int64_t>(fs::file_size(f, ec));
  FP8T_CHECK(!ec, "checkpoint is missing {} ({})", f.string(), ec.message());
  const auto size = static_cast<int64_t>(dtype_size(dtype));
  FP8T_CHECK(bytes % size == 0, "{} holds {} bytes, not a whole number of {} values", f.string(), bytes,
             dtype_name(dtype));
  return bytes / size;
}

// optim_state.json's dtype of a moment: one the optimizer stores it in.
DType moment_dtype(const nlohmann::json& j, const char* key, std::initializer_list<DType> allowed,
                   const fs::path& file) {
  const std::string name = json_string(j, key, file);
  for (DType t : allowed)
    if (name == dtype_name(t)) return t;
  FP8T_FAIL("{}: key '{}' is \"{}\", not a dtype the optimizer stores that moment in: the file is damaged",
            file.string(), key, name.substr(0, 40));
}

StoredMoments stored_moments(const fs::path& dir, int files) {
  StoredMoments st;
  if (const fs::path file = dir / kStateFile; fs::exists(file)) {
    const nlohmann::json j = read_json_object(file);
    st.m_dtype = moment_dtype(j, "m", {DType::f32, DType::bf16, DType::e4m3}, file);
    st.v_dtype = moment_dtype(j, "v", {DType::f32, DType::bf16}, file);
    if (st.m_dtype == DType::e4m3) {
      const int64_t block = json_int(j, "m_block", 1, INT64_MAX, file);
      FP8T_CHECK(block == kMomentBlock, "{}: fp8 first moment in blocks of {} elements, this build uses {}",
                 file.string(), block, kMomentBlock);
    }
  }
  st.starts.push_back(0);
  for (int r = 0; r < files; ++r) {
    st.m_files.push_back(dir / fmt::format("optim_rank{}.bin", r));
    st.v_files.push_back(dir / fmt::format("optim_v_rank{}.bin", r));
    const int64_t n = file_elements(st.m_files.back(), st.m_dtype);
    FP8T_CHECK(file_elements(st.v_files.back(), st.v_dtype) == n, "{} and {} hold different element counts",
               st.m_files.back().string(), st.v_files.back().string());
    st.starts.push_back(st.starts.back() + n);
    if (st.m_dtype != DType::e4m3) continue;
    const fs::path sf = dir / fmt::format("optim_mscale_rank{}.bin", r);
    FP8T_CHECK(file_elements(sf, DType::f32) == moment_blocks(n), "{} holds {} block scales, {} has {} blocks",
               sf.string(), file_elements(sf, DType::f32), st.m_files.back().string(), moment_blocks(n));
    Tensor t = Tensor::empty({moment_blocks(n)}, DType::f32, Device::cpu(), MemCategory::workspace);
    read_tensor_file(sf, t);
    st.scales.emplace_back(t.data<float>(), t.data<float>() + t.numel());
  }
  // Each rank's shard is the same size, and together (or the one stage-0 file) they cover model.bin:
  // a truncated or over-long file would otherwise load as zeros or be cut silently.
  for (int r = 1; r < files; ++r)
    FP8T_CHECK(st.starts[r + 1] - st.starts[r] == st.starts[1],
               "{} holds {} elements but {} holds {}: every rank's optimizer shard is the same size (a truncated "
               "or over-long file?)", st.m_files[r].string(), st.starts[r + 1] - st.starts[r],
               st.m_files[0].string(), st.starts[1]);
  std::error_code ec;
  if (const auto model_bytes = fs::file_size(dir / "model.bin", ec); !ec)
    FP8T_CHECK(st.total() * 4 == static_cast<int64_t>(model_bytes),
               "the optimizer files of {} hold {} elements per moment but model.bin holds {} values: a truncated "
               "or over-long optimizer file", dir.string(), st.total(), model_bytes / 4);
  return st;
}

// Elements [begin, end) of the logical vector stored as `files` in rank order, as a host tensor of
// `dtype`; elements past the end (padding of a smaller world) are zero.
Tensor read_logical_range(const std::vector<fs::path>& files, const std::vector<int64_t>& starts, DType dtype,
                          int64_t begin, int64_t end) {
  Tensor host = Tensor::zeros({end - begin}, dtype, Device::cpu(), MemCategory::workspace);
  const auto size = static_cast<int64_t>(dtype_size(dtype));
  for (size_t f = 0; f < files.size(); ++f) {
    const int64_t b = std::max(begin, starts[f]), e = std::min(end, starts[f + 1]);
    if (b >= e) continue;
    std::ifstream in(files[f], std::ios::binary);
    in.seekg(static_cast<std::streamoff>((b - starts[f]) * size));
    in.read(static_cast<char*>(host.raw()) + (b - begin) * size, static_cast<std::streamsize>((e - b) * size));
    FP8T_CHECK(in.good(), "could not read {} elements at {} of {}", e - b, b - starts[f], files[f].string());
  }
  return host;
}

// The checkpoint's m over [begin, end) as f32 values (e4m3 codes times their block's scale).
std::vector<float> decode_m(const StoredMoments& st, int64_t begin, int64_t end) {
  const Tensor raw = read_logical_range(st.m_files, st.starts, st.m_dtype, begin, end);
  if (st.m_dtype != DType::e4m3) return raw.to_float_vector();
  std::vector<float> out(static_cast<size_t>(end - begin), 0.0f);
  for (int64_t x = begin; x < std::min(end, st.total()); ++x)
    out[x - begin] = f32_mul(fp8_to_float(raw.data<uint8_t>()[x - begin], Fp8Format::e4m3), st.scale_of(x));
  return out;
}

// fp8 into fp8: codes and v as stored; each of opt's blocks takes the scale of the checkpoint block it
// lies in, so its values are exactly the checkpoint's. A block that straddles checkpoint blocks (another
// world size or ZeRO stage, shards not multiples of kMomentBlock) is re-quantized from those values.
// Returns the number of re-quantized blocks.
int64_t load_fp8_moments(const StoredMoments& st, AdamW& opt) {
  const int64_t begin = opt.begin(), end = opt.end(), total = st.total();
  Tensor codes = read_logical_range(st.m_files, st.starts, DType::e4m3, begin, end);
  Tensor scales = Tensor::zeros(opt.m_scale().shape(), DType::f32, Device::cpu(), MemCategory::workspace);
  uint8_t* c = codes.data<uint8_t>();
  int64_t requantized = 0;
  for (int64_t k = 0; k < scales.numel(); ++k) {
    const int64_t x = begin + k * kMomentBlock, hi = std::min({x + kMomentBlock, end, total});
    if (x >= hi) continue;  // past the checkpoint's end: zeros
    if (st.block_of(x) == st.block_of(hi - 1)) {
      scales.data<float>()[k] = st.scale_of(x);
      continue;
    }
    float values[kMomentBlock] = {};
    for (int64_t i = x; i < hi; ++i)
      values[i - x] = f32_mul(fp8_to_float(c[i - begin], Fp8Format::e4m3), st.scale_of(i));
    const int64_t n = std::min(x + kMomentBlock, end) - x;
    quantize_moment_blocks(values, n, c + (x - begin), scales.data<float>() + k);
    ++requantized;
  }
  opt.m().copy_from(codes);
  opt.m_scale().copy_from(scales);
  opt.v().copy_from(read_logical_range(st.v_files, st.starts, st.v_dtype, begin, end));
  return requantized;
}

}  // namespace

void save_optimizer_state(const fs::path& dir, const Communicator& comm, int zero_stage, AdamW& opt) {
  if (zero_stage == 0 && comm.rank() != 0) return;  // identical on every rank
  write_tensor_file(dir / fmt::format("optim_rank{}.bin", comm.rank()), opt.m());
  write_tensor_file(dir / fmt::format("optim_v_rank{}.bin", comm.rank()), opt.v());
  if (opt.state_dtype() == StateDtype::fp8)
    write_tensor_file(dir / fmt::format("optim_mscale_rank{}.bin", comm.rank()), opt.m_scale());
  if (comm.rank() != 0) return;
  const nlohmann::json j = {{"m", dtype_name(opt.m().dtype())}, {"v", dtype_name(opt.v().dtype())},
                            {"m_block", kMomentBlock}};
  write_checkpoint_text(dir / kStateFile, j.dump(2) + "\n");
}

std::string load_optimizer_state(const fs::path& dir, int ckpt_world, int ckpt_zero_stage, AdamW& opt) {
  const StoredMoments st = stored_moments(dir, ckpt_zero_stage == 0 ? 1 : ckpt_world);
  const int64_t begin = opt.begin(), end = opt.end();
  const std::string written = fmt::format("{} (written by {} rank(s) at ZeRO stage {})", dir.string(), ckpt_world,
                                          ckpt_zero_stage);
  if (st.m_dtype == opt.m().dtype() && st.v_dtype == opt.v().dtype()) {
    if (st.m_dtype != DType::e4m3) {  // element-wise state: any range of the logical vector, exactly
      opt.m().copy_from(read_logical_range(st.m_files, st.starts, st.m_dtype, begin, end));
      opt.v().copy_from(read_logical_range(st.v_files, st.starts, st.v_dtype, begin, end));
      return "";
    }
    const int64_t requantized = load_fp8_moments(st, opt);
    if (requantized == 0) return "";
    return fmt::format("optimizer state of {}: {} of {} fp8 first-moment blocks of elements [{}, {}) straddle the "
                       "checkpoint's {}-element blocks and were re-quantized (resume with the checkpoint's ranks "
                       "and ZeRO stage to restore them exactly)",
                       written, requantized, opt.m_scale().numel(), begin, end, kMomentBlock);
  }
  const std::vector<float> m = decode_m(st, begin, end);
  const std::vector<float> v = read_logical_range(st.v_files, st.starts, st.v_dtype, begin, end).to_float_vector();
  opt.set_moments(m, v);
  return fmt::format("optimizer state of {}: moments converted from m {} / v {} to this run's "
                     "optim.state_dtype, m {} / v {}",
                     written, dtype_name(st.m_dtype), dtype_name(st.v_dtype), dtype_name(opt.m().dtype()),
                     dtype_name(opt.v().dtype()));
}

}  // namespace fp8t
