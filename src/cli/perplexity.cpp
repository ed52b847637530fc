// kiln perplexity: perplexity of a model over a text file, as llama.cpp's llama-perplexity computes it: the text is
// tokenized once (BOS first when the model adds one) and cut into non-overlapping windows of n_ctx tokens; each
// window is evaluated from an empty cache with its first token replaced by BOS, and only its second half is
// scored (positions n_ctx/2 .. n_ctx-2 predicting the next token), so every scored token sees at least n_ctx/2
// tokens of context. PPL = exp(mean negative log-likelihood); the +/- is the standard error of the mean NLL carried
// through exp (delta method), as llama.cpp reports it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/model_source.h"
#include "model/batch.h"
#include "runtime/prompt.h"
#include "util/timer.h"

namespace kiln::cli {
namespace {

// -log softmax(row)[target], in double.
double nll(const float* row, int64_t n_vocab, int32_t target) {
  float mx = row[0];
  for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
  return std::log(sum) - (static_cast<double>(row[target]) - mx);
}

// The default -b: the window, up to this.
constexpr int kMaxDefaultBatch = 8192;
// The most text perplexity reads (as tokenize).
constexpr uint64_t kMaxText = uint64_t{256} << 20;

int perplexity_main(int argc, char** argv) {
  ArgParser args("perplexity", "Perplexity over a text file in non-overlapping windows of -c tokens.");
  ModelSource src;
  CacheOptions cache_opt;
  cache_opt.n_ctx = defaults::kPerplexityCtx;
  std::string file;
  int n_batch = 0;
  int64_t max_windows = 0;
  add_model_options(args, &src);
  args.option({"-f", "--file"}, &file, "FILE", "text to score");
  add_cache_options(args, &cache_opt,
                    "window length in tokens (default " + std::to_string(defaults::kPerplexityCtx) + ")");
  args.option({"-b", "--batch-size"}, &n_batch, "N",
              "tokens per forward pass (default: the window, -c, at most " + std::to_string(kMaxDefaultBatch) + ")");
  args.option({"--chunks"}, &max_windows, "N", "score at most N windows (default: all)");
  if (Status st = args.parse(argc, argv); !st) return fail("perplexity", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (file.empty()) return fail("perplexity", make_error(ErrorCode::kInvalidArgument, "-f FILE is required"));
  if (Status st = check_model_options(src); !st) return fail("perplexity", st);
  if (Status st = check_cache_options(cache_opt); !st) return fail("perplexity", st);
  const int64_t n_ctx = cache_opt.n_ctx;
  if (n_ctx < 4) return fail("perplexity", make_error(ErrorCode::kInvalidArgument, "-c: must be >= 4 (got %lld)", (long long)n_ctx));
  if (n_batch != 0)
    if (Status st = check_generation_options(0, n_batch); !st) return fail("perplexity", st);
  if (n_batch == 0) n_batch = static_cast<int>(std::min<int64_t>(n_ctx, kMaxDefaultBatch));
  if (n_batch > n_ctx) n_batch = static_cast<int>(n_ctx);
  if (max_windows < 0)
    return fail("perplexity", make_error(ErrorCode::kInvalidArgument, "--chunks: must be >= 0 (got %lld)",
                                         (long long)max_windows));

  auto text = read_bounded(file, kMaxText, "-f", "the most perplexity reads");
  if (!text) return fail("perplexity", text.status());

  auto loaded = load_model(src, /*show_progress=*/true);
  if (!loaded) return fail("perplexity", loaded.status());
  Model& model = *loaded->model;
  const Tokenizer& tok = model.tokenizer();
  auto engine = make_engine(model, cache_opt, 1, n_batch, n_batch);
  if (!engine) return fail("perplexity", engine.status());

  // BOS (when the tokenizer wants one) replaces position 0 of every window below.
  std::vector<int32_t> tokens = encode_prompt(tok, *text, /*add_bos=*/true, /*parse_special=*/false);
  const bool add_bos = !tokens.empty() && tok.bos() >= 0 && tokens[0] == tok.bos() && tok.add_bos();
  int64_t n_windows = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (max_windows > 0) n_windows = std::min(n_windows, max_windows);
  if (n_windows == 0)
    return fail("perplexity", make_error(ErrorCode::kInvalidArgument,
                                         "%s has %zu tokens: at least one window of -c %lld is needed", file.c_str(),
                                         tokens.size(), (long long)n_ctx));
  std::fprintf(stderr, "kiln perplexity: %zu tokens, %lld windows of %lld, scoring positions %lld..%lld of each\n",
               tokens.size(), (long long)n_windows, (long long)n_ctx, (long long)(n_ctx / 2), (long long)(n_ctx - 2));

  const int64_t n_vocab = model.hparams().n_vocab;
  const int64_t first = n_ctx / 2;
  double sum_nll = 0, sum_nll2 = 0;
  int64_t count = 0;
  Batch batch;
  std::vector<float> logits;
  Timer total;
  for (int64_t w = 0; w < n_windows; ++w) {
    const int64_t start = w * n_ctx;
    (*engine)->cache().clear();
    double w_nll = 0;
    int64_t w_count = 0;
    for (int64_t b = 0; b < n_ctx; b += n_batch) {
      const int64_t k = std::min<int64_t>(n_batch, n_ctx - b);
      batch.clear();
      for (int64_t i = 0; i < k; ++i) {
        const int64_t pos = b + i;
        int32_t t = tokens[start + pos];
        if (pos == 0 && add_bos) t = tok.bos();
        batch.add(t, static_cast<int32_t>(pos), 0, pos >= first && pos <= n_ctx - 2);
      }
      if (Status st = (*engine)->forward(batch, &logits); !st)
        return fail("perplexity", st.with_context(strprintf("window %lld", (long long)w)));
      size_t row = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t pos = b + i;
        if (!(pos >= first && pos <= n_ctx - 2)) continue;
        const double v = nll(logits.data() + row * n_vocab, n_vocab, tokens[start + pos + 1]);
        ++row;
        w_nll += v;
        sum_nll += v;
        sum_nll2 += v * v;
        ++w_count;
        ++count;
      }
    }
    std::printf("[%lld] window ppl %.4f, running ppl %.4f\n", (long long)(w + 1), std::exp(w_nll / w_count),
                std::exp(sum_nll / count));
    std::fflush(stdout);
  }
  const double mean = sum_nll / count;
  const double var = count > 1 ? std::max(0.0, (sum_nll2 / count - mean * mean) * count / (count - 1)) : 0.0;
  const double ppl = std::exp(mean);
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * std::sqrt(var / count));
  std::fprintf(stderr, "kiln perplexity: %lld tokens scored in %.2f s (%.1f tok/s evaluated)\n", (long long)count,
               total.seconds(), n_windows * n_ctx / std::max(total.seconds(), 1e-9));
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("perplexity", "perplexity of a model over a text file", perplexity_main);

}  // namespace kiln::cli
