#include "runtime/grammar_mask.h"

#include <algorithm>

namespace kiln {

namespace {

// One sequence's grammar state behind the token-mask hook. The matcher writes 32-bit words (bit i of word i / 32);
// the hook's mask is 64-bit words over the model's n_vocab, which may exceed the tokenizer's vocabulary (padded
// embedding rows): those ids have no bit in the matcher's mask and stay disallowed.
class GrammarMask final : public TokenMaskProvider {
 public:
  explicit GrammarMask(std::shared_ptr<const grammar::CompiledGrammar> g) : matcher_(std::move(g)) {}

  // Advances over text that was not sampled under this mask (a lazy grammar's trigger); false: refused, the state
  // is unchanged.
  bool accept_text(std::string_view bytes) { return matcher_.accept_bytes(bytes).is_ok(); }
  const grammar::VocabIndex& vocab() const { return matcher_.compiled().vocab(); }

  bool restricts() const override { return true; }
  // fill_mask reads the matcher's stacks and leaves them as they were (its scratch is truncated back).
  bool allowed_ahead() const override { return true; }

  bool allowed(std::span<uint64_t> mask) override {
    std::fill(mask.begin(), mask.end(), uint64_t{0});
    if (failed_) return true;  // a token the grammar refused was accepted: nothing may follow (the sequence errs)
    words_.resize(std::max(mask.size() * 2, matcher_.compiled().vocab().mask_words()));
    matcher_.fill_mask(words_);
    for (size_t k = 0; k < mask.size(); ++k) mask[k] = words_[2 * k] | (uint64_t{words_[2 * k + 1]} << 32);
    return true;
  }

  void accept(int32_t token) override {
    // The sampler drew under the mask, so the grammar accepts the token; a refusal can only come from a path that
    // bypassed the mask, and then the next mask is empty, which ends the sequence with an error.
    if (!failed_ && !matcher_.accept_token(token).is_ok()) failed_ = true;
  }

  bool finished() const override {
    return !failed_ && (matcher_.is_terminated() || (matcher_.is_complete() && matcher_.num_stacks() == 0));
  }

 private:
  grammar::Matcher matcher_;
  std::vector<uint32_t> words_;
  bool failed_ = false;
};

// Free until the scanner fires, then the grammar's mask (runtime/hooks.h for the calls).
class LazyGrammarMask final : public TokenMaskProvider {
 public:
  LazyGrammarMask(std::shared_ptr<const grammar::CompiledGrammar> g, GrammarTriggers t)
      : inner_(std::move(g)), scanner_(std::move(t)) {
    if (scanner_.prefix()) engaged_ = inner_.accept_text(*scanner_.prefix());
  }

  bool restricts() const override { return engaged_; }
  bool allowed_ahead() const override { return true; }  // engaged_ changes in accept() only
  bool allowed(std::span<uint64_t> mask) override { return engaged_ && inner_.allowed(mask); }

  void accept(int32_t token) override {
    if (engaged_) return inner_.accept(token);
    if (scanner_.done() || token < 0 || token >= inner_.vocab().size()) return;
    feed(inner_.vocab().token(token));
  }

  // A token of the thinking block is not scanned; the output starts over after it (an at_start call may follow the
  // block). Text before the block opens is scanned as any (it is whitespace, or may still be the opening marker).
  void accept_in_block(int32_t token, std::string_view text, size_t n_block) override {
    if (engaged_ || n_block == 0) return accept(token);
    scanner_.restart();
    if (n_block < text.size()) feed(text.substr(n_block));
  }

  bool finished() const override { return engaged_ && inner_.finished(); }

 private:
  void feed(std::string_view bytes) {
    if (std::optional<std::string> text = scanner_.feed(bytes)) engaged_ = inner_.accept_text(*text);
  }

  GrammarMask inner_;
  TriggerScanner scanner_;
  bool engaged_ = false;
};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

TriggerScanner::TriggerScanner(GrammarTriggers t) : t_(std::move(t)) {
  std::erase_if(t_.words, [](const std::string& w) { return w.empty(); });
  for (const std::string& w : t_.words) keep_ = std::max(keep_, w.size() - 1);
  dead_ = t_.words.empty();
  if (!dead_ && !t_.prefix.empty()) start_from_prefix();
  t_.prefix.clear();
}

// A word ending at the prefix's end fires (the longest); one wholly before it does not: the tail kept is shorter
// than any word (at_start: the prefix must be whitespace, the lead and a word or its start, and nothing after).
void TriggerScanner::start_from_prefix() {
  const std::string& p = t_.prefix;
  if (t_.at_start) {
    tail_ = p;
    std::optional<std::string> out = match_at_start();
    if (!out) return;
    if (std::find(t_.words.begin(), t_.words.end(), *out) != t_.words.end()) {
      prefix_fired_ = std::move(out);
    } else {  // a whole call (or more) after the word: the output is past its start
      fired_ = false;
      dead_ = true;
    }
    return;
  }
  for (const std::string& w : t_.words)
    if (p.ends_with(w) && (!prefix_fired_ || w.size() > prefix_fired_->size())) prefix_fired_ = w;
  if (prefix_fired_) {
    fired_ = true;
    return;
  }
  tail_ = p.substr(p.size() - std::min(p.size(), keep_));
  for (const std::string& w : t_.words)  // a shorter word wholly in the tail is before the end: not again
    for (size_t at = tail_.find(w); at != std::string::npos; at = tail_.find(w)) tail_.erase(0, at + 1);
}

void TriggerScanner::restart() {
  if (fired_) return;
  tail_.clear();
  dead_ = t_.words.empty();
}

std::optional<std::string> TriggerScanner::feed(std::string_view bytes) {
  if (done()) return std::nullopt;
  tail_.append(bytes);
  if (t_.at_start) return match_at_start();
  // The earliest word start wins (the longer word at one start).
  size_t best = std::string::npos, best_len = 0;
  for (const std::string& w : t_.words) {
    const size_t at = tail_.find(w);
    if (at != std::string::npos && (at < best || (at == best && w.size() > best_len))) best = at, best_len = w.size();
  }
  if (best != std::string::npos) {
    fired_ = true;
    std::string out = tail_.substr(best);
    tail_.clear();
    return out;
  }
  if (tail_.size() > keep_) tail_.erase(0, tail_.size() - keep_);
  return std::nullopt;
}

// The output so far: whitespace, optionally the lead and more whitespace, then a word (fires), a proper prefix of
// the lead or of a word (waits), or anything else (never fires).
std::optional<std::string> TriggerScanner::match_at_start() {
  size_t i = 0;
  auto skip_space = [&] {
    while (i < tail_.size() && is_space(tail_[i])) ++i;
  };
  auto prefix_of = [](std::string_view rest, const std::string& w) {
    return rest.size() < w.size() && w.starts_with(rest);
  };
  skip_space();
  std::string_view rest = std::string_view(tail_).substr(i);
  if (!t_.lead.empty()) {
    if (prefix_of(rest, t_.lead)) return std::nullopt;
    if (rest.starts_with(t_.lead)) {
      i += t_.lead.size();
      skip_space();
      rest = std::string_view(tail_).substr(i);
    }
  }
  bool waits = rest.empty();
  for (const std::string& w : t_.words) {
    if (rest.starts_with(w)) {
      fired_ = true;
      std::string out(rest);
      tail_.clear();
      return out;
    }
    waits = waits || prefix_of(rest, w);
  }
  if (!waits) {
    dead_ = true;
    tail_.clear();
  } else {
    tail_.erase(0, i);  // the lead is optional: what follows it is matched the same without it
  }
  return std::nullopt;
}

grammar::Vocabulary grammar_vocabulary(const Tokenizer& tok, const std::vector<int32_t>& text_tokens) {
  grammar::Vocabulary v;
  const int32_t n = tok.n_vocab();
  v.tokens.reserve(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    const bool as_text = std::find(text_tokens.begin(), text_tokens.end(), id) != text_tokens.end();
    v.tokens.push_back(tok.token_to_piece(id, /*render_special=*/as_text));
    if (tok.is_eog(id)) v.eog_ids.push_back(id);
  }
  return v;
}

SequenceHooksFactory grammar_hooks(std::shared_ptr<const grammar::CompiledGrammar> g) {
  return [g = std::move(g)] {
    SequenceHooks h;
    h.mask = std::make_unique<GrammarMask>(g);
    return h;
  };
}

SequenceHooksFactory lazy_grammar_hooks(std::shared_ptr<const grammar::CompiledGrammar> g, GrammarTriggers triggers) {
  return [g = std::move(g), triggers = std::move(triggers)] {
    SequenceHooks h;
    h.mask = std::make_unique<LazyGrammarMask>(g, triggers);
    return h;
  };
}

GrammarCache::GrammarCache(const Tokenizer& tok) : GrammarCache(tok, Options{}) {}
GrammarCache::GrammarCache(const Tokenizer& tok, Options opts) : tok_(tok), opts_(opts) {}

std::shared_ptr<const grammar::VocabIndex> GrammarCache::vocab(const std::vector<int32_t>& text_tokens) {
  if (text_tokens.empty()) {
    std::call_once(vocab_once_, [&] { vocab_ = grammar::VocabIndex::build(grammar_vocabulary(tok_)); });
    return vocab_;
  }
  std::vector<int32_t> key = text_tokens;
  std::sort(key.begin(), key.end());
  std::lock_guard<std::mutex> lk(vocab_mu_);
  auto& v = text_vocabs_[key];
  if (!v) v = grammar::VocabIndex::build(grammar_vocabulary(tok_, key));
  return v;
}

GrammarCache::Compiled GrammarCache::compile(const std::string& gbnf, const std::vector<int32_t>& text_tokens) {
  try {
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<const grammar::Grammar> g, grammar::Grammar::from_gbnf(gbnf));
    return grammar::CompiledGrammar::compile(std::move(g), vocab(text_tokens), opts_.threads);
  } catch (const std::exception& e) {  // memory: the waiters must still hear, and the entry must not stay pending
    return make_error(ErrorCode::kOutOfRange, "grammar: compiling failed: %s", e.what());
  }
}

Result<std::shared_ptr<const grammar::CompiledGrammar>> GrammarCache::get(const std::string& text,
                                                                         const std::vector<int32_t>& text_tokens) {
  // The key: "-" and the GBNF text, or with text tokens "+" and their ids before it (every key has its prefix, so
  // no grammar text can spell another set's key).
  std::string key = "-" + text;
  if (!text_tokens.empty()) {
    std::vector<int32_t> ids = text_tokens;
    std::sort(ids.begin(), ids.end());
    key = "+";
    for (int32_t id : ids) key += std::to_string(id) + ",";
    key += "\n" + text;
  }
  std::promise<Compiled> promise;
  std::shared_future<Compiled> fut;
  uint64_t serial = 0;  // this call's entry, when it compiles
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      fut = it->second.value;
    } else {
      ++stats_.misses;
      serial = ++serial_;
      fut = promise.get_future().share();
      lru_.push_front(key);
      entries_.emplace(key, Entry{fut, 0, lru_.begin(), serial});
    }
  }
  if (serial == 0) return fut.get();  // cached, or being compiled by another request: wait for it
  Compiled c = compile(text, text_tokens);
  const size_t bytes = c.is_ok() ? (*c)->stats().memory_bytes : 0;
  promise.set_value(c);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.serial == serial) {  // (else evicted meanwhile, maybe compiled again)
    it->second.bytes = bytes;
    stats_.bytes += bytes;
  }
  evict_locked();
  return c;
}

// Least recently used first, never the only entry (a grammar larger than max_bytes is still compiled and used).
void GrammarCache::evict_locked() {
  while (lru_.size() > 1 && (lru_.size() > opts_.max_entries || stats_.bytes > opts_.max_bytes)) {
    auto it = entries_.find(lru_.back());
    stats_.bytes -= it->second.bytes;
    entries_.erase(it);
    lru_.pop_back();
  }
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.entries = entries_.size();
  return s;
}

}  // namespace kiln
