// libFuzzer harness: the input is one token shard file; read_shard and ShardLoader must either
// refuse it with fp8t::Error or serve batches whose tokens are the file's, in order within a window.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = (fp8t::fuzz::scratch_dir() / "train_000000.bin").string();
  fp8t::fuzz::write_bytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
  // Loader geometry from the size, so one input always meets the same loader.
  const int B = 1 + static_cast<int>(size % 2);
  const int T = 1 + static_cast<int>(size / 2 % 5);
  const int world = 1 + static_cast<int>(size / 10 % 3);
  const int rank = static_cast<int>(size / 30 % world);
  const uint64_t seed = size % 3;
  fp8t::fuzz::expect_clean_refusal([&] {
    const std::vector<uint16_t> tokens = fp8t::read_shard(path);
    fp8t::ShardLoader loader(path, B, T, rank, world, seed);
    std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
    for (int step = 0; step < 4; ++step) {
      loader.next_batch(inputs.data(), targets.data());
      for (size_t i = 0; i < inputs.size(); ++i) {
        FP8T_FUZZ_REQUIRE(inputs[i] >= 0 && inputs[i] <= 65535, "input token %d out of uint16", inputs[i]);
        if (i + 1 < inputs.size())
          FP8T_FUZZ_REQUIRE(targets[i] == inputs[i + 1], "target %zu is not the next input", i);
      }
    }
    FP8T_FUZZ_REQUIRE(loader.batches_per_epoch() >= 1, "a loader that serves has batches");
    (void)tokens;
  });
  return 0;
}
