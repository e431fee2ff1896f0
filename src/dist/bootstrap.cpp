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
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) {
    p.launcher = "mpi";
    // srun --mpi=pmix sets PMIX_RANK but no size variable: Slurm's task count is the world.
    p.world = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", env_int("SLURM_NTASKS", 1)));
    p.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", env_int("PMIX_RANK", 0)));
    p.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", env_int("SLURM_LOCALID", 0)));
  } else if (std::getenv("SLURM_PROCID") && env_int("SLURM_NTASKS", 1) > 1) {
    p.launcher = "slurm";
    p.world = env_int("SLURM_NTASKS", 1);
    p.rank = env_int("SLURM_PROCID", 0);
    p.local_rank = env_int("SLURM_LOCALID", 0);
  }
  return p;
}

#ifndef FP8T_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator() {
  FP8T_FAIL("launched under mpirun but this build has no MPI: install libopenmpi-dev and rebuild");
}
#endif

#ifdef FP8T_HAVE_NCCL
// dist/nccl_comm_cuda.cpp. `share_id` makes rank 0's bytes every rank's (over MPI or a file).
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world, int device, double timeout_s,
                                                     const std::function<void(std::span<char>)>& share_id);

namespace {
// Under srun without MPI: rank 0 writes the NCCL id to a file in the run directory (shared by the
// nodes) and the others poll for it. The name carries the Slurm job and step, so reruns don't
// pick up a stale id.
void share_id_through_file(std::span<char> id, const ProcessInfo& p, const Config& cfg) {
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  const std::filesystem::path dir = cfg.run.out_dir;
  std::filesystem::create_directories(dir);
  const auto path = dir / fmt::format(".nccl_id_{}_{}", job ? job : "0", step ? step : "0");
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
  FP8T_CHECK(mpi,
             "{} ranks under srun without MPI on {}: CPU runs need MPI; launch with srun --mpi=pmix (or mpirun), "
             "or train on CUDA, where srun alone suffices (NCCL)",
             p.world, cfg.run.device.str());
  return comm;
}

}  // namespace fp8t
