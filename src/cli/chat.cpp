// kiln chat: an interactive conversation on stdin/stdout through the model's chat template. The conversation stays
// in the KV cache between turns: each turn re-renders the whole conversation and Generator::sync feeds only what
// differs from the cached tokens (the new turn). Works with piped stdin: one user message per line.
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
// A message that does not fit the context is refused and the session goes on (/clear starts the conversation over).
// Ctrl-C during a reply ends that reply; at the prompt, a second Ctrl-C in a row (or Ctrl-D, /exit) quits.
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
#include "cli/model_source.h"
#include "runtime/generate.h"
#include "runtime/prompt.h"

namespace kiln::cli {
namespace {

// Plain mode: the most tokens per reply when -n is not given (and at most a quarter of the context).
constexpr int32_t kPlainReplyCap = 128;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) { g_interrupted = 1; }

// SIGINT sets g_interrupted, without SA_RESTART: a read() waiting at the prompt returns EINTR.
void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
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
      char tmp[1 << 16];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;  // g_interrupted is checked above
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

int chat_main(int argc, char** argv) {
  ArgParser args("chat",
                 "Chat with a model on stdin/stdout (one message per line; /clear starts over; EOF, /exit or Ctrl-C "
                 "twice at the prompt quits; Ctrl-C during a reply ends the reply).");
  ModelSource src;
  CacheOptions cache_opt;
  GenerateOptions gen;
  std::string system_prompt;
  ChatTemplateArgs tpl_args;
  int n_batch = defaults::kBatch;
  add_model_options(args, &src);
  args.option({"-sys", "--system-prompt"}, &system_prompt, "TEXT", "system message");
  add_chat_template_options(args, &tpl_args);
  args.option({"-n", "--n-predict"}, &gen.seq.n_predict, "N",
              "most tokens per reply; -1: until EOG or context full (default -1; plain text: " +
                  std::to_string(kPlainReplyCap) + ", at most a quarter of -c)");
  add_cache_options(args, &cache_opt);
  args.option({"-b", "--batch-size"}, &n_batch, "N",
              "prompt tokens per forward pass (default " + std::to_string(defaults::kBatch) + ")");
  add_sampling_options(args, &gen.seq.sampling);
  args.flag({"--ignore-eos"}, &gen.seq.ignore_eos, "do not end a reply at end-of-generation tokens");
  bool verbose_prompt = false;
  args.flag({"--verbose-prompt"}, &verbose_prompt, "print each turn's rendered prompt on stderr");
  if (Status st = args.parse(argc, argv); !st) return fail("chat", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  gen.n_batch = n_batch;
  if (Status st = check_generation_options(gen.seq.n_predict, n_batch); !st) return fail("chat", st);
  if (Status st = check_sampling_options(gen.seq.sampling); !st) return fail("chat", st);
  if (Status st = check_model_options(src); !st) return fail("chat", st);
  if (Status st = check_cache_options(cache_opt); !st) return fail("chat", st);
  auto popts = chat_prompt_options(tpl_args);
  if (!popts) return fail("chat", popts.status());

  auto loaded = load_model(src, /*show_progress=*/true);
  if (!loaded) return fail("chat", loaded.status());
  Model& model = *loaded->model;
  const Tokenizer& tok = model.tokenizer();
  popts->model_name = loaded->name;
  auto prompt = ChatPrompt::create(tok, *popts);
  if (!prompt) return fail("chat", prompt.status());
  if (!prompt->notice().empty()) std::fprintf(stderr, "kiln chat: %s\n", prompt->notice().c_str());
  auto engine = make_engine(model, cache_opt, 1, n_batch);
  if (!engine) return fail("chat", engine.status());
  const int64_t n_ctx = effective_ctx(model, cache_opt.n_ctx);
  if (prompt->plain() && !args.seen("-n") && !args.seen("--n-predict"))
    gen.seq.n_predict = static_cast<int32_t>(std::clamp<int64_t>(n_ctx / 4, 1, kPlainReplyCap));
  Generator g(**engine, 0, gen, n_ctx);
  if (Status st = g.validate(); !st) return fail("chat", st);

  using json = nlohmann::ordered_json;
  json messages = json::array();
  if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
  const size_t n_fixed = messages.size();  // what /clear keeps
  const bool interactive = isatty(STDIN_FILENO);
  install_sigint_handler();
  LineReader reader(STDIN_FILENO);
  const size_t max_line = static_cast<size_t>(std::min<int64_t>(n_ctx * kMaxBytesPerToken, int64_t{16} << 20));
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
      break;
    }
    if (rr == LineReader::kNoLines) {
      if (interactive) std::fputc('\n', stdout);
      std::fflush(stdout);
      return fail("chat", make_error(ErrorCode::kInvalidArgument, "stdin: no end of line in more than 64 MiB"));
    }
    if (rr == LineReader::kInterrupted) {
      g_interrupted = 0;
      if (++prompt_interrupts >= 2) {
        if (interactive) std::fputc('\n', stdout);
        break;
      }
      std::fputs(interactive ? "\n" : "", stdout);
      std::fprintf(stderr, "kiln chat: Ctrl-C again (or Ctrl-D, /exit) quits\n");
      continue;
    }
    prompt_interrupts = 0;
    if (rr == LineReader::kTooLong) {
      std::fprintf(stderr, "kiln chat: message refused: more than %zu bytes, more than the context of %lld tokens can "
                   "hold (raise -c)\n", max_line, (long long)n_ctx);
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit" || line == "/quit") break;
    if (line == "/clear") {
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(n_fixed), messages.end());
      std::fprintf(stderr, "kiln chat: conversation cleared\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});

    // A template error (raise_exception, ...) ends the session with its position: the conversation cannot go on.
    auto rendered = prompt->render(messages);
    if (!rendered) return fail("chat", rendered.status());
    std::vector<int32_t> ids = prompt->tokenize(*rendered);
    if (verbose_prompt)
      std::fprintf(stderr, "kiln chat: prompt (%s, %zu tokens):\n%s\n", prompt->describe().c_str(), ids.size(),
                   rendered->c_str());
    // Room for the turn and at least one token of reply; else the message is refused and the session goes on.
    if (static_cast<int64_t>(ids.size()) >= n_ctx) {
      json alone(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(n_fixed));
      alone.push_back(messages.back());
      auto alone_ids = prompt->encode(alone);
      if (!alone_ids) return fail("chat", alone_ids.status());
      const size_t n_alone = alone_ids->size();
      messages.erase(messages.end() - 1);
      if (static_cast<int64_t>(n_alone) >= n_ctx)
        std::fprintf(stderr, "kiln chat: message refused: %zu tokens with the prompt around it, the context holds %lld "
                     "(raise -c)\n", n_alone, (long long)n_ctx);
      else
        std::fprintf(stderr, "kiln chat: message refused: the conversation would be %zu tokens, the context holds "
                     "%lld: /clear starts over (or raise -c)\n", ids.size(), (long long)n_ctx);
      continue;
    }
    if (Status st = g.sync(ids); !st) return fail("chat", st);

    std::string reply;  // the text the model wrote (up to a stop string)
    StopFilter filter(prompt->stop_strings());
    const bool opened = prompt->prompt_opens_reasoning(*rendered);
    ReplyStream splitter(*prompt, opened);
    ReasoningSink reasoning;
    bool started = !prompt->plain();  // plain mode shows the reply from its first visible character
    auto show_content = [&](std::string text) {
      if (!started) {
        const size_t b = text.find_first_not_of(" \t\r\n");
        if (b == std::string::npos) return;
        text.erase(0, b);
        started = true;
      }
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
    auto show = [&](const ReplyStream::Delta& o) {
      reasoning.write(o.reasoning);
      if (o.reasoning_ended) reasoning.close();
      show_content(o.content);
    };
    auto stop = g.generate([&](int32_t, const std::string& piece) {
      if (filter.hit()) return false;
      const std::string text = filter.push(piece);
      reply += text;
      show(splitter.push(text));
      return !filter.hit() && !g_interrupted;
    });
    if (!stop) return fail("chat", stop.status());
    std::string tail = filter.flush();  // after the cap: at most the start of a stop string, or text
    while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    reply += tail;
    show(splitter.push(tail));
    show(splitter.finish());
    reasoning.close();
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (g_interrupted) {
      g_interrupted = 0;
      std::fprintf(stderr, "kiln chat: reply interrupted\n");
    }
    // The reply without trailing whitespace (plain mode: as the model wrote it after "Assistant:"); with a
    // template, only its content goes back into the conversation, the reasoning as reasoning_content.
    while (!reply.empty() && (reply.back() == '\n' || reply.back() == ' ')) reply.pop_back();
    if (prompt->plain()) {
      messages.push_back({{"role", "assistant"}, {"content", reply}});
    } else {
      tpl::ParsedReply parsed = prompt->parse_reply(reply, /*want_tools=*/false, opened);
      while (!parsed.content.empty() && (parsed.content.back() == '\n' || parsed.content.back() == ' '))
        parsed.content.pop_back();
      messages.push_back(prompt->assistant_message(parsed));
    }
    if (*stop == StopReason::kContextFull)
      std::fprintf(stderr, "kiln chat: context full (%lld tokens): the reply was cut; /clear starts over (or raise "
                   "-c)\n", (long long)n_ctx);
  }
  const Timings& t = g.timings();
  std::fprintf(stderr, "kiln chat: prompt %lld tokens in %.3f s (%.2f tok/s), generated %lld tokens in %.3f s (%.2f tok/s)\n",
               (long long)t.n_prompt, t.prompt_s, t.prompt_tps(), (long long)t.n_gen, t.gen_s, t.gen_tps());
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("chat", "interactive chat through the model's chat template", chat_main);

}  // namespace kiln::cli
