// kiln bench: prompt-processing (pp) and text-generation (tg) throughput in llama-bench's format, so tools that read
// llama-bench output read kiln's: comma-separated lists for -p/-n/-d/-t, one row per test ("pp512", "tg128",
// "pp512 @ d1024"), mean +- sample stdev of tok/s over -r repetitions after one warm-up run; the md/csv/json
// fields carry llama-bench's names (model_type, model_size, model_n_params, backends, n_threads, n_batch,
// n_ubatch, n_prompt, n_gen, n_depth, avg_ns, stddev_ns, avg_ts, stddev_ts, samples_ns, samples_ts).
//
// pp N: N random (seeded) token ids in forward passes of n_batch tokens, logits for the last token of each pass.
// tg N: N forward passes of one random token each. Depth d: the cache first holds d random tokens (not timed).
// -np P (tg only; llama-batched-bench's -npl): P sequences decode together, each forward pass one token of each
// (P rows of logits back, as llama-batched-bench's outputs), each sequence at depth d; t/s counts all P x N tokens
// ("tg128 np8"). This is the step the server runs with P streams in flight.
//
// Grammar decoding (--grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file, as `kiln run`): each tg
// test then runs twice, as greedy decoding (each pass feeds every sequence the argmax of its last row; only the ids
// come back): "tg64 np64 greedy" free, and "tg64 np64 grammar" under the grammar, one matcher per sequence (a
// sequence whose grammar completes, or allows nothing, starts a fresh one). Before each pass the sequences' token
// masks are computed on the host (TokenMaskProvider::allowed, the sequences in parallel on min(P, cores) threads
// as the server's engine loop does) and the device takes the masked argmax (--mask-path device, the default); with
// --mask-path host the rows come back and are masked on the host (the path of a backend without argmax_masked). The
// two rows differ by the grammar's cost; the host time spent on masks per generated token goes to stderr (and the
// json output's mask_ns_per_token).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "cli/grammar_options.h"
#include "cli/model_source.h"
#include "model/batch.h"
#include "runtime/sampler.h"
#include "util/thread_pool.h"
#include "util/timer.h"

#include <nlohmann/json.hpp>

namespace kiln::cli {
namespace {

Result<std::vector<int>> parse_list(const char* name, const std::string& text) {
  std::vector<int> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > (1 << 24))
      return make_error(ErrorCode::kInvalidArgument, "%s: '%s' is not a non-negative integer", name, item.c_str());
    out.push_back(static_cast<int>(v));
    i = j + 1;
  }
  return out;
}

std::string cpu_info() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(line.find_first_not_of(" \t", p + 1));
    }
  return "";
}

// llama.cpp's llama_ftype names for general.file_type.
std::string ftype_name(const gguf::File& f) {
  auto ft = f.get_u32_or("general.file_type", 0xFFFFFFFFu);
  switch (ft ? *ft : 0xFFFFFFFFu) {
    case 0: return "all F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K - Medium";
    case 11: return "Q3_K - Small";
    case 12: return "Q3_K - Medium";
    case 13: return "Q3_K - Large";
    case 14: return "Q4_K - Small";
    case 15: return "Q4_K - Medium";
    case 16: return "Q5_K - Small";
    case 17: return "Q5_K - Medium";
    case 18: return "Q6_K";
    case 21: return "Q2_K - Small";
    case 32: return "BF16";
    default: return "unknown";
  }
}

// "<arch> <size label> <ftype>", as llama.cpp describes a model. The size label is the parameter count rounded to
// whole billions ("1B", "8B"); llama.cpp takes it from a per-architecture table and says "?B" for shapes it does
// not know, which is what models under a billion parameters give here.
std::string model_type(const Model& m) {
  const double b = static_cast<double>(m.stats().n_params) / 1e9;
  std::string size = b >= 0.95 ? strprintf("%.0fB", b) : "?B";
  return m.hparams().arch + " " + size + " " + ftype_name(m.file());
}

// llama-bench's "backends": CUDA when any layer runs on a GPU, else CPU.
std::string backends_name(const Model& m) { return m.placement().n_offloaded() > 0 ? "CUDA" : "CPU"; }
// The devices other than the CPU that hold part of the model (llama-bench's gpu_info), e.g. "cuda:0".
std::string gpu_info(const Model& m) {
  std::string s;
  for (const Backend* b : m.placement().backends())
    if (!b->host_memory()) s += (s.empty() ? "" : ", ") + std::string(b->name());
  return s;
}

// How a tg test picks the tokens it feeds (see the top of this file).
enum class Decode { kRandom, kGreedy, kGrammar };

struct Test {
  int n_prompt = 0, n_gen = 0, n_depth = 0, n_threads = 0, n_par = 1;
  std::vector<uint64_t> samples_ns;
  Decode decode = Decode::kRandom;
  double mask_ns = 0;  // kGrammar: host time on token masks over the timed repetitions
  std::string name() const {
    std::string s = n_prompt > 0 ? strprintf("pp%d", n_prompt) : strprintf("tg%d", n_gen);
    if (n_par > 1) s += strprintf(" np%d", n_par);
    if (decode != Decode::kRandom) s += decode == Decode::kGreedy ? " greedy" : " grammar";
    if (n_depth > 0) s += strprintf(" @ d%d", n_depth);
    return s;
  }
  std::vector<double> samples_ts() const {
    std::vector<double> ts;
    for (uint64_t ns : samples_ns) ts.push_back(1e9 * (n_prompt + n_gen * n_par) / static_cast<double>(ns));
    return ts;
  }
};

template <class T>
double mean(const std::vector<T>& v) {
  double s = 0;
  for (auto x : v) s += static_cast<double>(x);
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}
template <class T>
double stdev(const std::vector<T>& v) {  // sample standard deviation (n - 1), 0 for one sample
  if (v.size() < 2) return 0;
  double m = mean(v), s = 0;
  for (auto x : v) s += (static_cast<double>(x) - m) * (static_cast<double>(x) - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// Grammar decoding's setup: the hooks of each sequence, where the mask is applied, the threads that compute masks.
struct GrammarDecode {
  SequenceHooksFactory hooks;
  bool host = false;
  std::unique_ptr<ThreadPool> pool;
};

class Runner {
 public:
  Runner(Engine& e, int n_batch, uint64_t seed, GrammarDecode* g)
      : e_(e), m_(e.model()), c_(e.cache()), n_batch_(n_batch), rng_(static_cast<uint32_t>(seed)), g_(g) {}

  int32_t random_token() { return static_cast<int32_t>(rng_() % static_cast<uint32_t>(m_.hparams().n_vocab)); }

  // n tokens of sequence `seq` from position `pos`, in forward passes of n_batch.
  Status prompt(int n, int64_t pos, int32_t seq = 0) {
    for (int done = 0; done < n;) {
      const int k = std::min(n_batch_, n - done);
      batch_.clear();
      for (int i = 0; i < k; ++i) batch_.add(random_token(), static_cast<int32_t>(pos + done + i), seq, i == k - 1);
      KILN_TRY(e_.forward(batch_, nullptr));  // the last token's logits row comes back (as for gen)
      done += k;
    }
    return Status::ok();
  }
  // n forward passes of one token for each of sequences 0..n_par-1.
  Status gen(int n, int64_t pos, int n_par = 1) {
    for (int i = 0; i < n; ++i) {
      batch_.clear();
      for (int s = 0; s < n_par; ++s) batch_.add(random_token(), static_cast<int32_t>(pos + i), s, true);
      // As llama-bench / llama-batched-bench: the full logits row of every generated token comes back to host
      // memory (the step's fetch into pinned staging) and is not copied further.
      KILN_TRY(e_.forward(batch_, nullptr));
    }
    return Status::ok();
  }
  // n greedy passes of sequences 0..n_par-1 from position pos, each fed the argmax of its last row (the first pass
  // random tokens); kGrammar: under the grammar, the masks' host time added to *mask_ns.
  Status decode(int n, int64_t pos, int n_par, bool grammar, double* mask_ns) {
    const size_t W = static_cast<size_t>((m_.hparams().n_vocab + 63) / 64);
    const size_t P = static_cast<size_t>(n_par);
    last_.resize(P);
    for (int32_t& t : last_) t = random_token();
    masks_.resize(P * W);
    kinds_.assign(P, OutputKind::kArgmax);
    rows_.resize(P);
    providers_.resize(P);
    if (grammar)
      for (auto& p : providers_) p = g_->hooks().mask;
    for (int i = 0; i < n; ++i) {
      batch_.clear();
      for (size_t s = 0; s < P; ++s) batch_.add(last_[s], static_cast<int32_t>(pos + i), static_cast<int32_t>(s), true);
      int64_t t0 = now_us();
      if (grammar)
        g_->pool->parallel_for(n_par, [&](int64_t b, int64_t e) {
          for (int64_t s = b; s < e; ++s) {
            uint64_t* m = masks_.data() + static_cast<size_t>(s) * W;
            std::fill(m, m + W, ~uint64_t{0});
            const bool restricted = providers_[s]->allowed(std::span<uint64_t>(m, W));
            kinds_[s] = !restricted ? OutputKind::kArgmax : g_->host ? OutputKind::kLogits : OutputKind::kMaskedArgmax;
            rows_[s] = m;
          }
        });
      if (grammar) *mask_ns += 1e3 * static_cast<double>(now_us() - t0);
      auto out = e_.step(batch_.tokens, kinds_, false, rows_);
      if (!out) return out.status();
      t0 = now_us();
      for (size_t s = 0; s < P; ++s) {
        const size_t nv = static_cast<size_t>(out->n_vocab);
        int32_t t = kinds_[s] == OutputKind::kLogits
                        ? masked_argmax(std::span<const float>(out->row(static_cast<int32_t>(s)), nv),
                                        std::span<const uint64_t>(masks_.data() + s * W, W))
                        : out->argmax[s];
        if (grammar && t < 0) {  // the mask allowed nothing: a fresh grammar, a random token
          t = random_token();
          providers_[s] = g_->hooks().mask;
        } else if (grammar) {
          providers_[s]->accept(t);
          if (providers_[s]->finished() || m_.tokenizer().is_eog(t)) providers_[s] = g_->hooks().mask;
        }
        last_[s] = t;
      }
      if (grammar) *mask_ns += 1e3 * static_cast<double>(now_us() - t0);
    }
    return Status::ok();
  }
  // One timed repetition (the depth prefill before it is not timed).
  Result<uint64_t> run(Test& t) {
    c_.clear();
    for (int s = 0; s < t.n_par; ++s) KILN_TRY(prompt(t.n_depth, 0, s));
    const int64_t t0 = now_us();
    if (t.n_prompt > 0) KILN_TRY(prompt(t.n_prompt, t.n_depth));
    if (t.n_gen > 0 && t.decode == Decode::kRandom) KILN_TRY(gen(t.n_gen, t.n_depth, t.n_par));
    if (t.n_gen > 0 && t.decode != Decode::kRandom)
      KILN_TRY(decode(t.n_gen, t.n_depth, t.n_par, t.decode == Decode::kGrammar, &t.mask_ns));
    return static_cast<uint64_t>(now_us() - t0) * 1000;
  }
  // The warm-up: the prompt once, or one generated token.
  Status warm_up(const Test& t) {
    c_.clear();
    if (t.n_prompt > 0) return prompt(t.n_prompt, 0);
    if (t.decode == Decode::kRandom) return gen(1, 0, t.n_par);
    double ns = 0;
    return decode(1, 0, t.n_par, t.decode == Decode::kGrammar, &ns);
  }

 private:
  Engine& e_;
  Model& m_;
  KvCache& c_;
  int n_batch_;
  std::mt19937 rng_;
  Batch batch_;
  GrammarDecode* g_;  // null without a grammar flag
  // decode(): per sequence, its last token, mask words (ceil(n_vocab / 64) each), output kind, mask, grammar state.
  std::vector<int32_t> last_;
  std::vector<uint64_t> masks_;
  std::vector<OutputKind> kinds_;
  std::vector<const uint64_t*> rows_;
  std::vector<std::unique_ptr<TokenMaskProvider>> providers_;
};

struct Printer {
  std::string fmt;
  bool show_batch = false;
  bool first = true;

  void header() {
    if (fmt == "md") {
      std::string h = "| model                          |       size |     params | backend    | threads |";
      std::string s = "| ------------------------------ | ---------: | ---------: | ---------- | ------: |";
      if (show_batch) h += " n_batch |", s += " ------: |";
      h += "            test |                  t/s |";
      s += " --------------: | -------------------: |";
      std::printf("%s\n%s\n", h.c_str(), s.c_str());
    } else if (fmt == "csv") {
      std::printf("build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,model_size,"
                  "model_n_params,n_batch,n_ubatch,n_threads,type_k,type_v,n_gpu_layers,n_prompt,n_gen,n_depth,"
                  "test_time,avg_ns,stddev_ns,avg_ts,stddev_ts\n");
    } else {
      std::printf("[\n");
    }
    std::fflush(stdout);
  }

  void row(const Test& t, const Model& m, const std::string& filename, int n_batch, const CacheOptions& co,
           const std::string& cpu, const std::string& when) {
    const char* type_k = dtype_name(co.k);
    const char* type_v = dtype_name(co.v);
    const auto ts = t.samples_ts();
    const std::string type = model_type(m);
    const uint64_t size = m.stats().weight_bytes, params = m.stats().n_params;
    const std::string backends = backends_name(m);
    const int ngl = static_cast<int>(m.placement().n_offloaded());
    if (fmt == "md") {
      std::string sz = size >= (1ull << 30) ? strprintf("%.2f GiB", size / 1073741824.0)
                                            : strprintf("%.2f MiB", size / 1048576.0);
      std::string pr = params >= 1000000000ull ? strprintf("%.2f B", params / 1e9) : strprintf("%.2f M", params / 1e6);
      std::string line = strprintf("| %-30s | %10s | %10s | %-10s | %7d |", type.c_str(), sz.c_str(), pr.c_str(), backends.c_str(),
                                   t.n_threads);
      if (show_batch) line += strprintf(" %7d |", n_batch);
      std::string tps = strprintf("%.2f ± %.2f", mean(ts), stdev(ts));
      line += strprintf(" %15s | %20s |", t.name().c_str(), tps.c_str());
      std::printf("%s\n", line.c_str());
    } else if (fmt == "csv") {
      std::printf("\"%s\",\"0\",\"%s\",\"%s\",\"%s\",\"%s\",\"%s\",\"%llu\",\"%llu\",\"%d\",\"%d\",\"%d\",\"%s\",\"%s\","
                  "\"%d\",\"%d\",\"%d\",\"%d\",\"%s\",\"%.0f\",\"%.0f\",\"%f\",\"%f\"\n",
                  KILN_VERSION, cpu.c_str(), gpu_info(m).c_str(), backends.c_str(), filename.c_str(), type.c_str(),
                  (unsigned long long)size, (unsigned long long)params, n_batch, n_batch, t.n_threads, type_k, type_v, ngl,
                  t.n_prompt, t.n_gen, t.n_depth, when.c_str(), mean(t.samples_ns), stdev(t.samples_ns), mean(ts),
                  stdev(ts));
    } else {
      nlohmann::ordered_json j;
      j["build_commit"] = KILN_VERSION;
      j["build_number"] = 0;
      j["cpu_info"] = cpu;
      j["gpu_info"] = gpu_info(m);
      j["backends"] = backends;
      j["model_filename"] = filename;
      j["model_type"] = type;
      j["model_size"] = size;
      j["model_n_params"] = params;
      j["n_batch"] = n_batch;
      j["n_ubatch"] = n_batch;
      j["n_threads"] = t.n_threads;
      j["type_k"] = type_k;
      j["type_v"] = type_v;
      j["n_gpu_layers"] = ngl;
      j["n_prompt"] = t.n_prompt;
      j["n_gen"] = t.n_gen;
      j["n_depth"] = t.n_depth;
      j["n_parallel"] = t.n_par;
      j["test"] = t.name();
      j["test_time"] = when;
      j["avg_ns"] = static_cast<uint64_t>(mean(t.samples_ns));
      j["stddev_ns"] = static_cast<uint64_t>(stdev(t.samples_ns));
      j["avg_ts"] = mean(ts);
      j["stddev_ts"] = stdev(ts);
      j["samples_ns"] = t.samples_ns;
      j["samples_ts"] = ts;
      if (t.decode == Decode::kGrammar) j["mask_ns_per_token"] = t.mask_ns / (t.samples_ns.size() * t.n_gen * t.n_par);
      std::string body = j.dump(2);
      std::string indented = "  ";  // one level inside the top-level array
      for (char c : body) {
        indented += c;
        if (c == '\n') indented += "  ";
      }
      std::printf("%s%s", first ? "" : ",\n", indented.c_str());
    }
    first = false;
    std::fflush(stdout);
  }

  void footer() {
    if (fmt == "md") std::printf("\nbuild: kiln %s\n", KILN_VERSION);
    if (fmt == "json") std::printf("\n]\n");
    std::fflush(stdout);
  }
};

int bench_main(int argc, char** argv) {
  ArgParser args("bench", "Benchmark prompt processing (pp) and generation (tg) like llama-bench. With a grammar "
                          "flag (--grammar, --grammar-file, -j, -jf) each tg test runs as greedy decoding twice, free "
                          "(\"greedy\") and under the grammar (\"grammar\"), and the host time on token masks per "
                          "token goes to stderr.");
  std::string model_path, p_list = "512", n_list = "128", d_list = "0", np_list = "1", t_list, fmt = "md";
  std::string fa_list;
  CacheOptions cache;  // -ctk, -ctv, --kv-type (-c is derived from the tests below)
  int reps = 5, n_batch = defaults::kBatch;
  uint64_t seed = 1234;
  ModelSource dev_src;  // --device, -ngl, the expert options (-m and -t are lists of their own here)
  args.option({"-m", "--model"}, &model_path, "FILE",
              have_embedded_model() ? "GGUF model file (default: the embedded model)" : "GGUF model file");
  args.option({"-p", "--n-prompt"}, &p_list, "N[,N..]", "prompt lengths (default 512; 0: none)");
  args.option({"-n", "--n-gen"}, &n_list, "N[,N..]", "generation lengths (default 128; 0: none)");
  args.option({"-d", "--n-depth"}, &d_list, "N[,N..]", "tokens already in the cache before each test (default 0)");
  args.option({"-np", "--parallel"}, &np_list, "P[,P..]",
              "tg only: P sequences decoding together, one token each per pass (default 1; at most 256)");
  args.option({"-t", "--threads"}, &t_list, "N[,N..]", "CPU threads (default: all cores)");
  args.option({"-r", "--repetitions"}, &reps, "N", "timed repetitions per test (default 5)");
  args.option({"-b", "--batch-size"}, &n_batch, "N",
              "tokens per forward pass for pp (default " + std::to_string(defaults::kBatch) + ")");
  args.option({"--device"}, &dev_src.device, "DEV", "where to run: auto (a GPU when present), cpu, cuda, cuda:N");
  args.option({"-ngl", "--n-gpu-layers"}, &dev_src.n_gpu_layers, "N",
              "with a GPU: the last N layers, then the output, on it (default -1: all)");
  args.option({"-sm", "--split-mode"}, &dev_src.split_mode, "MODE",
              "several devices: none (default), layer or tensor (as run; llama-bench's name)");
  args.option({"-ts", "--tensor-split"}, &dev_src.tensor_split, "A,B,...", "proportions per device (default equal)");
  args.option({"-mg", "--main-gpu"}, &dev_src.main_gpu, "N", "the GPU of --split-mode none (default 0)");
  add_expert_options(args, &dev_src);
  args.option({"-o", "--output"}, &fmt, "FMT", "md (default), csv or json");
  add_cache_type_options(args, &cache.kv_type, &cache.type_k, &cache.type_v);
  args.option({"-fa", "--flash-attn"}, &fa_list, "0|1[,..]",
              "accepted for llama-bench's scripts; no effect (kiln's attention is always flash-style)");
  args.option({"-s", "--seed"}, &seed, "N", "seed of the random prompt tokens (default 1234)");
  GrammarArgs grammar_args;
  add_grammar_options(args, &grammar_args);
  std::string mask_path = "device";
  args.option({"--mask-path"}, &mask_path, "WHERE",
              "with a grammar: device (default: the masked argmax on the device) or host (rows masked on the host)");
  if (Status st = args.parse(argc, argv); !st) return fail("bench", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (fmt != "md" && fmt != "csv" && fmt != "json")
    return fail("bench", make_error(ErrorCode::kInvalidArgument, "-o: '%s' is not md, csv or json", fmt.c_str()));
  if (reps < 1) return fail("bench", make_error(ErrorCode::kInvalidArgument, "-r: must be >= 1 (got %d)", reps));
  auto grammar = grammar_option(args, grammar_args);
  if (!grammar) return fail("bench", grammar.status());
  if (mask_path != "device" && mask_path != "host")
    return fail("bench", make_error(ErrorCode::kInvalidArgument, "--mask-path: '%s' is not device or host",
                                    mask_path.c_str()));
  if (args.seen("--mask-path") && !grammar->parsed)
    return fail("bench", make_error(ErrorCode::kInvalidArgument, "--mask-path: needs a grammar (--grammar, "
                                    "--grammar-file, --json-schema or --json-schema-file)"));
  if (Status st = check_generation_options(0, n_batch); !st) return fail("bench", st);
  if (Status st = check_cache_options(cache); !st) return fail("bench", st);
  if (args.seen("-fa") || args.seen("--flash-attn")) {
    for (size_t i = 0; i <= fa_list.size();) {
      size_t j = std::min(fa_list.find(',', i), fa_list.size());
      const std::string v = fa_list.substr(i, j - i);
      if (v != "0" && v != "1" && v != "on" && v != "off" && v != "auto")
        return fail("bench", make_error(ErrorCode::kInvalidArgument, "-fa: '%s' is not 0, 1, on, off or auto",
                                        v.c_str()));
      i = j + 1;
    }
    note_once("-fa", "kiln: -fa has no effect: kiln's attention is always flash-style (online softmax over KV blocks)");
  }
  {
    ModelSource check = dev_src;
    if (Status st = check_model_options(check); !st) return fail("bench", st);
  }
  auto pl = parse_list("-p", p_list);
  auto nl = parse_list("-n", n_list);
  auto dl = parse_list("-d", d_list);
  if (!pl) return fail("bench", pl.status());
  if (!nl) return fail("bench", nl.status());
  if (!dl) return fail("bench", dl.status());
  auto npl = parse_list("-np", np_list);
  if (!npl) return fail("bench", npl.status());
  int max_np = 1;
  for (int np : *npl) {
    if (np < 1 || np > 256)
      return fail("bench", make_error(ErrorCode::kInvalidArgument, "-np: %d is not in 1..256", np));
    max_np = std::max(max_np, np);
  }
  std::vector<int> tl = {0};
  if (!t_list.empty()) {
    auto r = parse_list("-t", t_list);
    if (!r) return fail("bench", r.status());
    tl = *r;
  }
  int max_p = 0, max_n = 0, max_d = 0;
  for (int p : *pl) max_p = std::max(max_p, p);
  for (int n : *nl) max_n = std::max(max_n, n);
  for (int d : *dl) max_d = std::max(max_d, d);
  if (max_p == 0 && max_n == 0) return fail("bench", make_error(ErrorCode::kInvalidArgument, "nothing to run: -p and -n are all 0"));

  Printer out{fmt, args.seen("-b") || args.seen("--batch-size")};
  const std::string cpu = cpu_info();
  bool printed_header = false;
  for (int threads : tl) {
    ModelSource src = dev_src;
    src.path = model_path;
    src.n_threads = threads;
    auto loaded = load_model(src);
    if (!loaded) return fail("bench", loaded.status());
    Model& model = *loaded->model;
    const int shown_threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    CacheOptions co = cache;
    // Whole blocks per sequence: each of the max_np sequences holds its own last, partial block.
    const int per_seq = max_d + std::max(max_p, max_n);
    co.n_ctx = (per_seq + defaults::kBlockSize - 1) / defaults::kBlockSize * defaults::kBlockSize;
    // max_np sequence slots of n_ctx each; a tg pass brings back max_np logits rows.
    auto engine = make_engine(model, co, max_np, std::max(n_batch, max_np), std::max(max_np, 8));
    if (!engine) return fail("bench", engine.status());
    if (!printed_header) {  // after the first load: a failed load leaves no half table (or invalid JSON) on stdout
      out.header();
      printed_header = true;
    }
    GrammarDecode gd;
    if (grammar->parsed) {
      auto hooks = grammar_hooks(*grammar, model.tokenizer());
      if (!hooks) return fail("bench", hooks.status());
      gd.hooks = std::move(hooks).value();
      gd.host = mask_path == "host" || !(*engine)->supports_masked_argmax();
      if (mask_path == "device" && gd.host)
        note_once("--mask-path", "kiln bench: the output backend has no masked argmax: the rows are masked on the host");
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      gd.pool = std::make_unique<ThreadPool>(std::min(max_np, cores));
    }
    Runner runner(**engine, n_batch, seed, grammar->parsed ? &gd : nullptr);
    for (int d : *dl) {
      std::vector<Test> tests;
      for (int p : *pl)
        if (p > 0) tests.push_back({p, 0, d, shown_threads, 1, {}});
      for (int n : *nl)
        if (n > 0)
          for (int np : *npl) {
            if (!grammar->parsed) tests.push_back({0, n, d, shown_threads, np, {}});
            for (Decode dm : {Decode::kGreedy, Decode::kGrammar})
              if (grammar->parsed) tests.push_back({0, n, d, shown_threads, np, {}, dm});
          }
      for (Test& t : tests) {
        // Warm-up (as llama-bench: the prompt once, or one generated token).
        if (Status st = runner.warm_up(t); !st) return fail("bench", st);
        for (int r = 0; r < reps; ++r) {
          auto ns = runner.run(t);
          if (!ns) return fail("bench", ns.status().with_context(t.name()));
          t.samples_ns.push_back(std::max<uint64_t>(*ns, 1));
        }
        char when[32];
        std::time_t now = std::time(nullptr);
        std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
        out.row(t, model, loaded->name, n_batch, cache, cpu, when);
        if (t.decode == Decode::kGrammar)
          std::fprintf(stderr, "kiln bench: %s: token masks %.4f ms per token on the host (%s)\n", t.name().c_str(),
                       t.mask_ns / 1e6 / (static_cast<double>(reps) * t.n_gen * t.n_par),
                       gd.host ? "the rows masked on the host" : "masked argmax on the device");
      }
    }
  }
  out.footer();
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("bench", "benchmark prompt processing and generation (llama-bench format)", bench_main);

}  // namespace kiln::cli
