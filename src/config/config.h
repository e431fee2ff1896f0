// Run configuration: one small struct per subsystem, filled from YAML in one place (config.cpp).
// Unknown keys, wrong types and out-of-range values are errors naming the file, line and key.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace fp8t {

struct RunConfig {
  std::string name = "run";          // shown in logs
  std::string out_dir = "runs/run";  // run directory: config.yaml, log.txt, metrics.jsonl, checkpoints/
  uint64_t seed = 1337;              // parameter init and data order
  Device device = Device::cpu();     // "cpu" or "cuda" (the local rank picks the GPU index)
  int log_every = 1;                 // console/log line every N steps (metrics.jsonl gets every step)
  bool gemm_autotune = true;         // CUDA: time cuBLASLt's candidate algorithms per GEMM shape, keep the fastest
  double memory_limit_gib = 0;       // CUDA: cap the device memory pool at this many GiB (0: the whole card)
  double peak_tflops = 0;            // MFU's peak per rank, dense TFLOP/s (0: the device table; on CPU: no MFU)
};

struct ModelConfig {
  std::string arch = "gpt2";  // only gpt2 for now
  int n_layer = 12;
  int n_head = 12;
  int d_model = 768;         // must divide by n_head
  int vocab_size = 50257;    // real vocabulary; the embedding is padded to a multiple of 128
  int seq_len = 1024;        // context length T
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  // As GPT::num_parameters counts them (padded vocabulary rows excluded); INT64_MAX when the count
  // does not fit in 64 bits (a loaded config never gets there: see the cross-field checks).
  int64_t parameter_count() const;
};

// One validation set: every evaluation reports its loss under `name`.
struct ValSet {
  std::string name;  // letters, digits, '_', '-', '.'; unique within data.val
  std::string glob;  // llm.c-format token shards
  bool operator==(const ValSet&) const = default;
};

struct DataConfig {
  std::string train;  // glob of llm.c-format token shards, e.g. data/brown/train_*.bin
  // Validation sets, evaluated in order; the first is the one logged as val_loss. YAML forms:
  // "" (none), one glob (named "val"), a list of globs (each named after its glob, see
  // val_set_name()), or a map name -> glob, e.g. {val: d/val_*.bin, sotu: d/sotu_val_*.bin}.
  std::vector<ValSet> val;
  // Shuffle the training stream from run.seed: shard order and the order of B*T windows within
  // each shard, afresh each epoch. false = file order, every epoch the same. Evaluation is never
  // shuffled, so every evaluation sees the same tokens.
  bool shuffle = true;
};

// The name data.val's list form gives a glob: its file name cut at the first wildcard (* ? [)
// or else at the last '.', with trailing '_', '-', '.' dropped; when that leaves nothing, the
// parent directory's name. data/medium/sotu_val_*.bin -> sotu_val, d/val_*.bin -> val,
// d/val_000000.bin -> val_000000, data/sotu/*.bin -> sotu. "" when no name can be derived.
std::string val_set_name(const std::string& glob);

// What the forward pass keeps for backward: none = everything ops save; layernorm = LayerNorm outputs
// are released after their consumers ran and recomputed in backward (a LayerNorm forward per
// LayerNorm: 2 of ~32 bytes per channel and token saved, per layer, in BF16); block = only block
// inputs, the whole block recomputed.
enum class Recompute { none, block, layernorm };

struct TrainConfig {
  int micro_batch = 8;             // sequences per rank per forward/backward; `auto` (0): the largest that
                                   // fits (resolve_micro_batch, train/planner.h)
  int64_t total_batch_tokens = 0;  // tokens per optimizer step over all ranks; 0 = one micro-batch each
  int max_steps = 100;             // optimizer steps
  int eval_every = 0;              // 0 = evaluate only before the first and after the last step
  int eval_steps = 10;             // validation micro-batches per evaluation
  int checkpoint_every = 0;        // 0 = only at the end; -1 = never (benchmarks)
  Recompute recompute = Recompute::none;  // see Recompute
  bool skip_nonfinite_steps = false;      // skip an optimizer step with NaN/Inf instead of stopping
  int max_skipped_steps = 5;              // with skip_nonfinite_steps: stop after this many skips in a row
  // CUDA, one rank: from the second step on, each micro-step's forward and backward is replayed as a CUDA graph
  // captured once (core/graph_capture.h), which removes the host's launches and the gaps between kernels.
  bool cuda_graph = false;
  // A run or checkpoint directory (e.g. from `fp8train import`) whose weights a new run starts from: step 0,
  // fresh optimizer and FP8 state; its model must be this config's. "": the seeded init. --resume wins over it.
  std::string init_from;
};

enum class Schedule { cosine, linear, constant };

// How AdamW stores its moments m and v (the update itself always runs in f32): fp32 = both f32
// (8 bytes per parameter); bf16 = both bf16 (4 bytes); fp8 = m as E4M3 codes with one f32 scale per
// 128 consecutive elements of the optimizer's range, v bf16 (3 bytes + 4/128). Moments stored in bf16
// round stochastically from a hash of (step, element index), the same bits on every backend; E4M3
// codes round to nearest even.
struct OptimConfig {
  double lr = 6e-4;            // peak learning rate
  double min_lr_ratio = 0.1;   // final lr = lr * min_lr_ratio
  int warmup_steps = 0;        // linear warmup from lr/warmup_steps
  Schedule schedule = Schedule::cosine;
  double beta1 = 0.9;          // YAML: betas: [beta1, beta2]
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   // not applied to biases, LayerNorm parameters
  double grad_clip = 1.0;      // global-norm clip; 0 disables
  StateDtype state_dtype = StateDtype::fp32;  // storage of the moments: fp32 | bf16 | fp8
};

enum class ComputeMode { fp32, bf16, fp8 };
enum class Fp8Formats { hybrid, e4m3 };  // hybrid: E4M3 forward, E5M2 gradients
enum class Fp8Scaling { delayed, current };
enum class AmaxAlgo { max, most_recent };
// What FP8 blocks keep for backward: fp8 = the FP8 linears' inputs as E4M3 codes; fp8_all = every saved
// tensor FP8 or recomputed: attention's qkv and the GELU input as codes (fp8/saved.h), attention's output
// once (the projection's codes serve attention's backward too), the LayerNorm-fused and GELU-fused
// linears' input codes cast again in backward; only the block input and the post-attention residual stay
// in the compute dtype (the FP8 configs' default); bf16 = the linears' inputs in the compute dtype.
enum class ActivationStorage { fp8, bf16, fp8_all };

struct Fp8Config {
  Fp8Formats format = Fp8Formats::hybrid;
  Fp8Scaling scaling = Fp8Scaling::delayed;
  int amax_history_len = 16;        // >= 1
  AmaxAlgo amax_compute_algo = AmaxAlgo::max;
  int margin = 0;                   // scale = (fmax / amax) / 2^margin
  std::vector<std::string> layers = {"qkv", "proj", "fc", "fc2"};  // subset of qkv proj fc fc2 lm_head
  int bf16_first_blocks = 0;        // keep the first N blocks in BF16
  int bf16_last_blocks = 0;         // keep the last N blocks in BF16
  ActivationStorage activation_storage = ActivationStorage::fp8;
  bool reduce_amax = true;          // all-reduce (max) amax over data-parallel ranks
  int monitor_every = 100;          // FP8-vs-master weight error in metrics every N steps; 0 = never
  // The FP8 GEMMs that use cuBLASLt's fast accumulation (the tensor cores' partial sums not promoted to f32 along
  // K): a subset of forward, dgrad, wgrad. The default is all three, where Transformer Engine keeps forward only: dgrad
  // took 2.6-3.0% off the 1.5B FP8 step and wgrad another 0.8-1.7%, and the 124M convergence run (wgrad's K 32,768
  // tokens) ended within 0.2% of forward only (docs/perf-notes.md, thirty-seventh and thirty-eighth sessions). CUDA
  // only: the CPU path sums in f32 either way.
  std::vector<std::string> fast_accum = {"forward", "dgrad", "wgrad"};
  bool fast_accum_in(std::string_view gemm) const {
    return std::find(fast_accum.begin(), fast_accum.end(), gemm) != fast_accum.end();
  }
};

// The dtype of the flat gradient buffer: auto = bf16 with compute fp8, else fp32. With bf16 every
// op adds its contribution to a parameter's gradient in f32 and rounds the sum to bf16 once (the
// GEMMs write bf16 with beta = 1, as llm.c does), so accumulation over micro-batches rounds once per
// micro-batch; the norm, clipping, AdamW and the ZeRO reductions read bf16.
enum class GradDtype { auto_, fp32, bf16 };

struct PrecisionConfig {
  ComputeMode compute = ComputeMode::fp32;
  GradDtype grad_dtype = GradDtype::auto_;
  Fp8Config fp8;
  bool bf16_grads() const {
    return grad_dtype == GradDtype::bf16 || (grad_dtype == GradDtype::auto_ && compute == ComputeMode::fp8);
  }
};

struct DistributedConfig {
  int zero_stage = 0;        // 0, 1 or 2
  double bucket_mb = 25;     // gradient bucket size for reduction (MiB of f32); stage 2 stages whole parameters in it
  double timeout_s = 300;    // a collective that takes longer ends every rank with a message
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  PrecisionConfig precision;
  DistributedConfig distributed;
  std::string source;  // the file it came from ("<string>" for text)
  // Where each key that was set came from: "f.yaml, line 12" or "f.yaml: --set a.b=v".
  std::map<std::string, std::string, std::less<>> origins;

  std::string to_yaml() const;  // the resolved config, every key, loadable by load_config
  // "<origin>: <key>", or "<source>: <key>" for a key left at its default: how messages name a key.
  // A key below a set key (data.val.<set>) takes that key's origin.
  std::string where(std::string_view key) const;
};

// Loads `path`, applies overrides "a.b=value" (each must name an existing key), validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text; `source` names it in error messages. Unlike a file, empty text is allowed
// and gives the defaults.
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});

// What `fp8train train` needs beyond a valid config, checked before anything is built: data.train
// is set and every data glob matches files; run.out_dir is (or can be made) a writable directory,
// created here; a CPU run's model state fits in host memory. Throws Error naming the key and the
// path. Returns warnings for rank 0 to print (a data.val set that reads data.train's shards).
std::vector<std::string> check_run_inputs(const Config& cfg);

// A CUDA run.device needs a CUDA device this process can use: else an Error naming run.device's file and line,
// why (no driver, no device visible, a build without CUDA) and what to do. It also needs precision.compute bf16
// or fp8 (the CUDA kernels take bf16 activations): fp32 there is an Error naming that key, checked first.
// check_run_inputs calls it first; `fp8train plan`, which measures on the configured device, too.
void check_device(const Config& cfg);

}  // namespace fp8t
