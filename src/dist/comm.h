// Communicator: the collectives the trainer needs, behind one interface (NCCL on GPU, MPI on CPU,
// or a single process). All operate in place on f32 tensors of the communicator's device.
#pragma once
#include <memory>
#include <string>

#include "core/tensor.h"

namespace fp8t {

enum class ReduceOp { sum, max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi", "nccl"
  // t = op over ranks of t.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
  // out (n) = op over ranks of in[rank*n, (rank+1)*n); in has size()*n elements.
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  // out (size()*n) = concatenation of every rank's in (n).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
};

// A communicator of one rank: every collective is the identity (copies where in != out).
std::unique_ptr<Communicator> make_single_communicator();

}  // namespace fp8t
