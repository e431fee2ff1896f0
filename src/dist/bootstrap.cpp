// Launcher detection and communicator creation.
#include "dist/bootstrap.h"

#include <cstdlib>
#include <string>

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
    p.world = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
    p.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", env_int("PMIX_RANK", 0)));
    p.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", 0));
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
#else
std::unique_ptr<Communicator> make_mpi_communicator();  // dist/mpi_comm_mpi.cpp
#endif

std::unique_ptr<Communicator> bootstrap(Config& cfg) {
  const ProcessInfo p = detect_process();
  if (cfg.run.device.is_cuda()) cfg.run.device.index = p.local_rank;
  if (p.world == 1) return make_single_communicator();
  FP8T_CHECK(std::string(p.launcher) == "mpi",
             "{} ranks under {}: multi-rank runs need mpirun (or srun --mpi=pmix)", p.world, p.launcher);
  return make_mpi_communicator();
}

}  // namespace fp8t
