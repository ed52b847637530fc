// A loaded model: hyperparameters, tokenizer, weights (in their GGUF block layout, on the backends of the
// placement) and the forward pass, written once against the Backend op interface (backend/backend.h).
//
// The model layer knows no runtime: it executes steps that the runtime planned (model/step.h) on a ModelState it
// created (KV storage, workspace, staging); block allocation, sequences and lengths are the runtime's. It prints
// nothing: load progress goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/placement.h"
#include "gguf/gguf.h"
#include "model/batch.h"
#include "model/hparams.h"
#include "model/step.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

struct LoadOptions {
  // Where the model runs: an explicit placement wins (its `experts` say where expert tensors go); otherwise
  // `devices` (--device, -ngl, threads, the expert flags) is resolved with the file's layer count and tensor names
  // (backend/placement.h: place_layers, resolve_expert_layers, place_experts).
  Placement placement;
  DeviceRequest devices;
  // Tensor parallel (model/tensor_parallel.h): the ranks and their communicators; when empty and
  // devices.split_mode is kTensor, Model::load makes the group from `devices` (make_tensor_parallel_group).
  TensorParallelGroup tensor_parallel;
  bool prefetch = true;  // madvise(WILLNEED) the mapping
  // Called while the weights are read or uploaded: bytes done of total (files over 256 MiB only, throttled to
  // whole percents). The caller draws the bar.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct ModelStats {
  uint64_t weight_bytes = 0;  // bytes of tensor data
  uint64_t n_params = 0;
  double load_seconds = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  // Opens the file (mmap) and builds the model; errors name the file, key or tensor at fault. An unknown
  // architecture lists the supported ones.
  static Result<std::unique_ptr<Model>> load(const std::string& path, const LoadOptions& opts);
  // Same, from an already parsed file (the embedded default model).
  static Result<std::unique_ptr<Model>> load(gguf::File file, const LoadOptions& opts);

  virtual const HParams& hparams() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  virtual const ModelStats& stats() const = 0;
  virtual const gguf::File& file() const = 0;
  virtual const Placement& placement() const = 0;

  // KV storage + workspace + staging for these capacities, on the placement's backends. Errors: a capacity out of
  // range, or storage that does not fit (names the bytes needed and available, and the option to lower).
  virtual Result<std::unique_ptr<ModelState>> create_state(const StepCaps& caps) = 0;
  // Bytes create_state would allocate for the KV storage.
  virtual uint64_t kv_bytes(const StepCaps& caps) const = 0;
  // The multi-token-prediction draft (model/mtp.h): a one-layer view of the file's first NextN block, owned by this
  // model; null when the file has none (HParams::n_nextn 0) or the model runs tensor parallel.
  virtual Model* nextn_model() { return nullptr; }
};

}  // namespace kiln
