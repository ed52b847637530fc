// A loaded model: hyperparameters, tokenizer, weights (views into the mmapped GGUF, in their block layout) and the
// forward pass, written once against the Backend op interface (backend/backend.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "runtime/batch.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

class KvCache;
class Backend;

struct LoadOptions {
  int n_threads = 0;            // CPU threads (0: all cores)
  bool show_progress = false;   // progress bar on stderr while touching weights of large files
  bool prefetch = true;         // madvise(WILLNEED) the mapping
  bool reference_backend = false;  // run on the scalar reference CPU backend (tests: the executable spec)
};

struct ModelStats {
  uint64_t weight_bytes = 0;    // bytes of tensor data (mapped)
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
  virtual Backend& backend() = 0;

  // Runs one batch through the network, appending each token's K/V to `cache` (sequences must have been admitted
  // to the cache; see KvCache). For every token with want_logits, in batch order, writes n_vocab f32 logits to
  // `logits` (resized to n_logits * n_vocab). Errors: token id out of range, position not continuing its sequence,
  // cache full (names the sequence and its length).
  virtual Status forward(const Batch& batch, KvCache& cache, std::vector<float>* logits) = 0;
};

}  // namespace kiln
