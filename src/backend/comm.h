// Collectives between the ranks of a tensor-parallel group (issue 17): one backend per rank, one Communicator per
// rank. The tensor-parallel forward splits q/k/v and gate/up by output rows and attention-out/down by input columns,
// then sums the partial outputs with all_reduce_sum (one after attention, one after the FFN); logits are gathered
// by vocabulary rows with all_gather.
//   Collective: every rank of the group calls the same operation with the same shapes in the same order, each
//   from its own thread (or one thread driving all ranks inside group_start()/group_end()); operations are
//   stream-ordered on the rank's backend like any op.
// Implementations: make_local_group (ranks in one process on host-memory backends: the test implementation, runs
// in CI) and, in a build with NCCL (KILN_HAVE_NCCL), cuda::make_nccl_group (NCCL all-reduce / all-gather on each
// GPU's stream; NVLink multicast stays off: NCCL_NVLS_ENABLE=0 unless the environment says otherwise).
// Sums are f32 (the activations' type: a bf16 all-reduce would round the residual stream once per layer).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace kiln {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x (F32, contiguous, the same shape on every rank, in this rank's backend memory) becomes, on every rank, the
  // elementwise sum of all ranks' x.
  virtual Status all_reduce_sum(const Tensor& x) = 0;
  // dst (F32 contiguous, size() * x's elements) = every rank's x in rank order; x the same shape on every rank.
  virtual Status all_gather(const Tensor& x, const Tensor& dst) = 0;
};

// n ranks in one process over host-memory backends (Backend::host_memory(): the CPU backend). Rank r's calls must
// come from one thread per rank. Errors: n < 1 or n > 64 (kInvalidArgument); a tensor not in host memory or not
// contiguous F32, or ranks whose shapes differ (kInvalidArgument, named on every rank of that call).
Result<std::vector<std::unique_ptr<Communicator>>> make_local_group(int n);

}  // namespace kiln
