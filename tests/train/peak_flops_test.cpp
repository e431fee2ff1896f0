// MFU's peak table (train/peak_flops.h): device names as the CUDA runtime gives them, each compute mode,
// run.peak_tflops overriding the table and enabling MFU on the CPU, and no MFU for an unknown device.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "nn/gpt.h"
#include "train/peak_flops.h"
#include "train/trainer.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

TEST_CASE("train: the MFU peak table matches H100 - H200 and A100 names per compute mode", "[train][mfu]") {
  for (const char* name : {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "nvidia h200"}) {
    INFO(name);
    CHECK(peak_flops(name, ComputeMode::bf16).tflops == 989.4);
    CHECK(peak_flops(name, ComputeMode::fp8).tflops == 1978.9);
    CHECK(peak_flops(name, ComputeMode::fp32).tflops == 494.7);  // TF32
  }
  CHECK(peak_flops("NVIDIA H100 PCIe", ComputeMode::bf16).tflops == 756);
  CHECK(peak_flops("NVIDIA H100 PCIe", ComputeMode::fp8).tflops == 1513);
  CHECK(peak_flops("NVIDIA H100 PCIe", ComputeMode::fp32).tflops == 378);
  CHECK_THAT(peak_flops("NVIDIA H100 PCIe", ComputeMode::fp8).about,
             ContainsSubstring("the dense FP8 peak of H100 PCIe (NVIDIA H100 PCIe)"));
  for (const char* name : {"NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"}) {
    INFO(name);
    CHECK(peak_flops(name, ComputeMode::bf16).tflops == 312);
    CHECK(peak_flops(name, ComputeMode::fp32).tflops == 156);
    const PeakFlops fp8 = peak_flops(name, ComputeMode::fp8);  // no FP8 tensor cores: the BF16 peak, said so
    CHECK(fp8.tflops == 312);
    CHECK_THAT(fp8.about, ContainsSubstring("no FP8 tensor cores, so MFU is against its BF16 peak"));
  }
}

TEST_CASE("train: MFU's peak is unknown off the table unless run.peak_tflops sets it", "[train][mfu]") {
  for (const char* name : {"NVIDIA H100 NVL", "Tesla V100-SXM2-16GB", "cpu", ""}) {
    INFO(name);
    const PeakFlops p = peak_flops(name, ComputeMode::bf16);
    CHECK(p.tflops == 0);
    CHECK_THAT(p.about, ContainsSubstring("not in the peak table") && ContainsSubstring("set run.peak_tflops"));
  }
  CHECK(peak_flops("cpu", ComputeMode::fp32, 0.5).tflops == 0.5);
  const PeakFlops over = peak_flops("NVIDIA H200", ComputeMode::fp8, 1500);  // the override beats the table
  CHECK(over.tflops == 1500);
  CHECK(over.about == "1500 TFLOP/s (run.peak_tflops)");
  CHECK(device_name(Device::cpu()) == "cpu");

  CHECK(parse_config("", "t.yaml").run.peak_tflops == 0);
  CHECK(parse_config("run: {peak_tflops: 2.5}", "t.yaml").run.peak_tflops == 2.5);
  CHECK_THROWS_WITH(parse_config("run: {peak_tflops: -1}", "t.yaml"), ContainsSubstring("run.peak_tflops"));
}

TEST_CASE("train: run.peak_tflops gives a CPU run MFU in metrics.jsonl and the step line", "[train][mfu]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_mfu_{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root / "data");
  std::vector<uint16_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i * 7 % 50);
  write_shard((root / "data" / "train_000000.bin").string(), toks);
  auto comm = make_single_communicator();
  for (const double peak : {0.0, 0.001}) {
    INFO("run.peak_tflops " << peak);
    const std::string name = peak > 0 ? "with" : "without";
    const Config cfg = parse_config(fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu, peak_tflops: {2}}}
model: {{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin}}
train: {{micro_batch: 2, max_steps: 3, checkpoint_every: -1}}
)",
                                                name, root.string(), peak),
                                    name + ".yaml");
    train(cfg, *comm);
    const double flops_per_token = GPT(cfg.model, Device::cpu(), DType::f32).flops_per_token();
    std::ifstream in(root / name / "metrics.jsonl");
    int rows = 0;
    for (std::string line; std::getline(in, line); ++rows) {
      const auto j = nlohmann::json::parse(line);
      REQUIRE(j.contains("mfu") == (peak > 0));
      if (peak > 0)
        CHECK(std::abs(j["mfu"].get<double>() - flops_per_token * j["tokens_per_s"].get<double>() / (peak * 1e12)) <=
              1e-9 * j["mfu"].get<double>());
    }
    CHECK(rows == 3);
    std::ifstream log(root / name / "log.txt");
    const std::string text{std::istreambuf_iterator<char>(log), {}};
    CHECK((text.find("| MFU ") != std::string::npos) == (peak > 0));
    if (peak > 0) CHECK_THAT(text, ContainsSubstring("MFU against 0.001 TFLOP/s (run.peak_tflops)"));
  }
  fs::remove_all(root);
}
