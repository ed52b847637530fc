#include "runtime/prompt.h"

#include <algorithm>
#include <string_view>

namespace kiln {

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool add_bos, bool parse_special) {
  std::vector<int32_t> ids = tok.encode(text, /*add_special=*/false, parse_special);
  if (add_bos && tok.add_bos() && tok.bos() >= 0 && (ids.empty() || ids[0] != tok.bos()))
    ids.insert(ids.begin(), tok.bos());
  return ids;
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  return encode_prompt(tok, apply_chat_template(format, messages, add_generation_prompt), /*add_bos=*/true,
                       /*parse_special=*/true);
}

const char* chat_path_name(ChatPath p) {
  switch (p) {
    case ChatPath::kModelTemplate: return "model template";
    case ChatPath::kCallerTemplate: return "template file";
    case ChatPath::kBuiltin: return "built-in";
    case ChatPath::kPlain: return "plain";
  }
  return "?";
}

using json = nlohmann::ordered_json;

Status check_template_kwargs(const json& kwargs) {
  if (kwargs.is_null()) return Status::ok();
  if (!kwargs.is_object())
    return make_error(ErrorCode::kInvalidArgument, "chat template kwargs must be a JSON object");
  for (const char* k : {"messages", "tools", "documents", "add_generation_prompt"})
    if (kwargs.contains(k))
      return make_error(ErrorCode::kInvalidArgument,
                        "chat template kwargs may not set '%s' (it is a render argument of its own)", k);
  return Status::ok();
}

namespace {

// Whether `text` encodes (special tokens parsed) to exactly one token.
bool is_one_token(const Tokenizer& tok, const std::string& text) {
  return tok.encode(text, /*add_special=*/false, /*parse_special=*/true).size() == 1;
}

// The text of an OpenAI message's content: a string, or the "text" of its typed parts, concatenated.
std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string s;
  if (content.is_array())
    for (const json& part : content)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) s += part["text"].get<std::string>();
  return s;
}

Result<std::vector<ChatMessage>> to_chat_messages(const json& messages) {
  if (!messages.is_array()) return make_error(ErrorCode::kInvalidArgument, "messages must be a JSON array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return make_error(ErrorCode::kInvalidArgument, "messages[%zu]: an object with a string 'role' expected", i);
    out.push_back({m["role"].get<std::string>(), m.contains("content") ? content_text(m["content"]) : ""});
  }
  return out;
}

// Plain text: the system message as a paragraph, then "User: m\n" and "Assistant:<reply>\n" lines, ending with
// "Assistant:" for the model to continue.
std::string render_plain(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string s;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") s += m.content + "\n\n";
    else if (m.role == "user") s += "User: " + m.content + "\n";
    else s += "Assistant:" + m.content + "\n";
  }
  return add_generation_prompt ? s + "Assistant:" : s;
}

// A template's reasoning markers: whether its source writes them.
bool writes_reasoning(const std::string& src, const tpl::ReplyOptions& o) {
  return src.find(o.think_end) != std::string::npos || src.find(o.think_begin) != std::string::npos;
}

std::string trim_left_ws(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n\t\r");
  return b == std::string::npos ? std::string() : s.substr(b);
}

std::string rtrim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

Status check_chat_prompt_options(const ChatPromptOptions& opts) {
  if (!opts.builtin.empty() && opts.builtin != "plain")
    if (auto f = chat_format_from_name(opts.builtin); !f) return f.status();
  KILN_TRY(check_template_kwargs(opts.kwargs));
  if (!opts.template_source.empty()) {
    auto t = tpl::Template::parse(opts.template_source, opts.template_name);
    if (!t) return t.status();
  }
  return Status::ok();
}

Result<ChatPrompt> ChatPrompt::create(const Tokenizer& tok, const ChatPromptOptions& opts) {
  KILN_TRY(check_template_kwargs(opts.kwargs));
  ChatPrompt p;
  p.tok_ = &tok;
  if (opts.kwargs.is_object()) p.kwargs_ = opts.kwargs;
  if (opts.builtin == "plain") {
    p.path_ = ChatPath::kPlain;
    return p;
  }
  if (!opts.builtin.empty()) {
    KILN_ASSIGN_OR_RETURN(p.format_, chat_format_from_name(opts.builtin));
    p.path_ = ChatPath::kBuiltin;
    return p;
  }
  if (!opts.template_source.empty() || !tok.chat_template().empty()) {
    const bool caller = !opts.template_source.empty();
    p.path_ = caller ? ChatPath::kCallerTemplate : ChatPath::kModelTemplate;
    p.source_ = caller ? opts.template_source : tok.chat_template();
    p.name_ = caller ? opts.template_name : opts.model_name + ": tokenizer.chat_template";
    auto t = tpl::Template::parse(p.source_, p.name_);
    if (!t)
      return t.status().with_context(caller ? std::string("the chat template")
                                            : std::string("the model's chat template (--chat-template-file FILE or "
                                                          "--chat-template NAME replaces it)"));
    p.reply_ = tpl::reply_options_for_template(p.source_);
    p.reads_thinking_ = p.source_.find("message.thinking") != std::string::npos &&
                        p.source_.find("reasoning_content") == std::string::npos;
    p.reasoning_ = writes_reasoning(p.source_, p.reply_);
    p.reply_.extract_reasoning = p.reasoning_;
    if (p.reasoning_) p.reasoning_close_ = p.probe_reasoning_close();
    return p;
  }
  // No template: a built-in family the vocabulary's special tokens point to.
  struct Guess {
    ChatFormat f;
    const char* a;
    const char* b;
  };
  const Guess guesses[] = {
      {ChatFormat::kLlama3, "<|start_header_id|>", "<|eot_id|>"},
      {ChatFormat::kChatML, "<|im_start|>", "<|im_end|>"},
      {ChatFormat::kGemma, "<start_of_turn>", "<end_of_turn>"},
      {ChatFormat::kPhi3, "<|user|>", "<|end|>"},
  };
  for (const Guess& g : guesses)
    if (is_one_token(tok, g.a) && is_one_token(tok, g.b)) {
      p.path_ = ChatPath::kBuiltin;
      p.format_ = g.f;
      p.notice_ = strprintf("the model has no chat template: using the built-in %s format (its vocabulary has %s; "
                            "--chat-template-file FILE or --chat-template NAME overrides)",
                            chat_format_name(g.f), g.a);
      return p;
    }
  if (opts.allow_plain) {
    p.path_ = ChatPath::kPlain;
    p.notice_ = "the model has no chat template and its vocabulary has no ChatML tokens: plain-text conversation "
                "(\"User: ...\" / \"Assistant: ...\"; --chat-template-file FILE or --chat-template NAME overrides)";
    return p;
  }
  p.path_ = ChatPath::kBuiltin;
  p.format_ = ChatFormat::kChatML;
  p.notice_ = "the model has no chat template: using the built-in chatml format";
  return p;
}

std::string ChatPrompt::describe() const {
  switch (path_) {
    case ChatPath::kModelTemplate: return "the model's chat template";
    case ChatPath::kCallerTemplate: return "chat template " + name_;
    case ChatPath::kBuiltin: return std::string("built-in ") + chat_format_name(format_);
    case ChatPath::kPlain: return "plain text";
  }
  return "?";
}

Result<std::string> ChatPrompt::render(const json& messages, const json& tools, bool add_generation_prompt,
                                       const json& request_kwargs) const {
  if (path_ == ChatPath::kModelTemplate || path_ == ChatPath::kCallerTemplate) {
    tpl::RenderOptions ro;
    ro.tools = tools;
    ro.add_generation_prompt = add_generation_prompt;
    if (tok_->bos() >= 0) ro.bos_token = tok_->token_text(tok_->bos());
    if (tok_->eos() >= 0) ro.eos_token = tok_->token_text(tok_->eos());
    ro.kwargs = kwargs_;
    if (request_kwargs.is_object())
      for (const auto& [k, v] : request_kwargs.items()) ro.kwargs[k] = v;  // the request's win over the server's
    ro.template_name = name_;
    if (!reads_thinking_) return tpl::render_chat(source_, messages, ro);
    // The template reads an assistant message's reasoning as `thinking` (gpt-oss's): reasoning_content is that.
    json msgs = messages;
    if (msgs.is_array())
      for (json& m : msgs)
        if (m.is_object() && m.contains("reasoning_content") && m["reasoning_content"].is_string() &&
            !m.contains("thinking"))
          m["thinking"] = m["reasoning_content"];
    return tpl::render_chat(source_, msgs, ro);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ChatMessage> msgs, to_chat_messages(messages));
  if (path_ == ChatPath::kPlain) return render_plain(msgs, add_generation_prompt);
  return apply_chat_template(format_, msgs, add_generation_prompt);
}

Result<std::vector<int32_t>> ChatPrompt::encode(const json& messages, const json& tools, bool add_generation_prompt,
                                                bool add_bos) const {
  KILN_ASSIGN_OR_RETURN(std::string text, render(messages, tools, add_generation_prompt));
  return tokenize(text, add_bos);
}

std::vector<int32_t> ChatPrompt::tokenize(const std::string& rendered, bool add_bos) const {
  return encode_prompt(*tok_, rendered, add_bos, /*parse_special=*/path_ != ChatPath::kPlain);
}

// An assistant turn with reasoning and content rendered: the text between the two is the close as the template
// writes it, when it is the closing marker and whitespace only.
std::string ChatPrompt::probe_reasoning_close() const {
  const std::string& end = reply_.think_end;
  const std::string fallback = reply_.message_start.empty() ? "\n" + end + "\n\n" : end + reply_.message_start;
  static constexpr std::string_view kR = "kiln-reasoning-probe", kC = "kiln-content-probe";
  json msgs = json::array();
  msgs.push_back({{"role", "user"}, {"content", "q"}});
  msgs.push_back({{"role", "assistant"}, {"content", std::string(kC)}, {"reasoning_content", std::string(kR)}});
  auto text = render(msgs, nullptr, false);
  if (!text) return fallback;
  const size_t r = text->find(kR);
  const size_t c = r == std::string::npos ? r : text->find(kC, r);
  if (c == std::string::npos) return fallback;
  std::string between = text->substr(r + kR.size(), c - r - kR.size());
  const size_t m = between.find(end);
  if (m == std::string::npos) return fallback;
  const std::string& next = reply_.message_start;
  if (!next.empty()) {  // headed messages: the close ends the reasoning message and starts the next one, whose
                        // header the model writes (the answer's, or a tool call's)
    const size_t at = between.find(next, m + end.size());
    if (at == std::string::npos) return fallback;
    between.resize(at + next.size());
    for (size_t i = m + end.size(); i < at; ++i)
      if (std::string_view(" \n\t\r").find(between[i]) == std::string_view::npos) return fallback;
    return trim_left_ws(between.substr(0, m)).empty() ? between : fallback;
  }
  for (size_t i = 0; i < between.size(); ++i)
    if ((i < m || i >= m + end.size()) && std::string_view(" \n\t\r").find(between[i]) == std::string_view::npos)
      return fallback;
  return between;
}

bool ChatPrompt::prompt_opens_reasoning(const std::string& rendered_prompt) const {
  if (!reasoning_) return false;
  // The prompt ends with the opening marker (whitespace aside): DeepSeek-R1's "<think>\n". Qwen3 with
  // enable_thinking=false ends with "<think>\n\n</think>\n\n", a closed block: the reply is content.
  const std::string t = rtrim(rendered_prompt);
  const std::string& m = reply_.think_begin;
  return t.size() >= m.size() && t.compare(t.size() - m.size(), m.size(), m) == 0;
}

bool ChatPrompt::prompt_opens_tool_call(const std::string& rendered_prompt, std::string* tail) const {
  const tpl::ToolFormat* f = reply_.tool_format;
  if (!f || f->at_start) return false;
  const std::string& m = f->opener();
  const size_t core = m.find_last_not_of(" \n\t\r") + 1;  // 0 for an empty or all-whitespace opener
  if (core == 0) return false;
  // The longest prefix of the opener that the prompt ends with, from the whole opener down to its last non-space.
  const std::string& p = rendered_prompt;
  for (size_t n = m.size(); n >= core; --n)
    if (p.size() >= n && p.compare(p.size() - n, n, m, 0, n) == 0) {
      if (tail) *tail = m.substr(n);
      return true;
    }
  return false;
}

std::vector<int32_t> ChatPrompt::tool_marker_tokens() const {
  std::vector<int32_t> out;
  const tpl::ToolFormat* f = reply_.tool_format;
  if (!f || path_ == ChatPath::kPlain) return out;
  for (const std::string& lit : f->literals())
    for (int32_t id : tok_->encode(lit, /*add_special=*/false, /*parse_special=*/true))
      if (!tok_->is_eog(id) && tok_->token_to_piece(id, false).empty() && !tok_->token_to_piece(id, true).empty() &&
          std::find(out.begin(), out.end(), id) == out.end())
        out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

tpl::ParsedReply ChatPrompt::parse_reply(const std::string& text, const ReplyContext& ctx) const {
  tpl::ReplyOptions o = reply_;
  o.extract_reasoning = reasoning_;
  if (!ctx.want_tools) {
    o.tool_format = nullptr;
    o.detect_tools = false;
  }
  o.tools = ctx.tools;
  o.parallel_tool_calls = ctx.parallel;
  o.opened_tool_call = ctx.opened_tool_call;
  o.opener_tail = ctx.opened_tool_call ? ctx.opener_tail : std::string();
  const bool reopen = reasoning_ && ctx.opened_reasoning && text.find(o.think_begin) == std::string::npos;
  return tpl::parse_reply(reopen ? o.think_begin + text : text, o);
}

tpl::ParsedReply ChatPrompt::parse_reply(const std::string& text, bool want_tools, bool opened_reasoning) const {
  ReplyContext ctx;
  ctx.want_tools = want_tools;
  ctx.opened_reasoning = opened_reasoning;
  return parse_reply(text, ctx);
}

json ChatPrompt::assistant_message(const tpl::ParsedReply& reply) const {
  json m = json::object();
  m["role"] = "assistant";
  m["content"] = reply.content;
  if (!reply.reasoning_content.empty()) m["reasoning_content"] = reply.reasoning_content;
  if (!reply.tool_calls.empty()) {
    json calls = json::array();
    for (const tpl::ToolCall& c : reply.tool_calls) {
      json args;
      try {
        args = json::parse(c.arguments);
      } catch (const nlohmann::json::exception&) {
        args = c.arguments;
      }
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", args}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

std::vector<std::string> ChatPrompt::stop_strings() const {
  if (path_ == ChatPath::kPlain) return {"\nUser:", "\n\n"};
  return {};
}

// ---- ReplyStream

namespace {

// The length of the longest tail of `s` that is a proper prefix of `marker`.
size_t partial_tail(const std::string& s, const std::string& marker) {
  if (marker.empty()) return 0;
  for (size_t k = std::min(marker.size() - 1, s.size()); k > 0; --k)
    if (s.compare(s.size() - k, k, marker, 0, k) == 0) return k;
  return 0;
}

size_t skip_ws(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  return i;
}

}  // namespace

namespace {

ReplyContext reply_context(bool in_reasoning, bool want_tools) {
  ReplyContext c;
  c.opened_reasoning = in_reasoning;
  c.want_tools = want_tools;
  return c;
}

std::string trim_ws(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n\t\r");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \n\t\r") + 1 - b);
}

}  // namespace

ReplyStream::ReplyStream(const ChatPrompt& prompt, bool in_reasoning, bool want_tools)
    : ReplyStream(prompt, reply_context(in_reasoning, want_tools)) {}

ReplyStream::ReplyStream(const ChatPrompt& prompt, const ReplyContext& ctx)
    : prompt_(&prompt), ctx_(ctx), begin_(prompt.reply_options().think_begin), end_(prompt.reply_options().think_end),
      state_(!prompt.has_reasoning() ? kContent : ctx.opened_reasoning ? kReasoning : kStart) {
  messages_ = prompt.has_reasoning() && !prompt.reply_options().message_start.empty();
  new_block_ = messages_;
  if (messages_ || !ctx.want_tools) return;
  const tpl::ToolFormat* f = prompt.tool_format();
  if (!f) {  // the common formats parse_reply tries
    tool_markers_ = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
    bare_json_ = true;
  } else if (f->at_start) {
    if (!f->lead.empty()) tool_markers_.push_back(f->lead);
    bare_json_ = true;
  } else {
    tool_markers_.push_back(trim_ws(f->opener()));
  }
  holding_ = ctx.opened_tool_call;  // the reply continues a call the prompt opened: all of it waits for finish()
}

ReplyStream::Delta ReplyStream::push(const std::string& piece) {
  Delta d;
  text_ += piece;
  pending_ += piece;
  step(&d, false);
  return d;
}

void ReplyStream::emit_content(Delta* d, bool final) {
  if (holding_) return;  // everything after a tool-call marker waits for finish()
  if (!content_started_) {
    const size_t ws = skip_ws(pending_);
    if (bare_json_ && ws < pending_.size() && pending_[ws] == '{') {
      holding_ = true;
      return;
    }
    if (ws == pending_.size() && !final && bare_json_) return;  // whitespace so far: a '{' may still open it
    content_started_ = !pending_.empty();
  }
  size_t cut = std::string::npos;
  for (const std::string& m : tool_markers_) cut = std::min(cut, pending_.find(m));
  if (cut != std::string::npos) {
    std::string before = pending_.substr(0, cut);
    while (!before.empty() && std::string_view(" \n\t\r").find(before.back()) != std::string_view::npos)
      before.pop_back();
    d->content += before;
    streamed_content_ += before;
    pending_.erase(0, cut);
    holding_ = true;
    return;
  }
  size_t keep = 0;
  if (!final && !tool_markers_.empty()) {
    for (const std::string& m : tool_markers_) keep = std::max(keep, partial_tail(pending_, m));
    // The whitespace before (a possible start of) a marker waits too: parse_reply drops what separates content
    // from a tool call.
    while (keep < pending_.size() &&
           std::string_view(" \n\t\r").find(pending_[pending_.size() - 1 - keep]) != std::string_view::npos)
      ++keep;
  }
  const std::string out = pending_.substr(0, pending_.size() - keep);
  d->content += out;
  streamed_content_ += out;
  pending_.erase(0, pending_.size() - keep);
}

void ReplyStream::step_messages(Delta* d, bool final) {
  const tpl::ReplyOptions& o = prompt_->reply_options();
  // A body's text: leading whitespace dropped, "\n\n" before a second body of its kind (parse_reply's join).
  const auto body = [&](std::string text, std::string* out, std::string* streamed) {
    if (new_block_) {
      text.erase(0, skip_ws(text));
      if (text.empty()) return;
      if (!streamed->empty()) text = "\n\n" + text;
      new_block_ = false;
    }
    *out += text;
    *streamed += text;
  };
  for (;;) {
    if (holding_) return;
    if (state_ == kStart) {
      const size_t ws = skip_ws(pending_);
      const std::string t = pending_.substr(ws);
      bool matched = false, prefix = false;
      const auto take = [&](const std::string& m, State next) {
        if (matched || m.empty()) return;
        if (t.compare(0, m.size(), m) == 0) {
          pending_.erase(0, ws + m.size());
          state_ = next;
          new_block_ = matched = true;
        } else if (m.compare(0, t.size(), t) == 0) {
          prefix = true;
        }
      };
      take(o.message_start, kStart);
      take(o.think_begin, kReasoning);
      for (const std::string& h : o.content_headers) take(h, kContent);
      if (matched) continue;
      if (t.empty() || (prefix && !final)) return;  // may still become a header
      holding_ = true;  // a tool call, or text that is no message: parse_reply decides at finish()
      return;
    }
    // a body: up to the first end marker or the next message's start; a possible start of one waits
    size_t e = pending_.find(o.message_start), marker = 0;
    for (const std::string& m : o.message_ends)
      if (const size_t at = pending_.find(m); at < e) e = at, marker = m.size();
    std::string* out = state_ == kReasoning ? &d->reasoning : &d->content;
    std::string* streamed = state_ == kReasoning ? &streamed_reasoning_ : &streamed_content_;
    if (e != std::string::npos) {
      body(rtrim(pending_.substr(0, e)), out, streamed);
      pending_.erase(0, e + marker);
      if (state_ == kReasoning) d->reasoning_ended = true;
      state_ = kStart;
      continue;
    }
    size_t keep = 0;
    if (!final) {
      keep = partial_tail(pending_, o.message_start);
      for (const std::string& m : o.message_ends) keep = std::max(keep, partial_tail(pending_, m));
      // trailing whitespace waits too: parse_reply trims each body
      while (keep < pending_.size() &&
             std::string_view(" \n\t\r").find(pending_[pending_.size() - 1 - keep]) != std::string_view::npos)
        ++keep;
    }
    std::string text = pending_.substr(0, pending_.size() - keep);
    if (final) text.erase(text.find_last_not_of(" \n\t\r") + 1);  // npos + 1 == 0: all whitespace
    body(text, out, streamed);
    pending_.erase(0, pending_.size() - keep);
    return;
  }
}

void ReplyStream::step(Delta* d, bool final) {
  if (messages_) return step_messages(d, final);
  for (;;) {
    if (state_ == kStart) {
      const size_t ws = skip_ws(pending_);
      const std::string t = pending_.substr(ws);
      if (t.size() >= begin_.size() && t.compare(0, begin_.size(), begin_) == 0) {
        pending_.erase(0, ws + begin_.size());
        state_ = kReasoning;
        continue;
      }
      if (!final && begin_.compare(0, t.size(), t) == 0) return;  // may still become the marker
      state_ = kContent;
      continue;
    }
    if (state_ == kReasoning) {
      const size_t e = pending_.find(end_);
      if (e != std::string::npos) {
        d->reasoning += pending_.substr(0, e);
        pending_.erase(0, e + end_.size());
        d->reasoning_ended = true;
        state_ = kContent;
        after_reasoning_ = true;
        continue;
      }
      const size_t keep = final ? 0 : partial_tail(pending_, end_);
      d->reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    if (after_reasoning_) {  // the whitespace separating content from the reasoning block is not content
      pending_.erase(0, skip_ws(pending_));
      if (pending_.empty() && !final) return;
      after_reasoning_ = false;
    }
    emit_content(d, final);
    return;
  }
}

ReplyStream::Delta ReplyStream::finish() {
  Delta d;
  step(&d, true);
  if (!holding_) return d;
  // Held from a tool-call marker on: the calls, and the held text that is not one (a malformed block stays).
  const tpl::ParsedReply r = parsed();
  d.tool_calls = r.tool_calls;
  if (r.content.compare(0, streamed_content_.size(), streamed_content_) == 0)
    d.content += r.content.substr(streamed_content_.size());
  if (messages_ && r.reasoning_content.compare(0, streamed_reasoning_.size(), streamed_reasoning_) == 0)
    d.reasoning += r.reasoning_content.substr(streamed_reasoning_.size());  // reasoning after a held message
  pending_.clear();
  return d;
}

tpl::ParsedReply ReplyStream::parsed() const { return prompt_->parse_reply(text_, ctx_); }

}  // namespace kiln
