// kiln run: generate text from a prompt, streaming it to stdout; timings on stderr.
// --chat: the prompt (-p or -f) is one user message (after -sys TEXT as the system message), rendered with the
// model's chat template as `kiln chat` renders a turn (runtime/prompt.h's ChatPrompt; --chat-template-file and
// --chat-template-kwargs as there); reasoning (<think>...</think>) goes to stderr, the content to stdout.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/chat_cli.h"
#include "cli/model_source.h"
#include "runtime/generate.h"
#include "runtime/prompt.h"

namespace kiln::cli {
namespace {

// The bytes of a --tokens file that can hold n_ctx ids: "2147483647, " is 12 bytes; whitespace beyond that is
// generous slack.
constexpr int64_t kMaxBytesPerId = 32;

// "1,2,3" / "[1, 2, 3]", or the name of a file holding such a list (read up to what n_ctx ids can take).
Result<std::vector<int32_t>> parse_tokens(const std::string& arg, int64_t n_ctx) {
  auto ids = parse_id_list(arg);
  if (ids) return ids;
  if (access(arg.c_str(), R_OK) == 0) {
    KILN_ASSIGN_OR_RETURN(
        std::string text,
        read_bounded(arg, static_cast<uint64_t>(n_ctx * kMaxBytesPerId + 4096), "--tokens",
                     strprintf("more than a list of the %lld ids the context holds; raise -c", (long long)n_ctx)));
    auto from_file = parse_id_list(text);
    if (!from_file) return from_file.status().with_context("--tokens " + arg);
    return from_file;
  }
  return ids.status().with_context("--tokens");
}

// Whether any byte of `s` is visible text (not whitespace, not a control character).
bool has_visible_text(const std::string& s) {
  for (unsigned char c : s)
    if (c > ' ' && c != 0x7f) return true;
  return false;
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
  args.option({"-p", "--prompt"}, &prompt, "TEXT", "prompt text (none: generate from BOS alone)");
  args.option({"-f", "--file"}, &prompt_file, "FILE", "read the prompt from a file (at most what -c can hold)");
  args.option({"--tokens"}, &tokens_arg, "IDS", "prompt as token ids '1,2,3' (or a file of them), fed verbatim");
  args.option({"-n", "--n-predict"}, &gen.seq.n_predict, "N", "tokens to generate; -1: until EOG or context full (default -1)");
  add_cache_options(args, &cache_opt);
  args.option({"-b", "--batch-size"}, &n_batch, "N",
              "prompt tokens per forward pass (default " + std::to_string(defaults::kBatch) + ")");
  add_sampling_options(args, &gen.seq.sampling);
  args.flag({"--ids"}, &print_ids, "print the generated ids as one line [id, ...] instead of text");
  args.flag({"--ignore-eos"}, &gen.seq.ignore_eos, "do not stop at end-of-generation tokens");
  args.flag({"--no-bos"}, &no_bos, "do not add the BOS token to a text prompt");
  bool chat = false, verbose_prompt = false;
  std::string system_prompt;
  ChatTemplateArgs tpl_args;
  args.flag({"--chat"}, &chat, "the prompt is a user message, rendered with the model's chat template");
  args.option({"-sys", "--system-prompt"}, &system_prompt, "TEXT", "system message (implies --chat)");
  add_chat_template_options(args, &tpl_args);
  args.flag({"--verbose-prompt"}, &verbose_prompt, "print the prompt text and its token count on stderr");
  if (Status st = args.parse(argc, argv); !st) return fail("run", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  gen.n_batch = n_batch;
  const bool have_p = args.seen("-p"), have_f = args.seen("-f"), have_tokens = args.seen("--tokens");
  if (have_p + have_f + have_tokens > 1)
    return fail("run", make_error(ErrorCode::kInvalidArgument, "pass only one of -p, -f and --tokens"));
  // The chat options imply --chat.
  for (const char* f : {"-sys", "--chat-template", "--chat-template-file", "--chat-template-kwargs"})
    if (args.seen(f)) chat = true;
  if (chat && have_tokens)
    return fail("run", make_error(ErrorCode::kInvalidArgument, "--chat renders text: pass -p TEXT or -f FILE, not --tokens"));
  if (chat && !have_p && !have_f)
    return fail("run", make_error(ErrorCode::kInvalidArgument, "--chat: pass the user message with -p TEXT or -f FILE"));
  ChatPromptOptions popts;
  if (chat) {
    auto o = chat_prompt_options(tpl_args);
    if (!o) return fail("run", o.status());
    popts = std::move(o).value();
  }

  // Every flag is checked before the model loads.
  if (Status st = check_generation_options(gen.seq.n_predict, n_batch); !st) return fail("run", st);
  if (Status st = check_sampling_options(gen.seq.sampling); !st) return fail("run", st);
  if (Status st = check_model_options(src); !st) return fail("run", st);
  if (Status st = check_cache_options(cache_opt); !st) return fail("run", st);
  // The most tokens the context can hold: -c, or (-c 0) the default's cap; the model's own is checked after loading.
  const int64_t ctx_bound = cache_opt.n_ctx > 0 ? cache_opt.n_ctx : defaults::kContextCap;

  std::vector<int32_t> ids;
  if (have_tokens) {
    if (tokens_arg.empty()) return fail("run", make_error(ErrorCode::kInvalidArgument, "--tokens: the list is empty"));
    auto r = parse_tokens(tokens_arg, ctx_bound);
    if (!r) return fail("run", r.status());
    ids = std::move(r).value();
    if (ids.empty()) return fail("run", make_error(ErrorCode::kInvalidArgument, "--tokens: the list is empty"));
    if (static_cast<int64_t>(ids.size()) > ctx_bound)
      return fail("run", make_error(ErrorCode::kOutOfRange, "--tokens: %zu ids are more than the context of %lld "
                                    "tokens holds (raise -c)", ids.size(), (long long)ctx_bound));
  } else if (have_f) {
    auto r = read_bounded(prompt_file, static_cast<uint64_t>(ctx_bound * kMaxBytesPerToken), "-f",
                          strprintf("more text than a context of %lld tokens can hold; raise -c", (long long)ctx_bound));
    if (!r) return fail("run", r.status());
    prompt = std::move(r).value();
    if (prompt.empty())
      return fail("run", make_error(ErrorCode::kInvalidArgument, "-f '%s': the file is empty", prompt_file.c_str()));
  }

  auto loaded = load_model(src, /*show_progress=*/true);
  if (!loaded) return fail("run", loaded.status());
  Model& model = *loaded->model;
  auto engine = make_engine(model, cache_opt, 1, n_batch);
  if (!engine) return fail("run", engine.status());
  const int64_t n_ctx = effective_ctx(model, cache_opt.n_ctx);

  std::optional<ChatPrompt> chat_prompt;
  std::string rendered;
  if (chat) {
    popts.model_name = loaded->name;
    auto cp = ChatPrompt::create(model.tokenizer(), popts);
    if (!cp) return fail("run", cp.status());
    chat_prompt = std::move(cp).value();
    if (!chat_prompt->notice().empty()) std::fprintf(stderr, "kiln run: %s\n", chat_prompt->notice().c_str());
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    auto r = chat_prompt->render(messages);
    if (!r) return fail("run", r.status());
    rendered = std::move(r).value();
    ids = chat_prompt->tokenize(rendered, /*add_bos=*/!no_bos);
  } else if (!have_tokens) {
    ids = encode_prompt(model.tokenizer(), prompt, /*add_bos=*/!no_bos);
    if (ids.empty())
      return fail("run", make_error(ErrorCode::kInvalidArgument, "empty prompt: pass -p TEXT, -f FILE or --tokens IDS"));
  }
  if (verbose_prompt)
    std::fprintf(stderr, "kiln run: prompt (%s, %zu tokens):\n%s\n",
                 chat_prompt ? chat_prompt->describe().c_str() : have_tokens ? "token ids" : "text", ids.size(),
                 chat_prompt ? rendered.c_str() : have_tokens ? "" : prompt.c_str());
  if (static_cast<int64_t>(ids.size()) > n_ctx)
    return fail("run", make_error(ErrorCode::kOutOfRange, "%s: the prompt is %zu tokens, more than the context of %lld "
                                  "tokens holds (raise -c)", have_tokens ? "--tokens" : have_f ? "-f" : "-p",
                                  ids.size(), (long long)n_ctx));

  Generator g(**engine, 0, gen, n_ctx);
  if (Status st = g.validate(); !st) return fail("run", st);
  g.timings().load_s = loaded->load_seconds;
  if (Status st = g.feed(ids); !st) return fail("run", st.with_context("prompt"));

  std::vector<int32_t> out_ids;
  bool visible = false;  // any printable text came out
  // --chat: the template's stop strings (plain text) and reasoning markers; reasoning goes to stderr.
  StopFilter filter(chat_prompt ? chat_prompt->stop_strings() : std::vector<std::string>{});
  std::optional<ReplyStream> splitter;
  if (chat_prompt) splitter.emplace(*chat_prompt, chat_prompt->prompt_opens_reasoning(rendered));
  ReasoningSink reasoning;
  bool started = !(chat_prompt && chat_prompt->plain());  // plain text: from the first visible character
  auto show = [&](const ReplyStream::Delta& o) {
    visible = visible || has_visible_text(o.reasoning) || has_visible_text(o.content);
    if (print_ids) return;
    reasoning.write(o.reasoning);
    if (o.reasoning_ended) reasoning.close();
    std::string text = o.content;
    if (!started) {
      const size_t b = text.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) return;
      text.erase(0, b);
      started = true;
    }
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
  };
  auto on_token = [&](int32_t id, const std::string& piece) {
    if (filter.hit()) return false;
    if (id >= 0) out_ids.push_back(id);
    const std::string text = filter.push(piece);
    if (splitter) {
      show(splitter->push(text));
    } else {
      ReplyStream::Delta d;
      d.content = text;
      show(d);
    }
    return !filter.hit();
  };
  auto stop = g.generate(on_token);
  if (!stop) return fail("run", stop.status());
  if (chat_prompt) {
    std::string tail = filter.flush();
    if (chat_prompt->plain())
      while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    show(splitter->push(tail));
    show(splitter->finish());
  }
  reasoning.close();
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
  if (!print_ids && t.n_gen > 0 && !visible)
    std::fprintf(stderr, "kiln run: warning: the %lld generated tokens printed no visible text (control tokens or "
                 "whitespace: a random-weight model?); --ids shows them\n", (long long)t.n_gen);
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("run", "generate text from a prompt", run_main);

}  // namespace kiln::cli
