// CUDA graphs of a training micro-step: what a capture needs from the rest of the library, and the graph itself.
//
// A micro-step's forward and backward queue the same kernels on the same addresses every step (the batch is
// copied into the same tensors, the FP8 scales live in one device arena, the gradients in one flat buffer), so
// they can be captured once and replayed: the host then launches one graph instead of ~60 kernels per layer,
// and the device runs them without the launch gaps between them. What a replay does not redo is the host code
// that queued them, so:
// - host state that the captured code changes (an FP8 amax to collect, a weight cache now current) is
//   registered with on_graph_replay() while capturing and set again at every replay;
// - memory handed out or given back during the capture belongs to the graph's private pool from then on
//   (Allocator::begin_graph_pool), never to code outside it, which could otherwise hold a block across a
//   replay that writes it;
// - copies and fills go on the compute stream (Tensor::zero_, copy_bytes), and nothing may read the device
//   from the host (an error names it).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

namespace fp8t {

// True while a StepGraph is capturing on this process's compute stream.
bool graph_capturing();
// While capturing: f runs again after every replay of the graph being captured (host state the captured code
// set). Outside a capture: nothing.
void on_graph_replay(std::function<void()> f);

// One captured micro-step (CUDA only: elsewhere capture() fails with the reason).
class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  // Captures what `work` queues on device d's compute stream, without running it, and instantiates the graph.
  // An error inside `work` or in the capture ends the capture and is thrown.
  void capture(Device d, const std::function<void()>& work);
  // Launches the graph on the compute stream, then redoes the host state registered during the capture and
  // raises the allocator's peaks to the capture's (the memory the graph's step held).
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8t
