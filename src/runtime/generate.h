// The generation loop for one sequence over a model and its KV cache: prefill in chunks of n_batch tokens (only
// the last token of the prompt asks for logits), then decode one token per forward pass with the sampler chain,
// streaming each token out, until an end-of-generation token, n_predict tokens, or a full context.
//
// Per-sequence state lives in Sequence (sequence.h); Generator only owns the loop, so the server's scheduler can
// drive many Sequences over the same Engine instead. Each step fetches what the sampler needs: the backend's
// argmax id for greedy decoding without penalties, the logits row otherwise.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/sequence.h"
#include "util/status.h"

namespace kiln {

struct GenerateOptions {
  int32_t n_batch = 512;  // tokens per forward pass during prefill (at most the engine's max_batch)
  bool keep_logits = false;  // always fetch the logits row (last_logits()), even when the argmax would do
  SequenceOptions seq;    // n_predict, ignore_eos, sampling
};

struct Timings {
  double load_s = 0;        // set by the caller (model load)
  int64_t n_prompt = 0;     // tokens prefilled
  double prompt_s = 0;      // seconds in prefill forward passes
  int64_t n_gen = 0;        // tokens generated (emitted)
  double gen_s = 0;         // seconds sampling + decoding the generated tokens
  double prompt_tps() const { return prompt_s > 0 ? n_prompt / prompt_s : 0; }
  double gen_tps() const { return gen_s > 0 ? n_gen / gen_s : 0; }
};

// Receives each emitted token: its id and its text (complete UTF-8 only; may be empty). Return false to stop.
using TokenCallback = std::function<bool(int32_t id, const std::string& piece)>;

class Generator {
 public:
  // n_ctx: the most tokens this sequence may hold (0: the cache's whole n_ctx). The cache must admit seq_id.
  Generator(Engine& engine, int32_t seq_id, const GenerateOptions& opts, int64_t n_ctx = 0);

  Status validate() const;  // options and sampler parameters, naming the bad one

  // Appends tokens to the sequence and runs them through the model in chunks of n_batch, leaving the logits of
  // the last one ready for generate(). Errors: bad token id, context overflow, forward failure (the cache is
  // left holding exactly the chunks that succeeded).
  Status feed(std::span<const int32_t> tokens);
  // Makes the sequence equal `tokens`: keeps the longest common prefix already cached (at least one token is
  // re-fed so fresh logits exist), drops the rest from the cache, and feeds the new suffix. For chat turns:
  // re-rendering the whole conversation appends only the new turn's tokens.
  Status sync(std::span<const int32_t> tokens);
  // Samples and feeds tokens until a stop rule fires; returns why it stopped. Needs logits from feed()/sync().
  // The stream decoder's held-back tail is passed to the callback (id -1) at the end.
  Result<StopReason> generate(const TokenCallback& on_token);

  Sequence& sequence() { return seq_; }
  const Sequence& sequence() const { return seq_; }
  // Logits row of the last fed token (n_vocab floats), empty before the first feed or when the step fetched only
  // the argmax (greedy without penalties).
  std::span<const float> last_logits() const {
    return logits_ready_ && have_row_ ? std::span<const float>(logits_) : std::span<const float>();
  }
  Timings& timings() { return timings_; }

 private:
  Status run_pending(bool count_as_prompt);  // feeds every pending token

  Engine& engine_;
  GenerateOptions opts_;
  Sequence seq_;
  Batch batch_;
  std::vector<float> logits_;  // the last output row when it was fetched as logits
  int32_t argmax_ = -1;        // the backend's argmax of the last output row
  bool logits_ready_ = false;  // the last fed token's output is here
  bool have_row_ = false;      // ... as a logits row (else only argmax_)
  Timings timings_;
};

}  // namespace kiln
