// kiln chat: an interactive conversation on stdin/stdout through the model's chat template. Each turn is one
// request to the engine loop (runtime/scheduler.h) whose prompt is the whole conversation re-rendered; the prefix
// cache holds the blocks of the conversation so far, so a turn computes little more than its new tokens (hybrid
// models, whose recurrent state cannot be reused, recompute the conversation). Works with piped stdin: one user
// message per line.
//
// The conversation is rendered as runtime/prompt.h's ChatPrompt decides: the GGUF's tokenizer.chat_template in
// kiln's Jinja interpreter (--chat-template-file FILE replaces it, --chat-template-kwargs JSON adds variables),
// a built-in family with --chat-template NAME, or, for a file without a template, a built-in family its
// vocabulary points to (announced on stderr). When the template writes reasoning markers (<think>...</think>),
// the reasoning part of a reply is shown on stderr (dimmed on a terminal) and only the content goes to stdout;
// the conversation keeps the content, with the reasoning as the message's reasoning_content.
//
// Models without a chat template whose vocabulary cannot write ChatML's markers (the embedded demo model, random
// synth models) get a plain-text conversation instead: "User: ...\nAssistant:" continued by the model, the reply
// ending at "\nUser:" or a blank line (held back from the output until it can no longer be the start of one) or
// after a per-reply token cap (-n; default kPlainReplyCap), so no reply fills the context.
//
// --grammar / --grammar-file / -j / -jf (cli/grammar_options.h): every reply follows the grammar (compiled once) and
// ends where it ends; it is all content (no reasoning split, no stop strings).
//
// A message that does not fit the context is refused and the session goes on (/clear starts the conversation over).
// Ctrl-C during a reply ends that reply; at the prompt, a second Ctrl-C in a row (or Ctrl-D, /exit) quits.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/chat_cli.h"
#include "cli/engine_options.h"
#include "cli/grammar_options.h"
#include "cli/model_source.h"
#include "runtime/scheduler.h"
#include "runtime/prompt.h"

namespace kiln::cli {
namespace {

// Plain mode: the most tokens per reply when -n is not given (and at most a quarter of the context).
constexpr int32_t kPlainReplyCap = 128;

// SIGINT sets g_interrupted and writes a byte to a pipe the prompt's poll() watches: whichever thread the signal
// lands on (the engine loop runs on its own), and whenever it comes (also just before poll() starts), the
// waiting prompt wakes. clear_interrupt() resets both.
volatile std::sig_atomic_t g_interrupted = 0;
int g_sigpipe[2] = {-1, -1};
extern "C" void on_sigint(int) {
  g_interrupted = 1;
  const char c = 1;
  if (g_sigpipe[1] >= 0) (void)!::write(g_sigpipe[1], &c, 1);
}

void install_sigint_handler() {
  if (g_sigpipe[0] < 0 && pipe2(g_sigpipe, O_NONBLOCK | O_CLOEXEC) != 0) g_sigpipe[0] = g_sigpipe[1] = -1;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

void clear_interrupt() {
  g_interrupted = 0;
  char buf[64];
  if (g_sigpipe[0] >= 0)
    while (::read(g_sigpipe[0], buf, sizeof buf) > 0) {
    }
}

// Lines from a file descriptor, each at most max_bytes (longer ones are skipped and reported), interruptible.
class LineReader {
 public:
  enum Result { kLine, kEof, kInterrupted, kTooLong, kNoLines };
  explicit LineReader(int fd) : fd_(fd) {}

  Result next(std::string* line, size_t max_bytes) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (skipping_) {
        if (nl != std::string::npos) {
          buf_.erase(0, nl + 1);
          skipping_ = false;
          return kTooLong;
        }
        skipped_ += buf_.size();
        buf_.clear();
        // Megabytes without one end of line (e.g. stdin from /dev/zero) are no conversation: stop reading.
        if (skipped_ > kMaxSkipped) return kNoLines;
        if (eof_) {
          skipping_ = false;
          return kTooLong;
        }
      } else if (nl != std::string::npos) {
        if (nl > max_bytes) {
          buf_.erase(0, nl + 1);
          return kTooLong;
        }
        line->assign(buf_, 0, nl);
        buf_.erase(0, nl + 1);
        return kLine;
      } else if (buf_.size() > max_bytes) {
        skipping_ = true;
        skipped_ = 0;
        continue;
      } else if (eof_) {
        if (buf_.empty()) return kEof;
        line->swap(buf_);
        buf_.clear();
        return kLine;
      }
      if (g_interrupted) return kInterrupted;
      pollfd fds[2] = {{fd_, POLLIN, 0}, {g_sigpipe[0], POLLIN, 0}};
      if (::poll(fds, g_sigpipe[0] >= 0 ? 2 : 1, -1) < 0 && errno == EINTR) continue;  // g_interrupted: above
      if (fds[1].revents & POLLIN) continue;
      char tmp[1 << 16];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  static constexpr size_t kMaxSkipped = size_t{64} << 20;
  int fd_;
  std::string buf_;
  bool eof_ = false, skipping_ = false;
  size_t skipped_ = 0;
};

struct ChatArgs {
  ModelSource src;
  EngineArgs eng;
  SamplerParams sampling;
  int32_t max_new_tokens = -1;
  bool ignore_eos = false, verbose_prompt = false;
  std::string system_prompt;
  ChatTemplateArgs tpl;
  GrammarArgs grammar;
};

void add_chat_options(ArgParser& args, ChatArgs* c) {
  add_model_options(args, &c->src);
  args.option({"-sys", "--system-prompt"}, &c->system_prompt, "TEXT", "system message");
  add_chat_template_options(args, &c->tpl);
  add_grammar_options(args, &c->grammar);
  args.option({"-n", "--n-predict"}, &c->max_new_tokens, "N",
              "most tokens per reply; -1: until EOG or context full (default -1; plain text: " +
                  std::to_string(kPlainReplyCap) + ", at most a quarter of -c)");
  add_engine_options(args, &c->eng);
  add_sampling_options(args, &c->sampling);
  args.flag({"--ignore-eos"}, &c->ignore_eos, "do not end a reply at end-of-generation tokens");
  args.flag({"--verbose-prompt"}, &c->verbose_prompt, "print each turn's rendered prompt on stderr");
}

using json = nlohmann::ordered_json;

// The conversation and what runs it: each turn is one request to the engine loop with the whole conversation as
// its prompt; the prefix cache finds the blocks of the turns before, so only the new turn is computed.
struct Conversation {
  Scheduler& sched;
  const ChatPrompt& prompt;
  const ChatArgs& args;
  int64_t n_ctx = 0;
  int32_t max_new_tokens = -1;
  json messages = json::array();
  size_t n_fixed = 0;  // what /clear keeps (the system message)
  RequestTimings total;
  SequenceHooksFactory hooks;  // --grammar and friends: every reply follows the grammar (null: none)

  // Room for the turn and at least one token of reply; else the message is refused (false) and the chat goes on.
  Result<bool> fits(const std::vector<int32_t>& ids) {
    if (static_cast<int64_t>(ids.size()) < n_ctx) return true;
    json alone(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(n_fixed));
    alone.push_back(messages.back());
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> alone_ids, prompt.encode(alone));
    const size_t n_alone = alone_ids.size();
    messages.erase(messages.end() - 1);
    if (static_cast<int64_t>(n_alone) >= n_ctx)
      std::fprintf(stderr, "kiln chat: message refused: %zu tokens with the prompt around it, the context holds %lld "
                   "(raise -c)\n", n_alone, (long long)n_ctx);
    else
      std::fprintf(stderr, "kiln chat: message refused: the conversation would be %zu tokens, the context holds "
                   "%lld: /clear starts over (or raise -c)\n", ids.size(), (long long)n_ctx);
    return false;
  }

  // One user message: render, generate (streamed), and append the reply. A template error (raise_exception, ...)
  // ends the chat with its position: the conversation cannot go on.
  Status turn(const std::string& line) {
    messages.push_back({{"role", "user"}, {"content", line}});
    KILN_ASSIGN_OR_RETURN(std::string rendered,
                          prompt.render(messages, nullptr, true, reasoning_kwargs(args.tpl, prompt)));
    std::vector<int32_t> ids = prompt.tokenize(rendered);
    if (args.verbose_prompt)
      std::fprintf(stderr, "kiln chat: prompt (%s, %zu tokens):\n%s\n", prompt.describe().c_str(), ids.size(),
                   rendered.c_str());
    KILN_ASSIGN_OR_RETURN(bool ok, fits(ids));
    if (!ok) return Status::ok();
    GenRequest req;
    req.prompt = std::move(ids);
    req.sampling = args.sampling;
    req.max_new_tokens = max_new_tokens;
    req.ignore_eos = args.ignore_eos;
    req.reasoning = reply_reasoning(args.tpl, prompt, rendered, static_cast<bool>(hooks));
    // A grammar ends the reply where the grammar ends (a stop string could cut it mid-way: "\n\n" is JSON
    // whitespace).
    if (!hooks) req.stop = prompt.stop_strings();
    req.hooks = hooks;
    std::string reply;  // the text the model wrote (up to a stop string)
    // A constrained reply is content as the grammar wrote it: not split into reasoning.
    ReplyPrinter printer(hooks ? nullptr : &prompt, rendered, /*print=*/true);
    auto h = stream_request(
        sched, std::move(req),
        [&](const TokenEvent& ev) {
          std::string text = ev.text;
          if (ev.id < 0)  // the held-back tail (after the cap: at most the start of a stop string, or text)
            while (!text.empty() && text.back() == '\n') text.pop_back();
          reply += text;
          printer.push(text);
        },
        [] { return g_interrupted != 0; });
    if (!h) return h.status();
    printer.finish();
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (g_interrupted) {
      clear_interrupt();
      std::fprintf(stderr, "kiln chat: reply interrupted\n");
    }
    add_reply(reply, prompt.prompt_opens_reasoning(rendered));
    const RequestTimings t = (*h)->timings();
    total.n_prompt += t.n_prompt - t.n_cached;
    total.prompt_ms += t.prompt_ms;
    total.n_gen += t.n_gen;
    total.gen_ms += t.gen_ms;
    total.n_draft += t.n_draft;
    total.n_draft_accepted += t.n_draft_accepted;
    if ((*h)->stop_reason() == StopReason::kContextFull)
      std::fprintf(stderr, "kiln chat: context full (%lld tokens): the reply was cut; /clear starts over (or raise "
                   "-c)\n", (long long)n_ctx);
    return Status::ok();
  }

  // The reply without trailing whitespace (plain mode: as the model wrote it after "Assistant:"); with a template,
  // only its content goes back into the conversation, the reasoning as reasoning_content.
  void add_reply(std::string reply, bool opened) {
    while (!reply.empty() && (reply.back() == '\n' || reply.back() == ' ')) reply.pop_back();
    if (prompt.plain() || hooks) {
      messages.push_back({{"role", "assistant"}, {"content", reply}});
      return;
    }
    tpl::ParsedReply parsed = prompt.parse_reply(reply, /*want_tools=*/false, opened);
    while (!parsed.content.empty() && (parsed.content.back() == '\n' || parsed.content.back() == ' '))
      parsed.content.pop_back();
    messages.push_back(prompt.assistant_message(parsed));
  }

  void clear() {
    messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(n_fixed), messages.end());
    std::fprintf(stderr, "kiln chat: conversation cleared\n");
  }
};

// Reads lines until EOF, /exit, or two Ctrl-C in a row at the prompt; each line is a turn.
Status converse(Conversation& conv) {
  const bool interactive = isatty(STDIN_FILENO);
  install_sigint_handler();
  LineReader reader(STDIN_FILENO);
  const size_t max_line = static_cast<size_t>(std::min<int64_t>(conv.n_ctx * kMaxBytesPerToken, int64_t{16} << 20));
  int prompt_interrupts = 0;
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    const LineReader::Result rr = reader.next(&line, max_line);
    if (rr == LineReader::kEof) {
      if (interactive) std::fputc('\n', stdout);  // the stats below start on a line of their own
      return Status::ok();
    }
    if (rr == LineReader::kNoLines) {
      if (interactive) std::fputc('\n', stdout);
      std::fflush(stdout);
      return make_error(ErrorCode::kInvalidArgument, "stdin: no end of line in more than 64 MiB");
    }
    if (rr == LineReader::kInterrupted) {
      clear_interrupt();
      if (++prompt_interrupts >= 2) {
        if (interactive) std::fputc('\n', stdout);
        return Status::ok();
      }
      std::fputs(interactive ? "\n" : "", stdout);
      std::fprintf(stderr, "kiln chat: Ctrl-C again (or Ctrl-D, /exit) quits\n");
      continue;
    }
    prompt_interrupts = 0;
    if (rr == LineReader::kTooLong) {
      std::fprintf(stderr, "kiln chat: message refused: more than %zu bytes, more than the context of %lld tokens can "
                   "hold (raise -c)\n", max_line, (long long)conv.n_ctx);
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit" || line == "/quit") return Status::ok();
    if (line == "/clear") {
      conv.clear();
      continue;
    }
    if (line.empty()) continue;
    KILN_TRY(conv.turn(line));
  }
}

int chat_main(int argc, char** argv) {
  ArgParser args("chat",
                 "Chat with a model on stdin/stdout (one message per line; /clear starts over; EOF, /exit or Ctrl-C "
                 "twice at the prompt quits; Ctrl-C during a reply ends the reply).");
  ChatArgs c;
  add_chat_options(args, &c);
  if (Status st = args.parse(argc, argv); !st) return fail("chat", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (Status st = check_generation_options(c.max_new_tokens, c.eng.batch_tokens); !st) return fail("chat", st);
  if (Status st = check_sampling_options(c.sampling); !st) return fail("chat", st);
  if (Status st = check_model_options(c.src); !st) return fail("chat", st);
  if (Status st = check_engine_options(c.eng); !st) return fail("chat", st);
  auto popts = chat_prompt_options(c.tpl);
  if (!popts) return fail("chat", popts.status());
  auto constraint = grammar_option(args, c.grammar);
  if (!constraint) return fail("chat", constraint.status());

  auto loaded = load_model(c.src, /*show_progress=*/true);
  if (!loaded) return fail("chat", loaded.status());
  if (Status st = check_sampling_vocab(c.sampling, loaded->model->tokenizer().n_vocab()); !st) return fail("chat", st);
  popts->model_name = loaded->name;
  auto prompt = ChatPrompt::create(loaded->model->tokenizer(), *popts);
  if (!prompt) return fail("chat", prompt.status());
  if (!prompt->notice().empty()) std::fprintf(stderr, "kiln chat: %s\n", prompt->notice().c_str());
  auto cfg = engine_config(*loaded->model, c.eng);
  if (!cfg) return fail("chat", cfg.status());
  auto draft = load_draft_model(c.src, c.eng);
  if (!draft) return fail("chat", draft.status());
  auto sched = Scheduler::create(std::move(loaded->model), *cfg, std::move(draft).value());
  if (!sched) return fail("chat", sched.status());

  auto hooks = grammar_hooks(*constraint, (*sched)->tokenizer());
  if (!hooks) return fail("chat", hooks.status());

  Conversation conv{**sched, *prompt, c, (*sched)->max_seq_ctx(), c.max_new_tokens, json::array(), 0, RequestTimings{},
                    std::move(hooks).value()};
  if (prompt->plain() && !args.seen("-n") && !args.seen("--n-predict"))
    conv.max_new_tokens = static_cast<int32_t>(std::clamp<int64_t>(conv.n_ctx / 4, 1, kPlainReplyCap));
  if (!c.system_prompt.empty()) conv.messages.push_back({{"role", "system"}, {"content", c.system_prompt}});
  conv.n_fixed = conv.messages.size();
  if (Status st = converse(conv); !st) return fail("chat", st);
  const RequestTimings& t = conv.total;
  const double prompt_s = t.prompt_ms / 1000, gen_s = t.gen_ms / 1000;
  std::fprintf(stderr, "kiln chat: prompt %lld tokens in %.3f s (%.2f tok/s), generated %lld tokens in %.3f s (%.2f tok/s)\n",
               (long long)t.n_prompt, prompt_s, prompt_s > 0 ? t.n_prompt / prompt_s : 0.0, (long long)t.n_gen, gen_s,
               gen_s > 0 ? t.n_gen / gen_s : 0.0);
  if (t.n_draft > 0)
    std::fprintf(stderr, "kiln chat: speculative: %lld draft tokens, %lld accepted (%.1f%%)\n", (long long)t.n_draft,
                 (long long)t.n_draft_accepted, 100.0 * static_cast<double>(t.n_draft_accepted) / t.n_draft);
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("chat", "interactive chat through the model's chat template", chat_main);

}  // namespace kiln::cli
