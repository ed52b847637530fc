// How a command finds its model and sets up what running it needs, shared by run, chat, bench and perplexity:
//   -m PATH      that GGUF file
//   (no -m)      the default model embedded in the binary (models/kiln-demo.gguf, linked by src/CMakeLists.txt
//                through cli/embedded_model.S when the file exists at build time)
// plus the runtime options every model-running command takes (-t threads, -c context, --kv-type) and the
// sampling flags (llama.cpp's names).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cli/args.h"
#include "model/model.h"
#include "runtime/defaults.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "util/status.h"

namespace kiln::cli {

// Whether this binary carries the embedded default model.
bool have_embedded_model();

struct ModelSource {
  std::string path;   // -m; empty: the embedded model
  int n_threads = 0;  // -t; 0: all cores
  std::string device = "auto";  // --device auto|cpu|cuda|cuda:N
  int n_gpu_layers = -1;        // -ngl: the last N layers (then the output) on the GPU; -1: all
};

// Registers -m/--model, -t/--threads, --device and -ngl/--n-gpu-layers.
void add_model_options(ArgParser& args, ModelSource* src);
// Checks -t, --device and -ngl before anything is loaded (-t above kMaxThreadsPerCore per core is capped with a
// warning).
Status check_model_options(ModelSource& src);

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::string name;       // the file path, or "<embedded kiln-demo>"
  double load_seconds = 0;
};
// Loads the model the options name; the error names the file (or says this build has no default model).
// show_progress: for files over 256 MiB, touch every page with a progress line on stderr (only when stderr is a
// terminal), then print a one-line model summary.
Result<LoadedModel> load_model(const ModelSource& src, bool show_progress = false);

struct CacheOptions {
  int64_t n_ctx = 0;         // -c; 0: the model's training context, at most 4096
  std::string kv_type = "f16";  // --kv-type f16|q8_0
};
void add_cache_options(ArgParser& args, CacheOptions* opt);
// The engine (KV cache + model state) for `max_seqs` sequences of n_ctx tokens each, steps of up to n_batch
// tokens and max_outputs output rows (0: the default); errors name the bad option.
Result<std::unique_ptr<Engine>> make_engine(Model& model, const CacheOptions& opt, int32_t max_seqs = 1,
                                            int32_t n_batch = defaults::kBatch, int32_t max_outputs = 0);
// Checks -c and --kv-type before the model loads.
Status check_cache_options(const CacheOptions& opt);
// n_ctx after applying the default (0 -> min(n_ctx_train, kContextCap)).
int64_t effective_ctx(const Model& model, int64_t n_ctx);

// --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --presence-penalty --frequency-penalty -s/--seed
void add_sampling_options(ArgParser& args, SamplerParams* p);

// Peak resident memory of this process in bytes (0 where unknown).
uint64_t peak_rss_bytes();

}  // namespace kiln::cli
