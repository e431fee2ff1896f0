// Launcher detection and communicator creation.
#include "dist/bootstrap.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <thread>

#include "core/check.h"

namespace fp8t {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}
}  // namespace

ProcessInfo detect_process() {
  ProcessInfo p;
  // Inside a Slurm job step srun sets SLURM_STEP_NUM_TASKS; a batch script (the batch step) has SLURM_PROCID
  // and SLURM_NTASKS of the whole allocation but no step variables, and runs as one process.
  const int step_tasks = env_int("SLURM_STEP_NUM_TASKS", 0);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) {
    p.launcher = "mpi";
    // srun --mpi=pmix sets PMIX_RANK but no size variable: Slurm's task count is the world.
    const int slurm_tasks = step_tasks > 0 ? step_tasks : env_int("SLURM_NTASKS", 1);
    p.world = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", slurm_tasks));
    p.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", env_int("PMIX_RANK", 0)));
    p.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", env_int("SLURM_LOCALID", 0)));
  } else if (std::getenv("SLURM_PROCID") && step_tasks > 1) {
    p.launcher = "slurm";
    p.world = step_tasks;
    p.rank = env_int("SLURM_PROCID", 0);
    p.local_rank = env_int("SLURM_LOCALID", 0);
  }
  return p;
}

namespace {
// The file through which ranks started by srun without MPI meet (the NCCL id on GPU, rank 0's address on
// CPU): in the run directory, which every node must share; the name carries the Slurm job and step, so a
// rerun does not pick up a stale one.
std::filesystem::path rendezvous_file(const Config& cfg, const char* what) {
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  return std::filesystem::path(cfg.run.out_dir) / fmt::format(".{}_{}_{}", what, job ? job : "0", step ? step : "0");
}
}  // namespace

#ifndef FP8T_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator() {
  FP8T_FAIL("launched under mpirun but this build has no MPI: install libopenmpi-dev and rebuild");
}
#endif

#ifdef FP8T_HAVE_NCCL
namespace {
// Under srun without MPI: rank 0 writes the NCCL id to the rendezvous file and the others poll for it.
void share_id_through_file(std::span<char> id, const ProcessInfo& p, const Config& cfg) {
  const auto path = rendezvous_file(cfg, "nccl_id");
  std::filesystem::create_directories(path.parent_path());
  if (p.rank == 0) {
    const auto tmp = path.string() + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.data(), static_cast<std::streamsize>(id.size()));
    std::filesystem::rename(tmp, path);  // atomic: readers never see half an id
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.distributed.timeout_s);
  while (!std::filesystem::exists(path)) {
    FP8T_CHECK(std::chrono::steady_clock::now() < deadline,
               "rank {}: rank 0's NCCL id {} did not appear within {} s; run.out_dir must be on a file system "
               "every node shares (or launch with srun --mpi=pmix)",
               p.rank, path.string(), cfg.distributed.timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ifstream(path, std::ios::binary).read(id.data(), static_cast<std::streamsize>(id.size()));
}
}  // namespace
#endif

std::unique_ptr<Communicator> bootstrap(Config& cfg) {
  const ProcessInfo p = detect_process();
  if (cfg.run.device.is_cuda()) cfg.run.device.index = p.local_rank;  // one GPU per process
  if (p.world == 1) return make_single_communicator();
  const bool mpi = std::string(p.launcher) == "mpi";
  if (p.rank == 0)
    fmt::print(stderr, "fp8train: {} ranks launched by {}; device {} per rank (local rank selects the GPU)\n",
               p.world, p.launcher, cfg.run.device.is_cuda() ? "cuda:<local rank>" : cfg.run.device.str());
  std::unique_ptr<Communicator> comm;
  if (mpi) {
    comm = make_mpi_communicator();
    comm->set_timeout(cfg.distributed.timeout_s);
    // An MPI without the launcher's PMI flavour starts every rank as a world of one (Debian's Open MPI
    // speaks PMIx, not PMI-2): each would train alone and all would write one run directory.
    FP8T_CHECK(comm->size() == p.world,
               "the launcher started {} ranks but MPI sees a world of {}: this MPI does not speak the launcher's "
               "PMI; under srun use --mpi=pmix (Open MPI), or plain srun without --mpi", p.world, comm->size());
  }
  if (cfg.run.device.is_cuda()) {
#ifdef FP8T_HAVE_NCCL
    std::function<void(std::span<char>)> share;
    if (mpi) {
      share = [&](std::span<char> id) {
        // The id is raw bytes; the MPI broadcast moves bytes whatever the tensor's dtype.
        Tensor t = Tensor::empty({static_cast<int64_t>((id.size() + 3) / 4)}, DType::f32, Device::cpu(),
                                 MemCategory::comm);
        std::memcpy(t.raw(), id.data(), id.size());
        comm->broadcast(t, 0);
        std::memcpy(id.data(), t.raw(), id.size());
      };
    } else {
      share = [&](std::span<char> id) { share_id_through_file(id, p, cfg); };
    }
    return make_nccl_communicator(p.rank, p.world, cfg.run.device.index, cfg.distributed.timeout_s, share);
#else
    FP8T_FAIL("{} ranks on CUDA need NCCL, and this build has none: install NCCL (libnccl-dev) and rebuild",
              p.world);
#endif
  }
  // CPU ranks from plain srun: the CPU counterpart of the NCCL-id file, collectives over TCP.
  if (!mpi) return make_tcp_communicator(p.rank, p.world, rendezvous_file(cfg, "tcp"), cfg.distributed.timeout_s);
  return comm;
}

}  // namespace fp8t
