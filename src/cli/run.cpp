// kiln run: generate text from a prompt, streaming it to stdout; timings on stderr.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/model_source.h"
#include "runtime/generate.h"
#include "runtime/prompt.h"

namespace kiln::cli {
namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kIo, "cannot open '%s'", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "1,2,3" / "[1, 2, 3]", or the name of a file holding such a list.
Result<std::vector<int32_t>> parse_tokens(const std::string& arg) {
  auto ids = parse_id_list(arg);
  if (ids) return ids;
  if (access(arg.c_str(), R_OK) == 0) {
    KILN_ASSIGN_OR_RETURN(std::string text, read_text(arg));
    auto from_file = parse_id_list(text);
    if (!from_file) return from_file.status().with_context("--tokens " + arg);
    return from_file;
  }
  return ids.status().with_context("--tokens");
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }


int run_main(int argc, char** argv) {
  ArgParser args("run", "Generate text from a prompt (streamed to stdout; timings on stderr).");
  ModelSource src;
  CacheOptions cache_opt;
  GenerateOptions gen;
  std::string prompt, prompt_file, tokens_arg;
  bool print_ids = false, no_bos = false;
  int n_batch = defaults::kBatch;
  add_model_options(args, &src);
  args.option({"-p", "--prompt"}, &prompt, "TEXT", "prompt text");
  args.option({"-f", "--file"}, &prompt_file, "FILE", "read the prompt from a file");
  args.option({"--tokens"}, &tokens_arg, "IDS", "prompt as token ids '1,2,3' (or a file of them), fed verbatim");
  args.option({"-n", "--n-predict"}, &gen.seq.n_predict, "N", "tokens to generate; -1: until EOG or context full (default -1)");
  add_cache_options(args, &cache_opt);
  args.option({"-b", "--batch-size"}, &n_batch, "N",
              "prompt tokens per forward pass (default " + std::to_string(defaults::kBatch) + ")");
  add_sampling_options(args, &gen.seq.sampling);
  args.flag({"--ids"}, &print_ids, "print the generated ids as one line [id, ...] instead of text");
  args.flag({"--ignore-eos"}, &gen.seq.ignore_eos, "do not stop at end-of-generation tokens");
  args.flag({"--no-bos"}, &no_bos, "do not add the BOS token to a text prompt");
  if (Status st = args.parse(argc, argv); !st) return fail("run", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  gen.n_batch = n_batch;
  int n_sources = !prompt.empty() + !prompt_file.empty() + !tokens_arg.empty();
  if (n_sources > 1) return fail("run", make_error(ErrorCode::kInvalidArgument, "pass only one of -p, -f and --tokens"));

  std::vector<int32_t> ids;
  if (!tokens_arg.empty()) {
    auto r = parse_tokens(tokens_arg);
    if (!r) return fail("run", r.status());
    ids = std::move(r).value();
    if (ids.empty()) return fail("run", make_error(ErrorCode::kInvalidArgument, "--tokens: the list is empty"));
  } else if (!prompt_file.empty()) {
    auto r = read_text(prompt_file);
    if (!r) return fail("run", r.status().with_context("-f"));
    prompt = std::move(r).value();
  }

  if (n_batch < 1) return fail("run", make_error(ErrorCode::kInvalidArgument, "-b: must be >= 1 (got %d)", n_batch));
  if (Status st = check_model_options(src); !st) return fail("run", st);
  if (Status st = check_cache_options(cache_opt); !st) return fail("run", st);
  auto loaded = load_model(src, /*show_progress=*/true);
  if (!loaded) return fail("run", loaded.status());
  Model& model = *loaded->model;
  auto engine = make_engine(model, cache_opt, 1, n_batch);
  if (!engine) return fail("run", engine.status());

  if (tokens_arg.empty()) {
    ids = encode_prompt(model.tokenizer(), prompt, /*add_bos=*/!no_bos);
    if (ids.empty())
      return fail("run", make_error(ErrorCode::kInvalidArgument, "empty prompt: pass -p TEXT, -f FILE or --tokens IDS"));
  }

  const int64_t n_ctx = effective_ctx(model, cache_opt.n_ctx);
  Generator g(**engine, 0, gen, n_ctx);
  if (Status st = g.validate(); !st) return fail("run", st);
  g.timings().load_s = loaded->load_seconds;
  if (Status st = g.feed(ids); !st) return fail("run", st.with_context("prompt"));

  std::vector<int32_t> out_ids;
  auto on_token = [&](int32_t id, const std::string& piece) {
    if (id >= 0) out_ids.push_back(id);
    if (!print_ids && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  auto stop = g.generate(on_token);
  if (!stop) return fail("run", stop.status());
  if (print_ids) {
    std::string line = "[";
    for (size_t i = 0; i < out_ids.size(); ++i) line += (i ? ", " : "") + std::to_string(out_ids[i]);
    line += "]\n";
    std::fputs(line.c_str(), stdout);
  } else {
    std::fputs("\n", stdout);
  }
  std::fflush(stdout);

  const Timings& t = g.timings();
  if (*stop == StopReason::kContextFull)
    std::fprintf(stderr, "kiln run: context full (%lld tokens): generation stopped; raise -c for more\n",
                 (long long)n_ctx);
  std::fprintf(stderr, "kiln run: load %.3f s, model %.2f MiB, kv cache %.2f MiB (%s, %lld tokens), peak RSS %.1f MiB\n",
               t.load_s, mib(model.stats().weight_bytes), mib((*engine)->state().kv_bytes()),
               cache_opt.kv_type.c_str(), (long long)n_ctx, mib(peak_rss_bytes()));
  std::fprintf(stderr, "kiln run: prompt %lld tokens in %.3f s (%.2f tok/s)\n", (long long)t.n_prompt, t.prompt_s,
               t.prompt_tps());
  std::fprintf(stderr, "kiln run: generated %lld tokens in %.3f s (%.2f tok/s), stop: %s, seed %llu\n",
               (long long)t.n_gen, t.gen_s, t.gen_tps(), stop_reason_name(*stop),
               (unsigned long long)g.sequence().sampler().seed());
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("run", "generate text from a prompt", run_main);

}  // namespace kiln::cli
