// kiln run: generate text from a prompt, streaming it to stdout; timings on stderr. One request to the engine loop
// (runtime/scheduler.h), the same path a server request takes: the same flags give the same tokens.
// --chat: the prompt (-p or -f) is one user message (after -sys TEXT as the system message), rendered with the
// model's chat template as `kiln chat` renders a turn (runtime/prompt.h's ChatPrompt; --chat-template-file and
// --chat-template-kwargs as there); reasoning (<think>...</think>) goes to stderr, the content to stdout.
// --grammar / --grammar-file / -j / -jf (cli/grammar_options.h): the output follows the grammar and ends where it
// ends; it is all content (no reasoning split, no template stop strings).
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/chat_cli.h"
#include "cli/engine_options.h"
#include "cli/grammar_options.h"
#include "cli/model_source.h"
#include "runtime/prompt.h"
#include "runtime/scheduler.h"

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

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct RunArgs {
  ModelSource src;
  EngineArgs eng;
  SamplerParams sampling;
  int32_t max_new_tokens = -1;
  bool ignore_eos = false;
  std::string prompt, prompt_file, tokens_arg;
  bool print_ids = false, no_bos = false, chat = false, verbose_prompt = false;
  std::string system_prompt;
  ChatTemplateArgs tpl;
  GrammarArgs grammar;
  GrammarOption constraint;        // --grammar and friends, parsed before the model loads
  bool have_p = false, have_f = false, have_tokens = false;
  std::vector<int32_t> token_ids;  // --tokens, read before the model loads
  ChatPromptOptions popts;         // --chat
};

void add_run_options(ArgParser& args, RunArgs* r) {
  add_model_options(args, &r->src);
  args.option({"-p", "--prompt"}, &r->prompt, "TEXT", "prompt text (none: generate from BOS alone)");
  args.option({"-f", "--file"}, &r->prompt_file, "FILE", "read the prompt from a file (at most what -c can hold)");
  args.option({"--tokens"}, &r->tokens_arg, "IDS", "prompt as token ids '1,2,3' (or a file of them), fed verbatim");
  args.option({"-n", "--n-predict"}, &r->max_new_tokens, "N", "tokens to generate; -1: until EOG or context full (default -1)");
  add_engine_options(args, &r->eng);
  add_sampling_options(args, &r->sampling);
  args.flag({"--ids"}, &r->print_ids, "print the generated ids as one line [id, ...] instead of text");
  args.flag({"--ignore-eos"}, &r->ignore_eos, "do not stop at end-of-generation tokens");
  args.flag({"--no-bos"}, &r->no_bos, "do not add the BOS token to a text prompt");
  args.flag({"--chat"}, &r->chat, "the prompt is a user message, rendered with the model's chat template");
  args.option({"-sys", "--system-prompt"}, &r->system_prompt, "TEXT", "system message (implies --chat)");
  add_chat_template_options(args, &r->tpl);
  add_grammar_options(args, &r->grammar);
  args.flag({"--verbose-prompt"}, &r->verbose_prompt, "print the prompt text and its token count on stderr");
}

Result<std::vector<int32_t>> token_list(const RunArgs& r) {
  const int64_t ctx_bound = r.eng.cache.n_ctx > 0 ? r.eng.cache.n_ctx : defaults::kContextCap;
  if (r.tokens_arg.empty()) return make_error(ErrorCode::kInvalidArgument, "--tokens: the list is empty");
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_tokens(r.tokens_arg, ctx_bound));
  if (ids.empty()) return make_error(ErrorCode::kInvalidArgument, "--tokens: the list is empty");
  if (static_cast<int64_t>(ids.size()) > ctx_bound)
    return make_error(ErrorCode::kOutOfRange, "--tokens: %zu ids are more than the context of %lld tokens holds "
                      "(raise -c)", ids.size(), (long long)ctx_bound);
  return ids;
}

// Every flag is checked before the model loads; the prompt file or token list is read here too.
Status check_run_args(const ArgParser& args, RunArgs& r) {
  r.have_p = args.seen("-p"), r.have_f = args.seen("-f"), r.have_tokens = args.seen("--tokens");
  if (r.have_p + r.have_f + r.have_tokens > 1)
    return make_error(ErrorCode::kInvalidArgument, "pass only one of -p, -f and --tokens");
  for (const char* f : {"-sys", "--chat-template", "--chat-template-file", "--chat-template-kwargs",
                        "--reasoning-budget", "--reasoning-budget-message"})
    if (args.seen(f)) r.chat = true;  // the chat options imply --chat
  if (r.chat && r.have_tokens)
    return make_error(ErrorCode::kInvalidArgument, "--chat renders text: pass -p TEXT or -f FILE, not --tokens");
  if (r.chat && !r.have_p && !r.have_f)
    return make_error(ErrorCode::kInvalidArgument, "--chat: pass the user message with -p TEXT or -f FILE");
  if (r.chat) {
    KILN_ASSIGN_OR_RETURN(r.popts, chat_prompt_options(r.tpl));
  }
  KILN_TRY(check_generation_options(r.max_new_tokens, r.eng.batch_tokens));
  KILN_TRY(check_sampling_options(r.sampling));
  KILN_TRY(check_model_options(r.src));
  KILN_TRY(check_engine_options(r.eng));
  KILN_ASSIGN_OR_RETURN(r.constraint, grammar_option(args, r.grammar));
  if (r.have_tokens) {
    KILN_ASSIGN_OR_RETURN(r.token_ids, token_list(r));
  }
  if (r.have_f) {
    // The most text the context can hold: -c, or (-c 0) the default's cap; the tokens are counted after loading.
    const int64_t ctx_bound = r.eng.cache.n_ctx > 0 ? r.eng.cache.n_ctx : defaults::kContextCap;
    KILN_ASSIGN_OR_RETURN(r.prompt,
                          read_bounded(r.prompt_file, static_cast<uint64_t>(ctx_bound * kMaxBytesPerToken), "-f",
                                       strprintf("more text than a context of %lld tokens can hold; raise -c",
                                                 (long long)ctx_bound)));
    if (r.prompt.empty())
      return make_error(ErrorCode::kInvalidArgument, "-f '%s': the file is empty", r.prompt_file.c_str());
  }
  return Status::ok();
}

// The prompt's tokens: the --tokens list, the rendered chat message, or the encoded text.
struct Prompt {
  std::vector<int32_t> ids;
  std::optional<ChatPrompt> chat;
  std::string rendered;  // --chat: the rendered conversation
};

Result<Prompt> build_prompt(const RunArgs& r, const Tokenizer& tok, const std::string& model_name) {
  Prompt p;
  if (r.have_tokens) {
    p.ids = r.token_ids;
  } else if (r.chat) {
    ChatPromptOptions o = r.popts;
    o.model_name = model_name;
    KILN_ASSIGN_OR_RETURN(ChatPrompt cp, ChatPrompt::create(tok, o));
    p.chat = std::move(cp);
    if (!p.chat->notice().empty()) std::fprintf(stderr, "kiln run: %s\n", p.chat->notice().c_str());
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!r.system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", r.system_prompt}});
    messages.push_back({{"role", "user"}, {"content", r.prompt}});
    KILN_ASSIGN_OR_RETURN(p.rendered, p.chat->render(messages, nullptr, true, reasoning_kwargs(r.tpl, *p.chat)));
    p.ids = p.chat->tokenize(p.rendered, /*add_bos=*/!r.no_bos);
  } else {
    p.ids = encode_prompt(tok, r.prompt, /*add_bos=*/!r.no_bos);
    if (p.ids.empty())
      return make_error(ErrorCode::kInvalidArgument, "empty prompt: pass -p TEXT, -f FILE or --tokens IDS");
  }
  if (r.verbose_prompt)
    std::fprintf(stderr, "kiln run: prompt (%s, %zu tokens):\n%s\n",
                 p.chat ? p.chat->describe().c_str() : r.have_tokens ? "token ids" : "text", p.ids.size(),
                 p.chat ? p.rendered.c_str() : r.have_tokens ? "" : r.prompt.c_str());
  return p;
}

void print_timings(const Scheduler& sched, const RunArgs& r, const RequestHandle& h, double load_s, bool visible) {
  const RequestTimings t = h.timings();
  const int64_t n_ctx = sched.max_seq_ctx();
  if (h.stop_reason() == StopReason::kContextFull)
    std::fprintf(stderr, "kiln run: context full (%lld tokens): generation stopped; raise -c for more\n",
                 (long long)n_ctx);
  std::fprintf(stderr, "kiln run: load %.3f s, model %.2f MiB, kv cache %.2f MiB (%s, %lld tokens), peak RSS %.1f MiB\n",
               load_s, mib(sched.model().stats().weight_bytes), mib(sched.kv_bytes()), cache_types_label(r.eng.cache).c_str(),
               (long long)n_ctx, mib(peak_rss_bytes()));
  const int64_t n_prompt = t.n_prompt - t.n_cached;
  const double prompt_s = t.prompt_ms / 1000, gen_s = t.gen_ms / 1000;
  std::fprintf(stderr, "kiln run: prompt %lld tokens in %.3f s (%.2f tok/s)\n", (long long)n_prompt, prompt_s,
               prompt_s > 0 ? n_prompt / prompt_s : 0.0);
  std::fprintf(stderr, "kiln run: generated %lld tokens in %.3f s (%.2f tok/s), stop: %s, seed %llu\n",
               (long long)t.n_gen, gen_s, gen_s > 0 ? t.n_gen / gen_s : 0.0, stop_reason_name(h.stop_reason()),
               (unsigned long long)h.seed());
  if (t.n_draft > 0)
    std::fprintf(stderr, "kiln run: speculative: %lld draft tokens, %lld accepted (%.1f%%)\n", (long long)t.n_draft,
                 (long long)t.n_draft_accepted, 100.0 * static_cast<double>(t.n_draft_accepted) / t.n_draft);
  if (!r.print_ids && t.n_gen > 0 && !visible)
    std::fprintf(stderr, "kiln run: warning: the %lld generated tokens printed no visible text (control tokens or "
                 "whitespace: a random-weight model?); --ids shows them\n", (long long)t.n_gen);
}

int run_main(int argc, char** argv) {
  ArgParser args("run", "Generate text from a prompt (streamed to stdout; timings on stderr).");
  RunArgs r;
  add_run_options(args, &r);
  if (Status st = args.parse(argc, argv); !st) return fail("run", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (Status st = check_run_args(args, r); !st) return fail("run", st);

  auto loaded = load_model(r.src, /*show_progress=*/true);
  if (!loaded) return fail("run", loaded.status());
  if (Status st = check_sampling_vocab(r.sampling, loaded->model->tokenizer().n_vocab()); !st) return fail("run", st);
  auto cfg = engine_config(*loaded->model, r.eng);
  if (!cfg) return fail("run", cfg.status());
  cfg->prefix_cache = false;  // one request: nothing to share
  cfg->on_prefill = prefill_printer("kiln run: ", /*per_slot=*/false);  // long prompts: progress every second
  auto draft = load_draft_model(r.src, r.eng);
  if (!draft) return fail("run", draft.status());
  auto sched_or = Scheduler::create(std::move(loaded->model), *cfg, std::move(draft).value());
  if (!sched_or) return fail("run", sched_or.status());
  Scheduler& sched = **sched_or;
  auto prompt = build_prompt(r, sched.tokenizer(), loaded->name);
  if (!prompt) return fail("run", prompt.status());
  const int64_t n_ctx = sched.max_seq_ctx();
  if (static_cast<int64_t>(prompt->ids.size()) >= n_ctx)
    return fail("run", make_error(ErrorCode::kOutOfRange, "%s: the prompt is %zu tokens, more than the context of %lld "
                                  "tokens holds with room for one generated token (raise -c)",
                                  r.have_tokens ? "--tokens" : r.have_f ? "-f" : "-p", prompt->ids.size(),
                                  (long long)n_ctx));

  auto hooks = grammar_hooks(r.constraint, sched.tokenizer());
  if (!hooks) return fail("run", hooks.status());

  GenRequest req;
  req.hooks = std::move(hooks).value();
  req.prompt = prompt->ids;
  req.sampling = r.sampling;
  req.max_new_tokens = r.max_new_tokens;
  req.ignore_eos = r.ignore_eos;
  if (prompt->chat) req.reasoning = reply_reasoning(r.tpl, *prompt->chat, prompt->rendered, r.constraint.parsed != nullptr);
  // --chat: the template's stop strings (plain text) end the reply, as a server request's "stop" does; a grammar
  // ends it where the grammar ends (a stop string could cut it mid-way: "\n\n" is JSON whitespace).
  if (prompt->chat && !r.constraint.parsed) req.stop = prompt->chat->stop_strings();
  std::vector<int32_t> out_ids;
  // A constrained reply is content as the grammar wrote it: not split into reasoning.
  const bool split = prompt->chat && !r.constraint.parsed;
  ReplyPrinter printer(split ? &*prompt->chat : nullptr, prompt->rendered, !r.print_ids);
  const bool plain = prompt->chat && prompt->chat->plain();
  auto h = stream_request(sched, std::move(req), [&](const TokenEvent& ev) {
    if (ev.id >= 0) out_ids.push_back(ev.id);
    std::string text = ev.text;
    if (ev.id < 0 && plain)  // the held-back tail of a plain reply cut by the limit
      while (!text.empty() && text.back() == '\n') text.pop_back();
    printer.push(text);
  });
  if (!h) return fail("run", h.status());
  printer.finish();
  if (r.print_ids) {
    std::string line = "[";
    for (size_t i = 0; i < out_ids.size(); ++i) line += (i ? ", " : "") + std::to_string(out_ids[i]);
    line += "]\n";
    std::fputs(line.c_str(), stdout);
  } else {
    std::fputs("\n", stdout);
  }
  std::fflush(stdout);
  print_timings(sched, r, **h, loaded->load_seconds, printer.visible());
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("run", "generate text from a prompt", run_main);

}  // namespace kiln::cli
