// Locating a training step's first non-finite value: the weights that hold NaN/Inf, and a re-run of
// the step's forward and backward with every op checked (autograd/finite_watch.h). Only ever called
// after a step went non-finite, or once per checkpoint (the weights).
#pragma once
#include <functional>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "nn/gpt.h"

namespace fp8t {

// "h.2.attn.c_proj.weight element 17 [0, 17] is nan, ..." for the parameters (at most max_names, then a
// count) whose master or compute copy holds NaN/Inf; empty when all are finite (one reduction per buffer).
std::string nonfinite_weights(ParameterStore& params, size_t max_names = 4);

// Micro-batch i of the step: tokens and targets, i32 (B, T) each on the model's device.
using MicroBatchFn = std::function<std::pair<Tensor, Tensor>(int micro)>;

// Re-runs the forward and backward of the step's micro-batches (same weights: before the optimizer
// update) with every op's output and every node's gradients checked, and describes the first
// non-finite value: "in the forward pass of micro-batch 1 of 2, in block 2: the output of
// h.2.attn.c_proj (linear), shape [...], element 37 [...] is inf; its inputs were finite". Empty when
// the re-run meets none. recompute and grad_scale as in GPT::loss. Parameter gradients go to
// temporary buffers: the step's gradients (and ZeRO-2 staging) are not touched.
std::string locate_first_nonfinite(GPT& model, int micro_batches, const MicroBatchFn& batch, bool recompute,
                                   float grad_scale);

}  // namespace fp8t
