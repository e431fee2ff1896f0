// Bootstrap: who am I? Under mpirun rank/size/local rank come from MPI, under srun from the Slurm
// step's variables, otherwise (a batch script included) a single process. Creates the communicator
// the trainer uses.
#pragma once
#include <memory>

#include "config/config.h"
#include "dist/comm.h"

namespace fp8t {

struct ProcessInfo {
  int rank = 0, world = 1, local_rank = 0;
  const char* launcher = "single";  // "mpi", "slurm" or "single"
};

// Detects the launcher from the environment (without initialising anything).
ProcessInfo detect_process();

// Initialises the launcher's runtime (MPI_Init when under mpirun) and returns the communicator for
// `cfg.run.device`: NCCL on CUDA; on CPU MPI under an MPI launcher and TCP under plain srun (the ranks
// meet through a file in run.out_dir); single for one process. Sets cfg.run.device's index to the
// local rank on CUDA. Call once per process.
std::unique_ptr<Communicator> bootstrap(Config& cfg);

}  // namespace fp8t
