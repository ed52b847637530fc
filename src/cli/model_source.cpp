#include "cli/model_source.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <span>
#include <tuple>

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

std::span<const uint8_t> embedded_model_bytes() {
#ifdef KILN_HAVE_EMBEDDED_MODEL
  return std::span<const uint8_t>(kiln_embedded_model_begin,
                                  static_cast<size_t>(kiln_embedded_model_end - kiln_embedded_model_begin));
#else
  return {};
#endif
}

void note_once(const std::string& key, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key).second) return;
  std::fprintf(stderr, "%s\n", message.c_str());
}

void add_model_options(ArgParser& args, ModelSource* src) {
  args.option({"-m", "--model"}, &src->path, "FILE",
              have_embedded_model() ? "GGUF model file (default: the embedded kiln-demo model)" : "GGUF model file");
  args.option({"-t", "--threads"}, &src->n_threads, "N", "CPU threads (default: all cores)");
  args.option({"--device"}, &src->device, "DEV", "where to run: auto (a GPU when present), cpu, cuda, cuda:N");
  args.option({"-ngl", "--n-gpu-layers", "--gpu-layers"}, &src->n_gpu_layers, "N",
              "with a GPU: the last N layers, then the output, on it; the rest on the CPU (default -1: all)");
  args.optional_value({"-fa", "--flash-attn"}, &src->flash_attn, {"on", "off", "auto"}, "on", "on|off|auto",
                      "accepted for llama.cpp's scripts; no effect (kiln's attention is always flash-style)");
  args.option({"-sm", "--split-mode"}, &src->split_mode, "MODE",
              "several devices: none (one device), layer (consecutive layers per device), tensor (every matrix "
              "sharded across the devices; GPUs need NCCL; --device cpu,cpu runs two CPU ranks) (default none)");
  args.option({"-ts", "--tensor-split"}, &src->tensor_split, "A,B,...",
              "share of each device of --device (layer mode: layers in these proportions; tensor mode: equal only)");
  args.option({"-mg", "--main-gpu"}, &src->main_gpu, "N",
              "split mode none: the GPU to run on (cuda:N) (default 0)");
  add_expert_options(args, src);
}

void add_expert_options(ArgParser& args, ModelSource* src) {
  args.flag({"-cmoe", "--cpu-moe"}, &src->cpu_moe,
            "mixture-of-experts models: keep the expert tensors of every layer in host memory and run them on the "
            "CPU (the rest of each layer stays on the GPU)");
  args.option({"-ncmoe", "--n-cpu-moe"}, &src->n_cpu_moe, "N",
              "as --cpu-moe for the first N layers only (more than the model has: all)");
  args.multi({"-ot", "--override-tensor"}, &src->override_tensor, "PATTERN=BUFTYPE[,...]",
             "tensors whose name matches the regular expression PATTERN go to buffer type BUFTYPE; for now BUFTYPE is "
             "CPU and only expert tensors (blk.N.ffn_*_exps) can be overridden (a match moves all of that layer's "
             "experts, with its router); repeatable");
}

Result<DeviceRequest> device_request(const ModelSource& src) {
  DeviceRequest r;
  r.device = src.device;
  r.n_gpu_layers = src.n_gpu_layers;
  r.backend.n_threads = src.n_threads;
  KILN_ASSIGN_OR_RETURN(r.split_mode, parse_split_mode(src.split_mode));
  if (!src.tensor_split.empty()) {
    KILN_ASSIGN_OR_RETURN(r.tensor_split, parse_tensor_split(src.tensor_split));
  }
  if (src.main_gpu < 0)
    return make_error(ErrorCode::kInvalidArgument, "--main-gpu: must be >= 0 (got %d)", src.main_gpu);
  r.main_gpu = src.main_gpu;
  if (src.n_cpu_moe < 0)
    return make_error(ErrorCode::kInvalidArgument, "--n-cpu-moe: must be >= 0 (got %d)", src.n_cpu_moe);
  r.experts.n_cpu_moe = src.cpu_moe ? ExpertRequest::kAllLayers : src.n_cpu_moe;
  for (const std::string& v : src.override_tensor) {
    KILN_ASSIGN_OR_RETURN(std::vector<TensorOverride> o, parse_tensor_overrides(v));
    r.experts.overrides.insert(r.experts.overrides.end(), o.begin(), o.end());
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> ids, resolve_device_list(r.device, r.split_mode, r.main_gpu));
  KILN_TRY(check_split_request(r, ids.size()));  // before anything loads
  return r;
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
  for (size_t i = 0;;) {  // each entry of a comma list
    const size_t j = d.find(',', i);
    const std::string e = d.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (!(e == "auto" || e == "cpu" || e == "cuda" || e.rfind("cuda:", 0) == 0))
      return make_error(ErrorCode::kInvalidArgument, "--device: '%s' is not auto, cpu, cuda or cuda:N (or a comma "
                        "list of cpu / cuda:N)", d.c_str());
    if (j == std::string::npos) break;
    i = j + 1;
  }
  KILN_TRY(device_request(src).status());
  if (!src.flash_attn.empty())
    note_once("-fa", "kiln: -fa " + src.flash_attn +
                         " has no effect: kiln's attention is always flash-style (online softmax over KV blocks)");
  return Status::ok();
}

Result<LoadedModel> load_model(const ModelSource& src_in, bool show_progress) {
  ModelSource src = src_in;
  KILN_TRY(check_model_options(src));
  LoadOptions opts;
  KILN_ASSIGN_OR_RETURN(opts.devices, device_request(src));
  const bool tty = show_progress && isatty(STDERR_FILENO);  // no \r progress lines in logs and pipes
  std::string shown;
  if (tty)
    opts.progress = [&shown](uint64_t done, uint64_t total) {
      std::fprintf(stderr, "\rloading %s: %3d%%", shown.c_str(), static_cast<int>(done * 100 / total));
      if (done == total) std::fputc('\n', stderr);
    };
  if (std::string notice = gpu_fallback_notice(backend_factories(), src.device); !notice.empty())
    note_once("no-gpu", notice);
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
    std::span<const uint8_t> bytes = embedded_model_bytes();
    out.name = kEmbeddedModelName;
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
  if (src.n_gpu_layers > 0 && out.model->placement().n_offloaded() == 0)
    note_once("-ngl", "kiln: -ngl " + std::to_string(src.n_gpu_layers) + " has no effect: the model runs on the CPU");
  if ((src.cpu_moe || src.n_cpu_moe > 0 || !src.override_tensor.empty()) &&
      out.model->placement().n_experts_apart() == 0) {
    const Model& m = *out.model;
    const char* why = m.hparams().n_expert == 0           ? "the model has no expert tensors"
                      : m.placement().n_offloaded() == 0 ? "every layer runs on the CPU already"
                                                          : "no expert tensor of a layer on the GPU is selected";
    note_once("cpu-moe", std::string("kiln: --cpu-moe / --n-cpu-moe / -ot move no expert tensor: ") + why);
  }
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

void add_cache_options(ArgParser& args, CacheOptions* opt, const std::string& ctx_help) {
  args.option({"-c", "--ctx-size"}, &opt->n_ctx, "N",
              !ctx_help.empty() ? ctx_help
                                : "context size in tokens (default: the model's, at most " +
                                      std::to_string(defaults::kContextCap) + ")");
  add_cache_type_options(args, &opt->kv_type, &opt->type_k, &opt->type_v);
}

void add_cache_type_options(ArgParser& args, std::string* kv_type, std::string* type_k, std::string* type_v) {
  const std::string names = kv_cache_type_names();
  args.option({"-ctk", "--cache-type-k"}, type_k, "TYPE", "KV cache type for K: " + names + " (default f16)");
  args.option({"-ctv", "--cache-type-v"}, type_v, "TYPE", "KV cache type for V: " + names + " (default f16)");
  args.option({"--kv-type"}, kv_type, "TYPE", "KV cache type for K and V alike (as -ctk TYPE -ctv TYPE)");
}

std::string cache_types_label(const CacheOptions& opt) {
  if (opt.k == opt.v) return dtype_name(opt.k);
  return std::string("k ") + dtype_name(opt.k) + ", v " + dtype_name(opt.v);
}

int64_t effective_ctx(const Model& model, int64_t n_ctx) {
  if (n_ctx > 0) return n_ctx;
  const int64_t train = model.hparams().n_ctx_train;
  return train > 0 ? std::min<int64_t>(train, defaults::kContextCap) : defaults::kContextCap;
}

Status check_cache_options(CacheOptions& opt) {
  if (opt.n_ctx < 0)
    return make_error(ErrorCode::kInvalidArgument, "-c: context size must be >= 0 (got %lld)", (long long)opt.n_ctx);
  // The KV cache's slot ids are 32-bit (KvCache::validate says the same after loading; this says it before).
  constexpr int64_t kMaxCtx = (int64_t{1} << 31) - defaults::kBlockSize;
  if (opt.n_ctx > kMaxCtx)
    return make_error(ErrorCode::kOutOfRange, "-c %lld: the context is limited to %lld token slots",
                      (long long)opt.n_ctx, (long long)kMaxCtx);
  DType both = DType::F16;
  if (!opt.kv_type.empty()) {
    KILN_ASSIGN_OR_RETURN(both, kv_cache_type_from_name("--kv-type", opt.kv_type));
  }
  opt.k = opt.v = both;
  if (!opt.type_k.empty()) {
    KILN_ASSIGN_OR_RETURN(opt.k, kv_cache_type_from_name("-ctk", opt.type_k));
  }
  if (!opt.type_v.empty()) {
    KILN_ASSIGN_OR_RETURN(opt.v, kv_cache_type_from_name("-ctv", opt.type_v));
  }
  // --kv-type sets both: a -ctk or -ctv that says otherwise is a contradiction, not an override.
  for (const auto& [flag, given, t] : {std::tuple<const char*, const std::string&, DType>{"-ctk", opt.type_k, opt.k},
                                       {"-ctv", opt.type_v, opt.v}})
    if (!opt.kv_type.empty() && !given.empty() && t != both)
      return make_error(ErrorCode::kInvalidArgument, "--kv-type %s and %s %s differ (--kv-type sets K and V alike)",
                        opt.kv_type.c_str(), flag, given.c_str());
  return Status::ok();
}

Result<std::unique_ptr<Engine>> make_engine(Model& model, const CacheOptions& opt, int32_t max_seqs, int32_t n_batch,
                                            int32_t max_outputs) {
  CacheOptions checked = opt;
  KILN_TRY(check_cache_options(checked));
  if (n_batch < 1) return make_error(ErrorCode::kInvalidArgument, "-b: batch size must be >= 1 (got %d)", n_batch);
  KvCacheConfig cfg;
  const int64_t per_seq = effective_ctx(model, opt.n_ctx);
  const int64_t train = model.hparams().n_ctx_train;
  if (train > 0 && per_seq > train)
    note_once("-c>train", strprintf("kiln: warning: -c %lld is more than the model's training context (%lld tokens): "
                                    "output past that may degrade",
                                    (long long)per_seq, (long long)train));
  if (per_seq > (int64_t{1} << 40) / max_seqs)
    return make_error(ErrorCode::kOutOfRange, "-c %lld: context too large", (long long)per_seq);
  cfg.n_ctx = per_seq * max_seqs;
  cfg.max_seqs = max_seqs;
  cfg.block_size = defaults::kBlockSize;
  cfg.batch_tokens = static_cast<int32_t>(std::min<int64_t>(n_batch, cfg.n_ctx));
  cfg.max_outputs = max_outputs;
  cfg.type_k = checked.k;
  cfg.type_v = checked.v;
  return Engine::create(model, cfg);
}

Status check_generation_options(int64_t max_new_tokens, int64_t batch_tokens) {
  if (max_new_tokens < -1)
    return make_error(ErrorCode::kInvalidArgument, "-n: must be >= -1 (-1: until end of generation; got %lld)",
                      (long long)max_new_tokens);
  if (batch_tokens < 1 || batch_tokens > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "-b: must be in [1, %d] (got %lld)", 1 << 20, (long long)batch_tokens);
  return Status::ok();
}

Result<std::string> read_bounded(const std::string& path, uint64_t max_bytes, const std::string& flag,
                                 const std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "%s: cannot open '%s'", flag.c_str(), path.c_str());
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes)
      return make_error(ErrorCode::kOutOfRange, "%s '%s': more than %llu bytes (%s)", flag.c_str(), path.c_str(),
                        (unsigned long long)max_bytes, why.c_str());
  }
  if (in.bad()) return make_error(ErrorCode::kIo, "%s: error reading '%s'", flag.c_str(), path.c_str());
  return text;
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace kiln::cli
