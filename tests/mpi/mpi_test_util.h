// Helpers of the tests that run under mpirun: the MPI communicator they use, and one scratch directory
// per job that every rank names the same.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fmt/format.h>
#include <memory>

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

}  // namespace fp8t::test
