// Grammar-constrained generation in the engine loop: a grammar (src/grammar, docs/GRAMMAR.md) as a sequence's
// TokenMaskProvider (runtime/hooks.h), and the compiled grammars of one model kept for reuse.
//
//   GBNF text --GrammarCache::get--> CompiledGrammar (shared, immutable) --grammar_hooks--> one Matcher per sequence
//
// Per step (runtime/hooks.h): allowed() fills the mask from the matcher (EOG ids only once the grammar is
// complete), accept() advances it, finished() ends the sequence once the grammar is complete and no byte can follow
// (so `guided_choice` ends right after the choice, with no step spent on an EOG token). Masks are computed on the
// CPU on the engine thread: before the step for a greedy sequence whose device takes the masked argmax
// (allowed_ahead), else in update().
//
// GrammarCache: compiling a JSON schema's mask cache over a 150k-token vocabulary takes about a second, so a server
// keeps compiled grammars by their GBNF text (least recently used dropped past a count and a memory bound). The
// vocabulary index is built once, on first use. Thread-safe: request threads compile while the engine thread runs
// matchers over grammars compiled before; concurrent requests for one text wait for a single compile.
//
// Lazy grammars (llama.cpp's grammar_lazy; tool_choice "auto"): the output is free until a trigger text appears in
// it (TriggerScanner, across token boundaries); the grammar then constrains the rest, fed first with the output from
// the trigger's first byte on, so the constrained part continues the trigger. A trigger may begin in the text the
// output continues (the prompt's end: an assistant prefill); text of the reply's thinking block is not scanned.
//
// This header names no model or backend type (the server includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "runtime/hooks.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

// The vocabulary as the grammar layer sees it: each id's output bytes (Tokenizer::token_to_piece without special
// rendering: "" for control tokens, which a grammar never allows as text, except `text_tokens`, which the reply
// shows as their text: GenRequest::text_tokens) and the tokenizer's EOG ids.
grammar::Vocabulary grammar_vocabulary(const Tokenizer& tok, const std::vector<int32_t>& text_tokens = {});

// The hooks of a sequence whose output `g` constrains (a fresh Matcher per sequence).
SequenceHooksFactory grammar_hooks(std::shared_ptr<const grammar::CompiledGrammar> g);

// What engages a lazy grammar.
struct GrammarTriggers {
  std::vector<std::string> words;  // any of these texts, anywhere in the output (non-empty texts)
  // at_start: a word counts only at the start of the output, after whitespace and optionally `lead` (Llama 3's
  // bare JSON call, which may follow <|python_tag|>).
  bool at_start = false;
  std::string lead;
  // The text the output continues (the end of the prompt: the generation prompt and an assistant prefill; at_start:
  // the prefill only, the start of the output). A word that ends at its end, or begins in it and ends in the output,
  // fires; one that ends before its end (an earlier, complete tool call) does not.
  std::string prefix{};
};

// Finds the first trigger word in output text fed piece by piece (a word may be split over several pieces). Keeps
// the last (longest word - 1) bytes only; at_start keeps the output while it may still open with a word.
class TriggerScanner {
 public:
  // Starts from t.prefix: prefix() says whether a word ends at its end.
  explicit TriggerScanner(GrammarTriggers t);
  // The prefix's word, when one ends at the prefix's end: that word (the text the grammar is fed; the scanner is
  // done). Else nullopt, and the prefix's last (longest word - 1) bytes, or at_start the whole of it, are kept.
  const std::optional<std::string>& prefix() const { return prefix_fired_; }
  // Feeds the next bytes of the output. When a word appears: the output from its first byte to the end of `bytes`
  // (the text the grammar is fed), and the scanner is done (later feeds return nullopt). Before: nullopt.
  std::optional<std::string> feed(std::string_view bytes);
  // The output starts over here (after a thinking block): the text kept so far is dropped, and at_start may fire
  // again. A scanner that fired stays done.
  void restart();
  bool fired() const { return fired_; }
  // No word can appear any more (at_start: the output opened with something else; or it fired).
  bool done() const { return fired_ || dead_; }

 private:
  std::optional<std::string> match_at_start();
  void start_from_prefix();

  GrammarTriggers t_;
  std::optional<std::string> prefix_fired_;
  size_t keep_ = 0;   // the longest word's length - 1
  std::string tail_;  // the output's last bytes that may start a word (at_start: the whole output so far)
  bool fired_ = false, dead_ = false;
};

// The hooks of a sequence whose output is free until one of `triggers` appears, then constrained by `g` (a fresh
// scanner and Matcher per sequence). Free, the mask restricts nothing (a greedy sequence keeps the device argmax).
// The trigger text with what followed it in the same token is fed to the grammar; when the grammar refuses that
// text the output stays free to its end (as without the grammar: the reply parser reads what it can). A trigger
// that ends at the prefix's end engages the grammar before the first token. Text inside the reply's thinking block
// (TokenMaskProvider::accept_in_block) is not scanned: a model that thinks about a call is not constrained there,
// and scanning starts over after the block.
SequenceHooksFactory lazy_grammar_hooks(std::shared_ptr<const grammar::CompiledGrammar> g, GrammarTriggers triggers);

class GrammarCache {
 public:
  struct Options {
    size_t max_entries = 64;               // compiled grammars kept (failures too: a refused grammar stays refused)
    size_t max_bytes = size_t{512} << 20;  // their mask caches together (CompiledGrammar::Stats::memory_bytes)
    int threads = 1;                       // compile threads per grammar (the caller's thread included)
  };
  struct Stats {
    uint64_t hits = 0, misses = 0;
    size_t entries = 0, bytes = 0;
  };

  // tok must outlive the cache (the vocabulary index is built from it on first use).
  explicit GrammarCache(const Tokenizer& tok);
  GrammarCache(const Tokenizer& tok, Options opts);

  // The grammar compiled for this model's vocabulary: cached, or compiled now. Errors are the grammar layer's
  // (InvalidArgument naming the line and column, or the limit hit); the caller names the request field or flag.
  // text_tokens: control tokens the grammar may write as their text (grammar_vocabulary); the request must show
  // them as text too (GenRequest::text_tokens).
  Result<std::shared_ptr<const grammar::CompiledGrammar>> get(const std::string& gbnf,
                                                              const std::vector<int32_t>& text_tokens = {});
  std::shared_ptr<const grammar::VocabIndex> vocab(const std::vector<int32_t>& text_tokens = {});
  Stats stats() const;

 private:
  using Compiled = Result<std::shared_ptr<const grammar::CompiledGrammar>>;
  struct Entry {
    std::shared_future<Compiled> value;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
    uint64_t serial = 0;                   // which compile made it (an evicted text may be compiled again)
  };
  Compiled compile(const std::string& gbnf, const std::vector<int32_t>& text_tokens);
  void evict_locked();

  const Tokenizer& tok_;
  Options opts_;
  std::once_flag vocab_once_;
  std::shared_ptr<const grammar::VocabIndex> vocab_;
  std::mutex vocab_mu_;  // the vocabularies with text tokens, one per set (a tool-call format's markers)
  std::map<std::vector<int32_t>, std::shared_ptr<const grammar::VocabIndex>> text_vocabs_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;
  Stats stats_;
  uint64_t serial_ = 0;
};

}  // namespace kiln
