// The grammar layer's public API: constrained decoding over a model's vocabulary.
//
//   text (GBNF / JSON schema / regex / choice) --compile--> Grammar            (no vocabulary; shareable)
//   Grammar + VocabIndex (one per model)      --compile--> CompiledGrammar    (per-position token-mask cache)
//   CompiledGrammar                           --------->   Matcher            (one per sequence: state, masks)
//
// Grammar, VocabIndex and CompiledGrammar are immutable once built and may be shared by matchers on any threads
// (a server can keep compiled grammars by schema text); a Matcher belongs to one sequence and one thread at a time.
//
// Per decode step: matcher.fill_mask(words) -> sample under the mask -> matcher.accept_token(id). EOS/EOG ids
// are allowed exactly when matcher.is_complete(); accepting one terminates the matcher. rollback(k) undoes the
// last k accepted tokens (speculative decoding). Errors are values; no call aborts on user input, and parsing,
// compiling and matching are bounded by Limits (grammar/limits.h).
//
// docs/GRAMMAR.md lists the supported GBNF, JSON-schema and regex features and the exact errors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "grammar/limits.h"
#include "util/status.h"

namespace kiln::grammar {

struct Automaton;
class TokenTrie;

// ---- grammar sources -> GBNF text --------------------------------------------------------------------------

struct SchemaOptions {
  // The whitespace allowed between JSON tokens: llama.cpp's `| " " | "\n"{1,2} [ \t]{0,20}`; false: none at all.
  bool allow_whitespace = true;
  // Prefixes every rule name (the root rule is then `<prefix>root`), so that the rules of several schemas can
  // share one grammar (a tool-call grammar holds one schema per tool).
  std::string rule_prefix;
};

// A JSON schema -> GBNF. A keyword the compiler cannot enforce is an error naming its JSON pointer, e.g.
// "json schema: /properties/age/multipleOf: keyword 'multipleOf' is not supported". Properties keep the schema's
// order (hence ordered_json); the text overload parses the schema first.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaOptions& options = {},
                                        const Limits& limits = {});
Result<std::string> json_schema_to_gbnf(std::string_view schema_text, const SchemaOptions& options = {},
                                        const Limits& limits = {});
// OpenAI `response_format: {"type": "json_object"}`: any JSON object.
std::string json_object_gbnf(const SchemaOptions& options = {});
// vLLM guided_regex: the whole output matches the pattern (see docs/GRAMMAR.md for the subset).
Result<std::string> regex_to_gbnf(std::string_view pattern, const Limits& limits = {});
// vLLM guided_choice: the output is exactly one of the strings (at least one, each non-empty).
Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices);

// ---- compiled grammar ---------------------------------------------------------------------------------------

class Grammar {
 public:
  static Result<std::shared_ptr<const Grammar>> from_gbnf(std::string_view text, const Limits& limits = {});
  ~Grammar();

  const Automaton& automaton() const { return *automaton_; }
  const Limits& limits() const { return limits_; }
  size_t num_rules() const;
  size_t num_positions() const;

 private:
  Grammar() = default;
  std::unique_ptr<Automaton> automaton_;
  Limits limits_;
};

// The vocabulary as bytes: tokens[id] is what token id stands for in the output text (byte-level decoded:
// Tokenizer::token_to_piece(id, false)); "" for control/special tokens, which a grammar never allows as text.
// eog_ids: the ids that end generation (EOS, EOT, <|im_end|>, ...): allowed exactly when the grammar is complete.
struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<int32_t> eog_ids;
};

// The vocabulary sorted by bytes with a trie over it: built once per model and shared by every grammar.
class VocabIndex {
 public:
  static std::shared_ptr<const VocabIndex> build(Vocabulary vocab);
  ~VocabIndex();

  int32_t size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  size_t mask_words() const { return (vocab_.tokens.size() + 31) / 32; }  // uint32 words of a token mask
  const std::string& token(int32_t id) const { return vocab_.tokens[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& eog_ids() const { return vocab_.eog_ids; }
  bool is_eog(int32_t id) const;
  const TokenTrie& trie() const { return *trie_; }
  size_t trie_nodes() const;

 private:
  VocabIndex() = default;
  Vocabulary vocab_;
  std::vector<uint8_t> is_eog_;
  std::unique_ptr<TokenTrie> trie_;
};

// A grammar compiled for one vocabulary: for every position of the automaton, the tokens accepted or rejected
// by that position alone and the few whose fate depends on the stack below (XGrammar's adaptive mask cache).
class CompiledGrammar {
 public:
  struct Stats {
    double compile_ms = 0;           // the mask cache (the Grammar itself is compiled before)
    double share_ms = 0;             // of which: finding the positions that can share an entry
    size_t positions = 0;            // cache entries computed (positions alike for every token share one)
    size_t uncertain_tokens = 0;     // summed over positions: the tokens the stack must decide at run time
    size_t bitset_positions = 0;     // positions whose accepted set is stored as a bitset (dense)
    size_t memory_bytes = 0;
  };
  // threads: compile the per-position caches on that many threads (<= 0: one).
  static Result<std::shared_ptr<const CompiledGrammar>> compile(std::shared_ptr<const Grammar> grammar,
                                                                std::shared_ptr<const VocabIndex> vocab,
                                                                int threads = 1);
  ~CompiledGrammar();

  const Grammar& grammar() const { return *grammar_; }
  const VocabIndex& vocab() const { return *vocab_; }
  const Stats& stats() const { return stats_; }

  // The cache entry of one position. Accepted tokens: `accepted_count` ids at id_pool[accepted_begin] (ascending)
  // or, when `bitset`, mask_words() words at bit_pool[accepted_begin]. Uncertain tokens: `uncertain_count` ranks
  // (indices into the byte-sorted vocabulary) at rank_pool[uncertain_begin]. Every other token is rejected.
  struct PositionMask {
    uint32_t accepted_begin = 0, accepted_count = 0;
    uint32_t uncertain_begin = 0, uncertain_count = 0;
    bool bitset = false;
  };
  const PositionMask& position_mask(uint32_t pos) const { return masks_[pos]; }
  const uint32_t* accepted_ids(const PositionMask& m) const { return id_pool_.data() + m.accepted_begin; }
  const uint32_t* accepted_bits(const PositionMask& m) const { return bit_pool_.data() + m.accepted_begin; }
  const uint32_t* uncertain_ranks(const PositionMask& m) const { return rank_pool_.data() + m.uncertain_begin; }

 private:
  friend class MaskCacheBuilder;
  CompiledGrammar() = default;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const VocabIndex> vocab_;
  std::vector<PositionMask> masks_;   // per position (empty entries for positions without byte edges)
  std::vector<uint32_t> id_pool_;     // sparse accepted sets: token ids, ascending
  std::vector<uint32_t> bit_pool_;    // dense accepted sets: mask_words() words each
  std::vector<uint32_t> rank_pool_;   // uncertain tokens: ranks in byte order, ascending
  Stats stats_;
};

class StackArena;

// The state of one sequence: the set of live parse stacks (a pushdown automaton run nondeterministically; stacks
// are persistent and shared), whether the grammar may end here, and the history that rollback() restores.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Bit i of words (word i / 32, bit i % 32) = token i may come next. words.size() >= vocab().mask_words();
  // bits past the vocabulary are cleared.
  void fill_mask(std::span<uint32_t> words);
  // Whether token id may come next (the same answer as its bit in fill_mask, without computing a mask).
  bool can_accept(int32_t id);
  // Advances over the token; an error (InvalidArgument naming the token) leaves the state unchanged.
  Status accept_token(int32_t id);
  // Advances over raw bytes (a forced prefix); not a token: rollback() cannot split it from the token before it.
  Status accept_bytes(std::string_view bytes);
  // Undoes the last n accept_token / accept_bytes calls.
  Status rollback(int n);
  void reset();

  bool is_complete() const;    // the grammar may end here: an EOG token is allowed
  bool is_terminated() const;  // an EOG token was accepted: nothing more is allowed
  int history_size() const;    // accept calls that rollback() can undo
  // The fewest bytes that complete the grammar from here (0 when complete).
  uint32_t min_bytes_to_complete() const;
  size_t num_stacks() const;

  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  struct State;
  struct Impl;
  Status advance(std::string_view bytes, const char* what);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::grammar
