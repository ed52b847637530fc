// Reasoning budgets: how many tokens a reply may spend inside its thinking block (<think> ... </think> and the
// other markers runtime/prompt.h's ChatPrompt knows) before the block is closed for it.
//
// One ReasoningTracker per sequence (runtime/sequence.h), on the engine thread. It reads the bytes of every
// generated token (Tokenizer::token_to_piece with special tokens rendered), so markers split across tokens, or
// sharing a token with other text, are found:
//   kStart    the reply has not opened the block: whitespace, then the opening marker opens it; any other text means
//             the reply has no thinking block (kDone)
//   kInside   counting: each token after the one that opened the block is one of the budget; the model's own
//             closing marker ends the block (kDone)
//   kForcing  the budget is spent: forced() names the next token of the forced text (ReasoningBudget::close: the
//             budget message, if any, then the closing marker with the whitespace the template writes around it),
//             which the sequence emits instead of sampling (so no logits row is needed for it), until it is out (kDone)
// A budget reached inside a UTF-8 character (byte tokens) waits for the character's last byte (at most 3 more
// tokens), so the reasoning stays valid UTF-8. The prompt may open the block itself (DeepSeek-R1, Qwen3's
// "<think>\n"): the tracker then starts inside.
//
// Budget -1 is unlimited (the tracker only counts, for usage's reasoning_tokens); 0 closes the block as soon as it
// opens (templates with an `enable_thinking` variable are also rendered with it false: reasoning_budget_kwargs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln {

class ChatPrompt;

struct ReasoningBudget {
  int32_t budget = -1;          // tokens inside the block before the close is forced; -1: unlimited
  std::string begin, end;       // the markers; an empty `end`: no tracking (the reply has no thinking block)
  // The forced text's tokens, in order once the budget is spent: the budget message's (--reasoning-budget-message,
  // tokenized on its own), then the close text's.
  std::vector<int32_t> close;
  bool opened = false;          // the prompt opened the block: the reply starts inside it
  bool enabled() const { return !end.empty(); }
};

class ReasoningTracker {
 public:
  enum class State { kStart, kInside, kForcing, kDone };

  ReasoningTracker() : state_(State::kDone) {}
  explicit ReasoningTracker(ReasoningBudget b);

  // The token the next step must emit (-1: sample as usual).
  int32_t forced() const { return state_ == State::kForcing ? b_.close[pos_] : -1; }
  // A generated token (forced or sampled) and its bytes. Returns how many of its leading bytes are the block's
  // (its markers included): all of them inside the block and while forcing, those up to the closing marker's end
  // for the token that closes it, 0 before the block opens (whitespace, or text that may still become the opening
  // marker), once it is over and when the reply has none.
  size_t accept(int32_t id, std::string_view bytes);
  State state() const { return state_; }
  // Generated tokens of the thinking block, both markers included (forced ones too); 0 when the reply has none.
  int32_t n_reasoning() const { return opened_ ? n_start_ + n_inside_ + n_close_ : 0; }
  int32_t n_inside() const { return n_inside_; }  // tokens counted against the budget
  bool forced_close() const { return forced_close_; }

 private:
  void start_forcing();
  size_t scan_inside(std::string_view bytes);
  void check_budget();

  ReasoningBudget b_;
  State state_;
  bool opened_ = false;        // the block was opened (by the prompt or the reply)
  bool forced_close_ = false;
  int32_t n_start_ = 0;        // tokens of the reply up to and including the one that opened the block
  int32_t n_inside_ = 0;
  int32_t n_close_ = 0;        // tokens of the close (the model's marker token, or the forced text)
  int utf8_need_ = 0;          // continuation bytes the block's text still needs
  size_t pos_ = 0;             // kForcing: the next token of b_.close
  std::string tail_;           // kStart: the reply's text so far; kInside: the last bytes (a marker split across tokens)
};

// The budget an OpenAI reasoning_effort names: none/minimal 0, low 1024, medium 8192, high 24576, xhigh -1
// (unlimited); nullopt for any other value.
std::optional<int32_t> reasoning_effort_budget(std::string_view effort);

// The budget of one reply to `rendered_prompt` with `chat`: its markers, the forced text tokenized (`message`, then
// the close text), whether the prompt opened the block. Disabled (enabled() false) when the template writes no
// reasoning markers.
ReasoningBudget reasoning_budget_for(const ChatPrompt& chat, int32_t budget, const std::string& rendered_prompt,
                                     const std::string& message = "");

// Budget 0 and a template with an `enable_thinking` variable (Qwen3 and its kin) that the request's own kwargs leave
// unset: `kwargs` (null or an object) gets enable_thinking = false, so the template renders the block closed.
void reasoning_budget_kwargs(const ChatPrompt& chat, int32_t budget, nlohmann::ordered_json* kwargs);

}  // namespace kiln
