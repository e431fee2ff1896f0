// StepGraph (core/graph_capture.h): stream capture of a micro-step and its replays.
#include "core/graph_capture.h"

#include <exception>
#include <string>
#include <utility>

#include "core/check.h"
#ifdef FP8T_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "kernels/stream.cuh"
#endif

namespace fp8t {

namespace {
// The replay actions of the capture in progress (one at a time: captures are not nested).
std::vector<std::function<void()>>* g_replay_actions = nullptr;
}  // namespace

bool graph_capturing() { return g_replay_actions != nullptr; }

void on_graph_replay(std::function<void()> f) {
  if (g_replay_actions) g_replay_actions->push_back(std::move(f));
}

struct StepGraph::Impl {
  Device device = Device::cpu();
  std::vector<std::function<void()>> replay_actions;
  MemoryStats at_capture;  // the allocator's peaks over the captured micro-step
#ifdef FP8T_HAVE_CUDA
  cudaGraphExec_t exec = nullptr;
#endif
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}

StepGraph::~StepGraph() {
#ifdef FP8T_HAVE_CUDA
  if (impl_->exec) (void)cudaGraphExecDestroy(impl_->exec);
#endif
}

#ifdef FP8T_HAVE_CUDA
void StepGraph::capture(Device d, const std::function<void()>& work) {
  FP8T_CHECK(d.is_cuda(), "a CUDA graph of the step needs a CUDA device, not {}", d.str());
  FP8T_CHECK(!graph_capturing(), "StepGraph::capture inside another capture");
  FP8T_CHECK(!impl_->exec, "StepGraph::capture: this graph was captured already");
  Allocator& alloc = allocator_for(d);
  const cudaStream_t stream = kernels::compute_stream();
  // Everything queued so far runs before the capture: its work is not the graph's.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::function<void()>> actions;
  alloc.reset_peaks();
  alloc.begin_graph_pool();
  g_replay_actions = &actions;
  // Relaxed: the allocator may still call cudaMalloc for a block the warm-up step did not need.
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  std::string failed;  // what went wrong inside the capture: the step, or an operation a capture does not allow
  try {
    work();
  } catch (const std::exception& e) {
    failed = e.what();
  } catch (...) {
    failed = "an unknown error";
  }
  g_replay_actions = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  alloc.end_graph_pool();
  if (!failed.empty()) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    FP8T_FAIL("capturing the training step as a CUDA graph (train.cuda_graph) failed: {}. Set train.cuda_graph: "
              "false to run without it", failed);
  }
  FP8T_CHECK(end == cudaSuccess && graph, "capturing the training step as a CUDA graph failed: {} (some op in the "
             "step is not capturable); set train.cuda_graph: false", cudaGetErrorString(end));
  const cudaError_t inst = cudaGraphInstantiate(&impl_->exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  FP8T_CHECK(inst == cudaSuccess, "instantiating the training step's CUDA graph failed: {}; set "
             "train.cuda_graph: false", cudaGetErrorString(inst));
  impl_->device = d;
  impl_->replay_actions = std::move(actions);
  impl_->at_capture = alloc.stats();
}

void StepGraph::replay() {
  FP8T_CHECK(impl_->exec, "StepGraph::replay before capture");
  CUDA_CHECK(cudaGraphLaunch(impl_->exec, kernels::compute_stream()));
  for (const auto& f : impl_->replay_actions) f();
  allocator_for(impl_->device).note_replay(impl_->at_capture);
}
#else
void StepGraph::capture(Device d, const std::function<void()>&) {
  FP8T_FAIL("a CUDA graph of the step needs a CUDA build and device (got {}); set train.cuda_graph: false",
            d.str());
}

void StepGraph::replay() { FP8T_FAIL("StepGraph::replay in a build without CUDA"); }
#endif

}  // namespace fp8t
