// Catch2 main for tests run under mpirun: every rank runs the whole session; rank 0 reports,
// the other ranks' reports are printed only when they fail; the exit code is non-zero if any
// rank failed.
#include <mpi.h>

#include <catch2/catch_session.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <unistd.h>

int main(int argc, char** argv) {
  int provided = 0, rank = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  std::string quiet_report;
  if (rc == 0) {
    if (rank != 0) {
      quiet_report = "/tmp/fp8t_mpi_tests_" + std::to_string(::getpid()) + "_rank" + std::to_string(rank) + ".txt";
      session.configData().defaultOutputFilename = quiet_report;
    }
    rc = session.run();
  }
  if (!quiet_report.empty()) {
    if (rc != 0) {
      std::ifstream in(quiet_report);
      std::stringstream ss;
      ss << in.rdbuf();
      std::cerr << "---- rank " << rank << " report ----\n" << ss.str() << std::flush;
    }
    std::remove(quiet_report.c_str());
  }
  int failed = rc != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
