// What `kiln chat` and `kiln run --chat` share: the chat template options, and streaming a reply to the terminal.
//   ChatTemplateArgs  --chat-template NAME|plain|JINJA, --chat-template-file FILE, --chat-template-kwargs JSON,
//                     turned into runtime's ChatPromptOptions (checked before the model loads).
//   StopFilter     holds back text that may be the beginning of a stop string (plain-text conversations).
//   (runtime's ReplyStream splits the streamed text into reasoning and content.)
//   ReasoningSink  shows reasoning on stderr, distinct from the reply: dimmed on a terminal, else in a
//                  "[reasoning] ..." paragraph.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/model_source.h"
#include "runtime/prompt.h"

namespace kiln::cli {

struct ChatTemplateArgs {
  std::string name, file, kwargs;
};

inline void add_chat_template_options(ArgParser& args, ChatTemplateArgs* a) {
  args.option({"--chat-template"}, &a->name, "NAME",
              "built-in chat format instead of the model's template: llama3, chatml, mistral, gemma, phi3, llama2, "
              "or plain (\"User:\"/\"Assistant:\" text); Jinja source (with {{ or {%) is used as a template");
  args.option({"--chat-template-file"}, &a->file, "FILE",
              "Jinja chat template file, replacing the model's tokenizer.chat_template");
  args.option({"--chat-template-kwargs"}, &a->kwargs, "JSON",
              "extra template variables (a JSON object), e.g. '{\"enable_thinking\": false}'");
}

// The options ChatPrompt::create takes, read and checked (the file read, kwargs parsed, the template parsed):
// errors name the flag and, for a template, its line and column.
inline Result<ChatPromptOptions> chat_prompt_options(const ChatTemplateArgs& a) {
  ChatPromptOptions o;
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

// The length of the longest tail of `s` that is a proper prefix of `marker`.
inline size_t partial_marker_tail(const std::string& s, const std::string& marker) {
  if (marker.empty()) return 0;
  for (size_t k = std::min(marker.size() - 1, s.size()); k > 0; --k)
    if (s.compare(s.size() - k, k, marker, 0, k) == 0) return k;
  return 0;
}

class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds a piece; returns the text that can be printed now. After a stop string, hit() is true and the rest is
  // dropped.
  std::string push(const std::string& piece) {
    if (hit_) return "";
    pending_ += piece;
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
    if (cut != std::string::npos) {
      hit_ = true;
      std::string out = pending_.substr(0, cut);
      pending_.clear();
      return out;
    }
    size_t keep = 0;
    for (const std::string& s : stops_) keep = std::max(keep, partial_marker_tail(pending_, s));
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
  }
  std::string flush() {
    std::string out;
    if (!hit_) out.swap(pending_);
    pending_.clear();
    return out;
  }
  bool hit() const { return hit_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool hit_ = false;
};

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

}  // namespace kiln::cli
