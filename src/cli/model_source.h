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
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "util/status.h"

namespace kiln::cli {

// Whether this binary carries the embedded default model.
bool have_embedded_model();

struct ModelSource {
  std::string path;   // -m; empty: the embedded model
  int n_threads = 0;  // -t; 0: all cores
};

// Registers -m/--model and -t/--threads.
void add_model_options(ArgParser& args, ModelSource* src);

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
// The cache for `max_seqs` sequences of n_ctx tokens each; errors name the bad option.
Result<std::unique_ptr<KvCache>> make_cache(const Model& model, const CacheOptions& opt, int32_t max_seqs = 1);
// n_ctx after applying the default (0 -> min(n_ctx_train, 4096)).
int64_t effective_ctx(const Model& model, int64_t n_ctx);

// --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --presence-penalty --frequency-penalty -s/--seed
void add_sampling_options(ArgParser& args, SamplerParams* p);

// Peak resident memory of this process in bytes (0 where unknown).
uint64_t peak_rss_bytes();

}  // namespace kiln::cli
