#include "cli/model_source.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <span>

#include "gguf/gguf.h"
#include "util/mmap_file.h"
#include "util/timer.h"

#ifdef KILN_HAVE_EMBEDDED_MODEL
// Defined by cli/embedded_model.S (.incbin of models/kiln-demo.gguf), 64-byte aligned in .rodata.
extern "C" const unsigned char kiln_embedded_model_begin[];
extern "C" const unsigned char kiln_embedded_model_end[];
#endif

namespace kiln::cli {

bool have_embedded_model() {
#ifdef KILN_HAVE_EMBEDDED_MODEL
  return kiln_embedded_model_end - kiln_embedded_model_begin > 0;
#else
  return false;
#endif
}

void add_model_options(ArgParser& args, ModelSource* src) {
  args.option({"-m", "--model"}, &src->path, "FILE",
              have_embedded_model() ? "GGUF model file (default: the embedded kiln-demo model)" : "GGUF model file");
  args.option({"-t", "--threads"}, &src->n_threads, "N", "CPU threads (default: all cores)");
}

Result<LoadedModel> load_model(const ModelSource& src, bool show_progress) {
  if (src.n_threads < 0)
    return make_error(ErrorCode::kInvalidArgument, "-t: threads must be >= 0 (got %d)", src.n_threads);
  LoadOptions opts;
  opts.n_threads = src.n_threads;
  opts.show_progress = show_progress && isatty(STDERR_FILENO);  // no \r progress lines in logs and pipes
  LoadedModel out;
  Timer t;
  if (!src.path.empty()) {
    auto m = Model::load(src.path, opts);
    if (!m) return m.status().with_context("loading " + src.path);
    out.model = std::move(m).value();
    out.name = src.path;
  } else {
#ifdef KILN_HAVE_EMBEDDED_MODEL
    std::span<const uint8_t> bytes(kiln_embedded_model_begin,
                                   static_cast<size_t>(kiln_embedded_model_end - kiln_embedded_model_begin));
    out.name = "<embedded kiln-demo>";
    auto file = gguf::File::parse(MappedFile::from_memory(bytes, out.name));
    if (!file) return file.status().with_context("embedded model");
    auto m = Model::load(std::move(file).value(), opts);
    if (!m) return m.status().with_context("embedded model");
    out.model = std::move(m).value();
#else
    return make_error(ErrorCode::kInvalidArgument, "no model: pass -m FILE (this build has no embedded default model)");
#endif
  }
  out.load_seconds = t.seconds();
  return out;
}

void add_cache_options(ArgParser& args, CacheOptions* opt) {
  args.option({"-c", "--ctx-size"}, &opt->n_ctx, "N", "context size in tokens (default: the model's, at most 4096)");
  args.option({"--kv-type"}, &opt->kv_type, "TYPE", "KV cache storage: f16 (default) or q8_0");
}

int64_t effective_ctx(const Model& model, int64_t n_ctx) {
  if (n_ctx > 0) return n_ctx;
  const int64_t train = model.hparams().n_ctx_train;
  return train > 0 ? std::min<int64_t>(train, 4096) : 4096;
}

Result<std::unique_ptr<KvCache>> make_cache(const Model& model, const CacheOptions& opt, int32_t max_seqs) {
  if (opt.n_ctx < 0)
    return make_error(ErrorCode::kInvalidArgument, "-c: context size must be >= 0 (got %lld)", (long long)opt.n_ctx);
  KvCacheConfig cfg;
  cfg.n_ctx = effective_ctx(model, opt.n_ctx) * max_seqs;
  cfg.max_seqs = max_seqs;
  if (opt.kv_type == "f16") {
    cfg.dtype = DType::F16;
  } else if (opt.kv_type == "q8_0") {
    cfg.dtype = DType::Q8_0;
  } else {
    return make_error(ErrorCode::kInvalidArgument, "--kv-type: '%s' is not f16 or q8_0", opt.kv_type.c_str());
  }
  return KvCache::create(model.hparams(), cfg);
}

void add_sampling_options(ArgParser& args, SamplerParams* p) {
  args.option({"--temp"}, &p->temp, "T", "temperature; <= 0: greedy (default 0.8)");
  args.option({"--top-k"}, &p->top_k, "N", "top-k sampling; <= 0: off (default 40)");
  args.option({"--top-p"}, &p->top_p, "P", "top-p (nucleus) sampling; 1: off (default 0.95)");
  args.option({"--min-p"}, &p->min_p, "P", "min-p sampling; 0: off (default 0.05)");
  args.option({"--repeat-penalty"}, &p->repeat_penalty, "X", "penalty for repeated tokens; 1: off (default 1.0)");
  args.option({"--repeat-last-n"}, &p->penalty_last_n, "N",
              "tokens the penalties look back over; 0: off, -1: whole context (default 64)");
  args.option({"--presence-penalty"}, &p->presence_penalty, "X", "presence penalty (default 0)");
  args.option({"--frequency-penalty"}, &p->frequency_penalty, "X", "frequency penalty (default 0)");
  args.option({"-s", "--seed"}, &p->seed, "N", "RNG seed (default: random)");
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace kiln::cli
