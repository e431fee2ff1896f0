// The trainer's checkpoint writes and resumes (see run_checkpoint.h).
#include "train/run_checkpoint.h"

#include "dist/zero.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/import.h"
#include "train/optimizer_checkpoint.h"
#include "train/reshard.h"

namespace fp8t {

namespace fs = std::filesystem;

void save_run_checkpoint(const fs::path& run_dir, const Config& cfg, Communicator& comm, GPT& model, AdamW& optim,
                         const RunPosition& at, spdlog::logger& log) {
  const fs::path tmp = checkpoint_tmp_dir(run_dir, at.step);
  const Tensor master = gather_master(comm, model.params());  // a collective where the master is sharded
  if (comm.rank() == 0) {
    write_tensor_file(tmp / "model.bin", master);
    write_checkpoint_state(tmp, {at.step, comm.size(), cfg.distributed.zero_stage, at.tokens, cfg.to_yaml(),
                                 at.skipped_steps});
  }
  save_optimizer_state(tmp, comm, cfg.distributed.zero_stage, optim);
  if (model.fp8_enabled())  // per rank: without reduce_amax the ranks' scales differ
    write_checkpoint_text(tmp / fmt::format("fp8_rank{}.json", comm.rank()), model.fp8_state().dump());
  comm.barrier();  // every rank's files and digests are written: rank 0 adds manifest.json and renames
  if (comm.rank() == 0) {
    const fs::path dst = finalize_checkpoint(run_dir, at.step);
    log.info("checkpoint: {}", dst.string());
  }
  comm.barrier();
}

RunPosition restore_run_checkpoint(const fs::path& where, const Config& cfg, Communicator& comm, GPT& model,
                                   AdamW& optim, int64_t tokens_per_step, spdlog::logger& log) {
  std::string why;
  const auto dir = latest_checkpoint(where, &why);
  FP8T_CHECK(dir, "--resume {}: no complete checkpoint found: {}", where.string(), why);
  // Every file against the manifest first, then state.json's fields, then the model it describes.
  if (const std::string unverified = verify_checkpoint(*dir, CheckpointUse::resume); !unverified.empty())
    log.warn("{}", unverified);
  const CheckpointState s = read_checkpoint_state(*dir);
  const fs::path state_file = *dir / "state.json";
  const std::string differs = model_difference(parse_config(s.config_yaml, state_file.string()).model, cfg.model,
                                               "the checkpoint's state.json", "this run's config");
  FP8T_CHECK(differs.empty(), "--resume {}: the checkpoint holds another model than this run: {}. Resume with "
             "the config that wrote it (its run directory's config.yaml)", dir->string(), differs);
  FP8T_CHECK(s.step <= cfg.train.max_steps, "--resume {}: the checkpoint is at step {}, past this run's "
             "train.max_steps {}: raise train.max_steps to train on from it", dir->string(), s.step,
             cfg.train.max_steps);
  if (const auto r = reshard_line(*dir, s, comm.size(), cfg.distributed.zero_stage); !r.empty()) log.info(r);
  load_model_weights(*dir, s.world_size, model.params());
  if (weights_only_checkpoint(*dir))  // fp8train import's, like a Megatron release checkpoint
    log.info("checkpoint {} holds weights only (no optimizer files): AdamW moments start at zero", dir->string());
  else if (const std::string c = load_optimizer_state(*dir, s.world_size, s.zero_stage, optim); !c.empty())
    log.warn("{}", c);
  if (!weights_only_checkpoint(*dir))  // as stored, naming the file: a NaN moment would poison the first step
    check_finite_optimizer_state(*dir, s.zero_stage == 0 ? 1 : s.world_size, optim.begin(), optim.end(),
                                 model.params().specs());
  if (model.fp8_enabled()) {
    const ResumedFp8State fp8 = resumed_fp8_state(*dir, s.world_size, comm.rank(), comm.size(),
                                                  fp8_grad_amax_factor(s, comm.size(), tokens_per_step));
    if (!fp8.state.is_null()) {
      try {
        model.load_fp8_state(fp8.state);
      } catch (const Error& e) {
        FP8T_FAIL("{}: {}", fp8.source, e.what());
      }
    } else {
      log.warn("checkpoint {} has no FP8 scaling state: FP8 scales start fresh", dir->string());
    }
  }
  log.info("resumed from {} at step {}", dir->string(), s.step);
  return {s.step, s.skipped_steps, s.tokens};
}

}  // namespace fp8t
