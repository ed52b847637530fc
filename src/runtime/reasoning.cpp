#include "runtime/reasoning.h"

#include "runtime/prompt.h"

namespace kiln {

namespace {

constexpr std::string_view kSpace = " \t\r\n";

// Continuation bytes still owed after `bytes`, starting from `need`.
int utf8_need_after(int need, std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (need > 0 && (c & 0xC0) == 0x80) --need;
    else if (c >= 0xF0) need = 3;
    else if (c >= 0xE0) need = 2;
    else if (c >= 0xC0) need = 1;
    else need = 0;
  }
  return need;
}

}  // namespace

ReasoningTracker::ReasoningTracker(ReasoningBudget b) : b_(std::move(b)), state_(State::kDone) {
  if (!b_.enabled()) return;
  if (b_.opened) {
    opened_ = true;
    state_ = State::kInside;
    if (b_.budget == 0) start_forcing();
  } else if (!b_.begin.empty()) {
    state_ = State::kStart;
  }
}

void ReasoningTracker::start_forcing() {
  if (b_.close.empty()) {  // nothing to force with: the block stays the model's
    state_ = State::kDone;
    return;
  }
  state_ = State::kForcing;
  forced_close_ = true;
  pos_ = 0;
  tail_.clear();
}

// Appends a token's bytes of the block. When they complete the closing marker (the block is then over): the offset
// in `bytes` just past it; else npos.
size_t ReasoningTracker::scan_inside(std::string_view bytes) {
  const size_t before = tail_.size();  // the marker's start may be in these earlier bytes
  tail_.append(bytes);
  utf8_need_ = utf8_need_after(utf8_need_, bytes);
  if (const size_t at = tail_.find(b_.end); at != std::string::npos) {
    state_ = State::kDone;
    tail_.clear();
    return at + b_.end.size() - before;  // > 0: the marker was not complete before these bytes
  }
  const size_t keep = b_.end.size() - 1;  // a marker split across tokens: its start stays for the next token
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
  return std::string::npos;
}

void ReasoningTracker::check_budget() {
  if (state_ != State::kInside || b_.budget < 0 || n_inside_ < b_.budget) return;
  if (utf8_need_ > 0 && n_inside_ < b_.budget + 3) return;  // the character's last bytes first
  start_forcing();
}

size_t ReasoningTracker::accept(int32_t /*id*/, std::string_view bytes) {
  switch (state_) {
    case State::kDone: return 0;
    case State::kForcing:
      ++n_close_;
      if (++pos_ >= b_.close.size()) state_ = State::kDone;
      return bytes.size();
    case State::kStart: {
      ++n_start_;
      tail_.append(bytes);
      const size_t ws = tail_.find_first_not_of(kSpace);
      if (ws == std::string::npos) return 0;  // only whitespace so far
      const std::string_view t = std::string_view(tail_).substr(ws);
      if (t.size() >= b_.begin.size() && t.compare(0, b_.begin.size(), b_.begin) == 0) {
        opened_ = true;
        state_ = State::kInside;
        const std::string rest(t.substr(b_.begin.size()));  // this token's bytes after the marker (a suffix)
        tail_.clear();
        if (const size_t end = scan_inside(rest); end != std::string::npos)  // opened and closed by one token
          return bytes.size() - rest.size() + end;
        check_budget();
        return bytes.size();
      }
      if (b_.begin.compare(0, t.size(), t) == 0) return 0;  // may still become the marker
      state_ = State::kDone;  // other text first: the reply has no thinking block
      tail_.clear();
      return 0;
    }
    case State::kInside:
      if (const size_t end = scan_inside(bytes); end != std::string::npos) {
        ++n_close_;
        return end;
      }
      ++n_inside_;
      check_budget();
      return bytes.size();
  }
  return 0;
}

std::optional<int32_t> reasoning_effort_budget(std::string_view effort) {
  if (effort == "none" || effort == "minimal") return 0;
  if (effort == "low") return 1024;
  if (effort == "medium") return 8192;
  if (effort == "high") return 24576;
  if (effort == "xhigh") return -1;
  return std::nullopt;
}

ReasoningBudget reasoning_budget_for(const ChatPrompt& chat, int32_t budget, const std::string& rendered_prompt,
                                     const std::string& message) {
  ReasoningBudget b;
  if (!chat.has_reasoning() || chat.reasoning_close().empty()) return b;
  b.budget = budget;
  b.begin = chat.reply_options().think_begin;
  b.end = chat.reply_options().think_end;
  if (!message.empty()) b.close = chat.tokenize(message, /*add_bos=*/false);
  const std::vector<int32_t> close = chat.tokenize(chat.reasoning_close(), /*add_bos=*/false);
  b.close.insert(b.close.end(), close.begin(), close.end());
  b.opened = chat.prompt_opens_reasoning(rendered_prompt);
  return b;
}

void reasoning_budget_kwargs(const ChatPrompt& chat, int32_t budget, nlohmann::ordered_json* kwargs) {
  if (budget != 0 || chat.source().find("enable_thinking") == std::string::npos) return;
  if (kwargs->is_null()) *kwargs = nlohmann::ordered_json::object();
  if (!kwargs->contains("enable_thinking")) (*kwargs)["enable_thinking"] = false;
}

}  // namespace kiln
