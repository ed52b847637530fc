// How a command finds its model and sets up what running it needs, shared by run, chat, bench and perplexity:
//   -m PATH      that GGUF file
//   (no -m)      the default model embedded in the binary (models/kiln-demo.gguf, linked by src/CMakeLists.txt
//                through cli/embedded_model.S when the file exists at build time)
// plus the runtime options every model-running command takes (-t threads, -c context, --kv-type) and the
// sampling flags (llama.cpp's names).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/registry.h"
#include "cli/args.h"
#include "cli/sampling_options.h"
#include "model/model.h"
#include "runtime/defaults.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "util/status.h"

namespace kiln::cli {

// Whether this binary carries the embedded default model.
bool have_embedded_model();
// Its bytes (empty when the build has none): for commands that read the GGUF themselves (tokenize).
std::span<const uint8_t> embedded_model_bytes();
// The name commands show for it.
inline constexpr const char* kEmbeddedModelName = "<embedded kiln-demo>";

// Prints `message` (one line) on stderr the first time `key` is seen in this process: for notes such as "-fa has
// no effect" that a command reaching the same code twice (bench's thread list) should not repeat.
void note_once(const std::string& key, const std::string& message);

struct ModelSource {
  std::string path;   // -m; empty: the embedded model
  int n_threads = 0;  // -t; 0: all cores
  std::string device = "auto";  // --device auto|cpu|cuda|cuda:N
  int n_gpu_layers = -1;        // -ngl: the last N layers (then the output) on the GPU; -1: all
  std::string flash_attn;       // -fa on|off|auto ("": not given). Accepted for llama.cpp's scripts; no effect:
                                // kiln's attention is always flash-style (online softmax, tiled)
  // Several devices (backend/placement.h, SplitMode): --device takes a comma list (cuda:0,cuda:1; cpu,cpu for CPU
  // ranks / instances), or cuda/auto means every GPU when the split mode is not none.
  std::string split_mode = "none";  // --split-mode none|layer|tensor (-sm)
  std::string tensor_split;         // --tensor-split A,B,... (-ts): proportions per device ("": equal)
  int main_gpu = 0;                 // --main-gpu N (-mg)
  // Mixture-of-experts models on a GPU too small for them (llama.cpp's flags; backend/placement.h, ExpertRequest):
  // the expert tensors of these layers stay in host memory and run on the CPU, the rest of each layer on the GPU.
  bool cpu_moe = false;                      // --cpu-moe (-cmoe): every layer's
  int n_cpu_moe = 0;                         // --n-cpu-moe N (-ncmoe): layers 0 .. N-1
  std::vector<std::string> override_tensor;  // -ot/--override-tensor PATTERN=BUFTYPE[,...], each occurrence
};

// Registers -m/--model, -t/--threads, --device, -ngl/--n-gpu-layers, -fa/--flash-attn, -sm/--split-mode,
// -ts/--tensor-split, -mg/--main-gpu and the expert options (add_expert_options).
void add_model_options(ArgParser& args, ModelSource* src);
// --cpu-moe/-cmoe, --n-cpu-moe/-ncmoe and -ot/--override-tensor (also registered alone by kiln bench).
void add_expert_options(ArgParser& args, ModelSource* src);
// The DeviceRequest the options name (--split-mode, --tensor-split, --device and the expert options parsed; errors
// name the flag).
Result<DeviceRequest> device_request(const ModelSource& src);
// Checks -t, --device, -ngl, -fa, --split-mode, --tensor-split, --main-gpu, --n-cpu-moe and -ot before anything is
// loaded (-t above kMaxThreadsPerCore per core is capped with a warning; -fa says once that it changes nothing).
// Whether an -ot pattern matches only expert tensors is known once the file is open (Model::load says so).
Status check_model_options(ModelSource& src);

// The line load_model prints (once) when this build has a CUDA backend but no GPU is present and --device is auto;
// "" otherwise. Inline, over the factories it is given, so tests can hand it fake ones.
inline std::string gpu_fallback_notice(std::span<const BackendFactory* const> factories, const std::string& device) {
  if (device != "auto") return "";
  for (const BackendFactory* f : factories) {
    if (std::string_view(f->kind) != "cuda") continue;
    auto devs = f->devices();
    if (!devs.is_ok() || devs->empty()) return "kiln: no GPU found, running on the CPU";
  }
  return "";
}

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
  int64_t n_ctx = 0;            // -c; 0: the model's training context, at most 4096
  std::string kv_type;          // --kv-type: K and V alike ("": not given)
  std::string type_k, type_v;   // -ctk/--cache-type-k, -ctv/--cache-type-v (llama.cpp's names; "": not given)
  // What check_cache_options makes of them: -ctk, else --kv-type, else f16 (and -ctv likewise).
  DType k = DType::F16, v = DType::F16;
};
// -c, --kv-type, -ctk, -ctv. ctx_help: the help of -c (default: the model's context, at most kContextCap).
void add_cache_options(ArgParser& args, CacheOptions* opt, const std::string& ctx_help = "");
// -ctk, -ctv and --kv-type alone (kiln bench, whose -c is its own).
void add_cache_type_options(ArgParser& args, std::string* kv_type, std::string* type_k, std::string* type_v);
// "q8_0" when K and V are stored alike, else "k q8_0, v f16" (checked options).
std::string cache_types_label(const CacheOptions& opt);
// The engine (KV cache + model state) for `max_seqs` sequences of n_ctx tokens each, steps of up to n_batch
// tokens and max_outputs output rows (0: the default); errors name the bad option.
Result<std::unique_ptr<Engine>> make_engine(Model& model, const CacheOptions& opt, int32_t max_seqs = 1,
                                            int32_t n_batch = defaults::kBatch, int32_t max_outputs = 0);
// Checks -c, --kv-type, -ctk and -ctv before the model loads and sets opt.k / opt.v (whether a backend stores
// those types is asked when the engine is created, after loading).
Status check_cache_options(CacheOptions& opt);
// n_ctx after applying the default (0 -> min(n_ctx_train, kContextCap)).
int64_t effective_ctx(const Model& model, int64_t n_ctx);

// -n (tokens to generate: >= -1) and -b (tokens per forward pass: 1 .. 2^20), before the model loads.
Status check_generation_options(int64_t max_new_tokens, int64_t batch_tokens);

// The most bytes of prompt text that could fit a context of n_ctx tokens (a token covers at most this many bytes
// of text in any vocabulary kiln has met; the tokenized length is checked against the context afterwards).
inline constexpr int64_t kMaxBytesPerToken = 256;
// Reads a file of at most max_bytes (an endless or huge one, e.g. /dev/zero, fails as soon as it passes that);
// errors name `flag` and the file; `why` completes "more than N bytes (...)".
Result<std::string> read_bounded(const std::string& path, uint64_t max_bytes, const std::string& flag,
                                 const std::string& why);

// Peak resident memory of this process in bytes (0 where unknown).
uint64_t peak_rss_bytes();

}  // namespace kiln::cli
