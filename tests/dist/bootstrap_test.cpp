// Launcher detection from the environment: mpirun (Open MPI, PMI), srun --mpi=pmix, plain srun.
#include <catch2/catch_test_macros.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist/bootstrap.h"

using namespace fp8t;

namespace {
// Sets variables for the scope and removes every launcher variable around it.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    clear();
    for (auto [k, v] : vars) ::setenv(k, v, 1);
  }
  ~Env() { clear(); }

 private:
  static void clear() {
    for (const char* k : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_SIZE",
                          "PMI_RANK", "PMIX_RANK", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
                          "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS"})
      ::unsetenv(k);
  }
};
}  // namespace

TEST_CASE("dist: no launcher means one process", "[dist]") {
  Env e({});
  const ProcessInfo p = detect_process();
  CHECK(p.world == 1);
  CHECK(p.rank == 0);
  CHECK(std::string(p.launcher) == "single");
}

TEST_CASE("dist: mpirun ranks come from Open MPI's variables", "[dist]") {
  Env e({{"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_RANK", "11"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}});
  const ProcessInfo p = detect_process();
  CHECK(std::string(p.launcher) == "mpi");
  CHECK(p.world == 16);
  CHECK(p.rank == 11);
  CHECK(p.local_rank == 3);
}

TEST_CASE("dist: srun --mpi=pmix takes the world size from Slurm", "[dist]") {
  Env e({{"PMIX_RANK", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}});
  const ProcessInfo p = detect_process();
  CHECK(std::string(p.launcher) == "mpi");
  CHECK(p.world == 8);
  CHECK(p.rank == 5);
  CHECK(p.local_rank == 1);
}

TEST_CASE("dist: plain srun is detected from the Slurm step's variables", "[dist]") {
  Env e({{"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "1"}});
  const ProcessInfo p = detect_process();
  CHECK(std::string(p.launcher) == "slurm");
  CHECK(p.world == 4);
  CHECK(p.rank == 2);
  CHECK(p.local_rank == 1);
}

TEST_CASE("dist: a step smaller than the allocation is as large as the step", "[dist]") {
  // srun -n 2 inside a 4-task allocation: srun sets both to the step's count; the step's wins.
  Env e({{"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}});
  const ProcessInfo p = detect_process();
  CHECK(std::string(p.launcher) == "slurm");
  CHECK(p.world == 2);
}

TEST_CASE("dist: a batch script is one process whatever its allocation", "[dist]") {
  // sbatch -n 2: the batch step has SLURM_PROCID 0 and SLURM_NTASKS 2 but is no step of srun's.
  Env e({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}});
  const ProcessInfo p = detect_process();
  CHECK(std::string(p.launcher) == "single");
  CHECK(p.world == 1);
}
