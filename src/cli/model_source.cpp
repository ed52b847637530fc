#include "cli/model_source.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <span>

#include "gguf/gguf.h"
#include "util/mmap_file.h"
#include "util/thread_pool.h"
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
  args.option({"--device"}, &src->device, "DEV", "where to run: auto (a GPU when present), cpu, cuda, cuda:N");
  args.option({"-ngl", "--n-gpu-layers", "--gpu-layers"}, &src->n_gpu_layers, "N",
              "with a GPU: the last N layers, then the output, on it; the rest on the CPU (default -1: all)");
}

Status check_model_options(ModelSource& src) {
  if (src.n_threads < 0)
    return make_error(ErrorCode::kInvalidArgument, "-t: threads must be >= 0 (got %d)", src.n_threads);
  const int cores = default_thread_count();
  if (src.n_threads > cores * defaults::kMaxThreadsPerCore) {
    std::fprintf(stderr, "kiln: -t %d is more than %d threads per core on this %d-core machine: using %d\n",
                 src.n_threads, defaults::kMaxThreadsPerCore, cores, cores * defaults::kMaxThreadsPerCore);
    src.n_threads = cores * defaults::kMaxThreadsPerCore;
  }
  if (src.n_gpu_layers < -1)
    return make_error(ErrorCode::kInvalidArgument, "-ngl: must be >= 0, or -1 for all layers (got %d)",
                      src.n_gpu_layers);
  const std::string d = src.device;
  if (!(d == "auto" || d == "cpu" || d == "cuda" || d.rfind("cuda:", 0) == 0))
    return make_error(ErrorCode::kInvalidArgument, "--device: '%s' is not auto, cpu, cuda or cuda:N", d.c_str());
  return Status::ok();
}

Result<LoadedModel> load_model(const ModelSource& src_in, bool show_progress) {
  ModelSource src = src_in;
  KILN_TRY(check_model_options(src));
  LoadOptions opts;
  opts.devices.device = src.device;
  opts.devices.n_gpu_layers = src.n_gpu_layers;
  opts.devices.backend.n_threads = src.n_threads;
  const bool tty = show_progress && isatty(STDERR_FILENO);  // no \r progress lines in logs and pipes
  std::string shown;
  if (tty)
    opts.progress = [&shown](uint64_t done, uint64_t total) {
      std::fprintf(stderr, "\rloading %s: %3d%%", shown.c_str(), static_cast<int>(done * 100 / total));
      if (done == total) std::fputc('\n', stderr);
    };
  LoadedModel out;
  Timer t;
  if (!src.path.empty()) {
    shown = src.path;
    auto m = Model::load(src.path, opts);
    if (!m) return m.status();  // Model::load names the file
    out.model = std::move(m).value();
    out.name = src.path;
  } else {
#ifdef KILN_HAVE_EMBEDDED_MODEL
    std::span<const uint8_t> bytes(kiln_embedded_model_begin,
                                   static_cast<size_t>(kiln_embedded_model_end - kiln_embedded_model_begin));
    out.name = "<embedded kiln-demo>";
    shown = out.name;
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
  if (show_progress) {
    const Model& m = *out.model;
    const HParams& hp = m.hparams();
    std::fprintf(stderr, "model: %s (%s), %.1fM params, %.1f MiB weights, %lld layers, on %s, %.2f s\n",
                 hp.name.empty() ? out.name.c_str() : hp.name.c_str(), hp.arch.c_str(),
                 static_cast<double>(m.stats().n_params) / 1e6,
                 static_cast<double>(m.stats().weight_bytes) / (1 << 20), static_cast<long long>(hp.n_layer),
                 m.placement().describe().c_str(), out.load_seconds);
  }
  return out;
}

void add_cache_options(ArgParser& args, CacheOptions* opt) {
  args.option({"-c", "--ctx-size"}, &opt->n_ctx, "N",
              "context size in tokens (default: the model's, at most " + std::to_string(defaults::kContextCap) + ")");
  args.option({"--kv-type"}, &opt->kv_type, "TYPE", "KV cache storage: f16 (default) or q8_0");
}

int64_t effective_ctx(const Model& model, int64_t n_ctx) {
  if (n_ctx > 0) return n_ctx;
  const int64_t train = model.hparams().n_ctx_train;
  return train > 0 ? std::min<int64_t>(train, defaults::kContextCap) : defaults::kContextCap;
}

Status check_cache_options(const CacheOptions& opt) {
  if (opt.n_ctx < 0)
    return make_error(ErrorCode::kInvalidArgument, "-c: context size must be >= 0 (got %lld)", (long long)opt.n_ctx);
  if (opt.kv_type != "f16" && opt.kv_type != "q8_0")
    return make_error(ErrorCode::kInvalidArgument, "--kv-type: '%s' is not f16 or q8_0", opt.kv_type.c_str());
  return Status::ok();
}

Result<std::unique_ptr<Engine>> make_engine(Model& model, const CacheOptions& opt, int32_t max_seqs, int32_t n_batch,
                                            int32_t max_outputs) {
  KILN_TRY(check_cache_options(opt));
  if (n_batch < 1) return make_error(ErrorCode::kInvalidArgument, "-b: batch size must be >= 1 (got %d)", n_batch);
  KvCacheConfig cfg;
  const int64_t per_seq = effective_ctx(model, opt.n_ctx);
  if (per_seq > (int64_t{1} << 40) / max_seqs)
    return make_error(ErrorCode::kOutOfRange, "-c %lld: context too large", (long long)per_seq);
  cfg.n_ctx = per_seq * max_seqs;
  cfg.max_seqs = max_seqs;
  cfg.block_size = defaults::kBlockSize;
  cfg.max_batch = static_cast<int32_t>(std::min<int64_t>(n_batch, cfg.n_ctx));
  cfg.max_outputs = max_outputs;
  cfg.dtype = opt.kv_type == "q8_0" ? DType::Q8_0 : DType::F16;
  return Engine::create(model, cfg);
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
