// What `kiln chat` and `kiln run` share: the chat template options, the one request they submit to the engine
// loop, and streaming its reply to the terminal.
//   ChatTemplateArgs  --chat-template NAME|plain|JINJA, --chat-template-file FILE, --chat-template-kwargs JSON,
//                     turned into runtime's ChatPromptOptions (checked before the model loads); --reasoning-budget N
//                     (runtime/reasoning.h: -1 unlimited, 0 no thinking) and --reasoning-budget-message MSG.
//   stream_request    submits one request to the Scheduler (runtime/scheduler.h) and hands its token events to a
//                     callback as they come; the stop strings (a template's, plain text's) are the scheduler's.
//   ReplyPrinter      content to stdout (plain text: from the first visible character), reasoning to stderr through
//                     runtime's ReplyStream (the split) and ReasoningSink: dimmed on a terminal, else in a
//                     "[reasoning] ..." paragraph.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/model_source.h"
#include "runtime/prompt.h"
#include "runtime/reasoning.h"
#include "runtime/scheduler.h"

namespace kiln::cli {

struct ChatTemplateArgs {
  std::string name, file, kwargs;
  int reasoning_budget = -1;  // tokens of a reply's thinking block before its close is forced; -1: unlimited
  std::string reasoning_budget_message;  // text forced before the close (the model reads why it stopped)
};

inline void add_chat_template_options(ArgParser& args, ChatTemplateArgs* a) {
  args.option({"--chat-template"}, &a->name, "NAME",
              "built-in chat format instead of the model's template: llama3, chatml, mistral, gemma, phi3, llama2, "
              "or plain (\"User:\"/\"Assistant:\" text); Jinja source (with {{ or {%) is used as a template");
  args.option({"--chat-template-file"}, &a->file, "FILE",
              "Jinja chat template file, replacing the model's tokenizer.chat_template");
  args.option({"--chat-template-kwargs"}, &a->kwargs, "JSON",
              "extra template variables (a JSON object), e.g. '{\"enable_thinking\": false}'");
  args.option({"--reasoning-budget"}, &a->reasoning_budget, "N",
              "tokens a reply may think (<think>...</think>) before the block is closed for it: -1 unlimited "
              "(default), 0 no thinking (templates with enable_thinking render it false)");
  args.option({"--reasoning-budget-message"}, &a->reasoning_budget_message, "MSG",
              "text written for the model before the close when the reasoning budget closes its thinking block, "
              "e.g. \" Time is up, I answer now.\"");
}

// The options ChatPrompt::create takes, read and checked (the file read, kwargs parsed, the template parsed):
// errors name the flag and, for a template, its line and column.
inline Result<ChatPromptOptions> chat_prompt_options(const ChatTemplateArgs& a) {
  ChatPromptOptions o;
  if (a.reasoning_budget < -1)
    return make_error(ErrorCode::kInvalidArgument, "--reasoning-budget: must be -1 (unlimited), 0 (no thinking) or a "
                      "token count (got %d)", a.reasoning_budget);
  if (!a.name.empty() && !a.file.empty())
    return make_error(ErrorCode::kInvalidArgument, "pass only one of --chat-template and --chat-template-file");
  const char* flag = "--chat-template";
  if (!a.file.empty()) {
    flag = "--chat-template-file";
    KILN_ASSIGN_OR_RETURN(o.template_source,
                          read_bounded(a.file, uint64_t{16} << 20, "--chat-template-file", "a chat template"));
    if (o.template_source.empty())
      return make_error(ErrorCode::kInvalidArgument, "--chat-template-file '%s': the file is empty", a.file.c_str());
    o.template_name = a.file;
  } else if (a.name.find("{{") != std::string::npos || a.name.find("{%") != std::string::npos) {
    o.template_source = a.name;  // Jinja source, as llama.cpp's --chat-template takes it
    o.template_name = "--chat-template";
  } else {
    o.builtin = a.name;
  }
  if (!a.kwargs.empty()) {
    try {
      o.kwargs = nlohmann::ordered_json::parse(a.kwargs);
    } catch (const nlohmann::json::exception& e) {
      return make_error(ErrorCode::kInvalidArgument, "--chat-template-kwargs: not valid JSON: %s", e.what());
    }
    if (!o.kwargs.is_object())
      return make_error(ErrorCode::kInvalidArgument, "--chat-template-kwargs must be a JSON object");
  }
  if (Status st = check_chat_prompt_options(o); !st)
    return st.with_context(!a.kwargs.empty() && st.message().find("kwargs") != std::string::npos
                               ? "--chat-template-kwargs" : flag);
  return o;
}

// One reply's reasoning budget (run, chat): none with an output grammar (it writes no thinking block).
inline ReasoningBudget reply_reasoning(const ChatTemplateArgs& a, const ChatPrompt& chat, const std::string& rendered,
                                       bool constrained) {
  return constrained ? ReasoningBudget{}
                     : reasoning_budget_for(chat, a.reasoning_budget, rendered, a.reasoning_budget_message);
}
// Budget 0 renders templates with an enable_thinking variable with it false (unless --chat-template-kwargs sets it).
inline nlohmann::ordered_json reasoning_kwargs(const ChatTemplateArgs& a, const ChatPrompt& chat) {
  nlohmann::ordered_json kw = nullptr;
  if (a.kwargs.find("enable_thinking") == std::string::npos) reasoning_budget_kwargs(chat, a.reasoning_budget, &kw);
  return kw;
}

// Reasoning text on stderr: dimmed on a terminal, else one "[reasoning] ..." paragraph per reply.
class ReasoningSink {
 public:
  ReasoningSink() : tty_(isatty(STDERR_FILENO) == 1) {}
  void write(const std::string& text) {
    if (text.empty()) return;
    if (!open_) {
      std::fputs(tty_ ? "\033[2m" : "[reasoning] ", stderr);
      open_ = true;
    }
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
  void close() {
    if (!open_) return;
    std::fputs(tty_ ? "\033[0m\n" : "\n", stderr);
    std::fflush(stderr);
    open_ = false;
  }

 private:
  bool tty_;
  bool open_ = false;
};

// Submits `req` and calls on_event for each token event until the request ends; `interrupted` is polled while it
// runs (true: the request is cancelled, and the events up to the cancellation still arrive). Returns the handle
// (finish reason, stop reason, timings, seed) or the submit error.
inline Result<std::shared_ptr<RequestHandle>> stream_request(Scheduler& sched, GenRequest req,
                                                             const std::function<void(const TokenEvent&)>& on_event,
                                                             const std::function<bool()>& interrupted = nullptr) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<RequestHandle> h, sched.submit(std::move(req)));
  std::vector<TokenEvent> evs;
  for (;;) {
    evs.clear();
    const bool more = h->next(evs, std::chrono::milliseconds(50));
    for (const TokenEvent& ev : evs) on_event(ev);
    if (!more) break;
    if (interrupted && !h->cancelled() && interrupted()) h->cancel();
  }
  if (Status st = h->error(); !st) return st;
  return h;
}

// Shows a reply as it streams: with a chat prompt, split into reasoning (stderr) and content (stdout); plain
// conversations start at the first visible character. print = false: nothing is written (run --ids), only
// visible() is tracked.
class ReplyPrinter {
 public:
  ReplyPrinter(const ChatPrompt* prompt, const std::string& rendered, bool print)
      : print_(print), started_(!(prompt && prompt->plain())) {
    if (prompt) splitter_.emplace(*prompt, prompt->prompt_opens_reasoning(rendered));
  }
  void push(const std::string& text) {
    if (splitter_) {
      show(splitter_->push(text));
    } else {
      ReplyStream::Delta d;
      d.content = text;
      show(d);
    }
  }
  // The end of the reply: the split's held text.
  void finish() {
    if (splitter_) show(splitter_->finish());
    reasoning_.close();
  }
  bool visible() const { return visible_; }

 private:
  static bool has_visible_text(const std::string& s) {
    for (unsigned char c : s)
      if (c > ' ' && c != 0x7f) return true;
    return false;
  }
  void show(const ReplyStream::Delta& o) {
    visible_ = visible_ || has_visible_text(o.reasoning) || has_visible_text(o.content);
    if (!print_) return;
    reasoning_.write(o.reasoning);
    if (o.reasoning_ended) reasoning_.close();
    std::string text = o.content;
    if (!started_) {
      const size_t b = text.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) return;
      text.erase(0, b);
      started_ = true;
    }
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
  }

  bool print_;
  bool started_;
  bool visible_ = false;
  std::optional<ReplyStream> splitter_;
  ReasoningSink reasoning_;
};

}  // namespace kiln::cli
