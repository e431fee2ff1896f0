// Helpers of the tests that run under mpirun: the MPI communicator they use, one scratch directory per job
// that every rank names the same, and seeded random data every rank can make for every other.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fmt/format.h>
#include <memory>
#include <random>
#include <vector>

#include "dist/comm.h"

namespace fp8t::test {

// The MPI communicator with a 120 s timeout: a rank that failed a REQUIRE ends the job instead of hanging it.
inline std::unique_ptr<Communicator> mpi_comm() {
  auto comm = make_mpi_communicator();
  comm->set_timeout(120);
  return comm;
}

// fp8t_mpi_<what>_<pid> under the system's temporary directory, rank 0's pid for every rank of this job.
inline std::filesystem::path job_root(const char* what) {
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return std::filesystem::temp_directory_path() / fmt::format("fp8t_mpi_{}_{}", what, pid);
}

// n Normal(0, 1) values from `seed`: each rank makes every rank's data itself, the same on all of them.
inline std::vector<float> seeded_normal(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace fp8t::test
