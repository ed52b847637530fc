// kiln embed: the embedding of each input (-p TEXT, repeatable; -f FILE: one input per non-empty line), printed on
// stdout as one JSON line per input, in input order: [x0, x1, ...] (pooling none: [[...], [...], ...], one vector
// per token; rank: the classification head's outputs). Every input goes to the engine loop at once, -np of them
// side by side in each step, as the server's /v1/embeddings does (runtime/embedding.h). Timings on stderr.
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/engine_options.h"
#include "cli/model_source.h"
#include "runtime/embedding.h"
#include "runtime/scheduler.h"
#include "util/timer.h"

namespace kiln::cli {
namespace {

struct EmbedArgs {
  ModelSource src;
  EngineArgs eng;
  std::vector<std::string> prompts;
  std::string file, pooling;
  int32_t normalize = 2;
};

// The inputs: every -p, then the non-empty lines of -f.
Result<std::vector<std::string>> inputs(const EmbedArgs& a) {
  std::vector<std::string> in = a.prompts;
  if (!a.file.empty()) {
    const int64_t ctx_bound = a.eng.cache.n_ctx > 0 ? a.eng.cache.n_ctx : defaults::kContextCap;
    KILN_ASSIGN_OR_RETURN(std::string text,
                          read_bounded(a.file, static_cast<uint64_t>(ctx_bound * kMaxBytesPerToken) * 64, "-f",
                                       "more text than 64 contexts can hold"));
    size_t b = 0;
    while (b <= text.size()) {
      size_t e = text.find('\n', b);
      if (e == std::string::npos) e = text.size();
      std::string line = text.substr(b, e - b);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) in.push_back(std::move(line));
      b = e + 1;
    }
  }
  if (in.empty()) return make_error(ErrorCode::kInvalidArgument, "no input: pass -p TEXT (repeatable) or -f FILE");
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].empty()) return make_error(ErrorCode::kInvalidArgument, "-p: input %zu is empty", i);
  return in;
}

// Shortest text that reads back as the same float.
void append_float(std::string* out, float x) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  out->append(buf, r.ptr);
}

std::string vector_line(const std::vector<float>& v, int64_t n_embd, bool per_token) {
  std::string s = per_token ? "[[" : "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += per_token && i % static_cast<size_t>(n_embd) == 0 ? "], [" : ", ";
    append_float(&s, v[i]);
  }
  s += per_token ? "]]\n" : "]\n";
  return s;
}

int embed_main(int argc, char** argv) {
  ArgParser args("embed", "Embeddings of texts: one JSON line per input on stdout (timings on stderr).");
  EmbedArgs a;
  add_model_options(args, &a.src);
  args.multi({"-p", "--prompt"}, &a.prompts, "TEXT", "an input (repeatable: one line of output each)");
  args.option({"-f", "--file"}, &a.file, "FILE", "inputs from a file, one per non-empty line (after the -p ones)");
  args.option({"--pooling"}, &a.pooling, "TYPE",
              "none|mean|cls|last|rank (default: the model file's pooling_type, else none)");
  args.option({"--embd-normalize"}, &a.normalize, "N",
              "-1 none, 0 max-abs (int16 range), 1 taxicab, 2 euclidean (default), p > 2 p-norm");
  add_engine_options(args, &a.eng);
  int32_t parallel = 0;
  args.option({"-np", "--parallel"}, &parallel, "N", "inputs computed side by side, 1..256 (default min(inputs, 64))");
  if (Status st = args.parse(argc, argv); !st) return fail("embed", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  std::optional<Pooling> pooling;
  if (!a.pooling.empty()) {
    auto p = parse_pooling(a.pooling, "--pooling");
    if (!p) return fail("embed", p.status());
    pooling = *p;
  }
  if (Status st = check_normalize(a.normalize, "--embd-normalize"); !st) return fail("embed", st);
  if (args.seen("-np") && (parallel < 1 || parallel > 256))
    return fail("embed", make_error(ErrorCode::kInvalidArgument, "--parallel: must be in [1, 256] (got %d)", parallel));
  if (Status st = check_model_options(a.src); !st) return fail("embed", st);
  if (Status st = check_engine_options(a.eng); !st) return fail("embed", st);
  auto in = inputs(a);
  if (!in) return fail("embed", in.status());
  a.eng.max_seqs = parallel > 0 ? parallel : static_cast<int32_t>(std::min<size_t>(in->size(), 64));

  auto loaded = load_model(a.src, /*show_progress=*/true);
  if (!loaded) return fail("embed", loaded.status());
  auto cfg = engine_config(*loaded->model, a.eng);
  if (!cfg) return fail("embed", cfg.status());
  cfg->prefix_cache = false;
  cfg->embeddings = true;
  cfg->pooling = pooling;
  auto sched_or = Scheduler::create(std::move(loaded->model), *cfg);
  if (!sched_or) return fail("embed", sched_or.status());
  Scheduler& sched = **sched_or;
  const EmbeddingSetup& es = sched.embedding();

  Timer timer;
  std::vector<std::shared_ptr<RequestHandle>> hs;
  int64_t n_tokens = 0;
  for (size_t i = 0; i < in->size(); ++i) {
    GenRequest req;
    req.embed = true;
    req.prompt = embedding_tokens(sched.tokenizer(), (*in)[i]);
    n_tokens += static_cast<int64_t>(req.prompt.size());
    auto h = sched.submit(std::move(req));
    if (!h) return fail("embed", h.status().with_context("input " + std::to_string(i)));
    hs.push_back(*h);
  }
  std::string out;
  for (size_t i = 0; i < hs.size(); ++i) {
    hs[i]->wait_all();
    if (hs[i]->finish_reason() == FinishReason::kError)
      return fail("embed", hs[i]->error().with_context("input " + std::to_string(i)));
    std::vector<float> v = hs[i]->take_embedding();
    if (v.empty())
      return fail("embed", make_error(ErrorCode::kInternal, "input %zu: no embedding (%s)", i,
                                      finish_reason_name(hs[i]->finish_reason())));
    const bool per_token = es.pooling == Pooling::kNone;
    if (es.pooling != Pooling::kRank)  // every vector (each token's with none); a head's scores stay as they are
      for (size_t k = 0; k < v.size(); k += static_cast<size_t>(es.n_embd))
        normalize(std::span<float>(v.data() + k, static_cast<size_t>(es.n_embd)), a.normalize);
    out += vector_line(v, es.n_embd, per_token);
  }
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  const double s = timer.seconds();
  std::fprintf(stderr, "kiln embed: %zu inputs, %lld tokens in %.3f s (%.1f tok/s), pooling %s, %lld dims\n",
               hs.size(), (long long)n_tokens, s, s > 0 ? n_tokens / s : 0.0, pooling_name(es.pooling),
               (long long)es.n_out);
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("embed", "embeddings of texts (pooled final hidden states) as JSON", embed_main);

}  // namespace kiln::cli
