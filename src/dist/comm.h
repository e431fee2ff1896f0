// Communicator: the collectives the trainer needs, behind one interface (NCCL on GPU, MPI on CPU,
// or a single process). All operate in place on f32 tensors of the communicator's device.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fp8t {

enum class ReduceOp { sum, max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi", "tcp", "nccl"
  // t = op over ranks of t.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
  // out (n) = op over ranks of in[rank*n, (rank+1)*n); in has size()*n elements.
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  // out (size()*n) = concatenation of every rank's in (n).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  virtual void broadcast(Tensor& t, int root) = 0;
  // In place, any dtype: rank r contributes elements [cuts[r], cuts[r + 1]) of t (size() + 1 cuts, ascending)
  // and every rank receives all of t. By default one broadcast per rank with a non-empty part (NCCL: one
  // group of them).
  virtual void all_gather_v(Tensor& t, const std::vector<int64_t>& cuts);
  virtual void barrier() = 0;
  // t on `root` = op over ranks of t; t on other ranks is left unspecified. ZeRO stage 2 reduces
  // each gradient bucket to the rank that owns it. The default all-reduces (correct, not lean).
  virtual void reduce(Tensor& t, ReduceOp op, int root) {
    (void)root;
    all_reduce(t, op);
  }
  // A collective that has not completed after `seconds` ends every rank with a message naming the
  // rank and the operation (a peer probably died). Values <= 0 wait forever.
  virtual void set_timeout(double seconds) { (void)seconds; }
  // Orders every collective issued so far before later work on the compute stream. Collectives
  // may return before completing where the backend is asynchronous (NCCL's reduce); the others
  // complete (or are stream-ordered) on return.
  virtual void synchronize() {}
  // The collectives issued so far, as a count. wait(ticket) orders later compute-stream work after
  // collective number `ticket` and every one before it, not after those issued since (synchronize()
  // waits for all): ZeRO-2 retires an old bucket's reduction while newer ones still run. No-ops
  // where collectives complete or are stream-ordered on return.
  virtual uint64_t ticket() { return 0; }
  virtual void wait(uint64_t ticket) { (void)ticket; }

 protected:
  // all_gather_v's argument checks.
  void check_gather_cuts(const Tensor& t, const std::vector<int64_t>& cuts) const;
};

// A communicator of one rank: every collective is the identity (copies where in != out).
std::unique_ptr<Communicator> make_single_communicator();

// Rank `rank` of `world` with no other rank behind it: rank() and size() answer as that rank would, and every
// collective leaves its tensors as they are. For sizing or writing one rank's part alone (the planner's view of
// rank 0 of a run on `world` GPUs; tests of one rank's checkpoint files).
std::unique_ptr<Communicator> make_standin_communicator(int rank, int world);

// The MPI communicator over MPI_COMM_WORLD (CPU tensors). Initialises MPI on first use (finalised
// at exit) unless the caller already did. Only in builds with MPI (FP8T_HAVE_MPI).
std::unique_ptr<Communicator> make_mpi_communicator();

// The TCP communicator (CPU tensors) for ranks started without MPI (plain srun): rank 0 publishes its
// address in the `rendezvous` file (on a file system every rank sees), the others connect to it
// within `timeout_s`; every collective then runs through rank 0.
std::unique_ptr<Communicator> make_tcp_communicator(int rank, int world, const std::filesystem::path& rendezvous,
                                                    double timeout_s);

#ifdef FP8T_HAVE_NCCL
// The NCCL communicator (CUDA tensors of `device`; dist/nccl_comm_cuda.cpp). `share_id` makes rank 0's
// unique id bytes every rank's (over MPI or a file; nothing to do for one rank).
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world, int device, double timeout_s,
                                                     const std::function<void(std::span<char>)>& share_id);
#endif

}  // namespace fp8t
