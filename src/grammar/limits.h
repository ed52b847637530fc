// Bounds on what one grammar may cost: every input (GBNF text, JSON schema, regex) is untrusted, so parsing,
// compiling and matching stop with an error naming the limit instead of using unbounded time or memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::grammar {

struct Limits {
  size_t max_text_bytes = 1 << 20;        // GBNF text, schema-derived text included
  int max_nesting = 100;                  // parentheses in GBNF, groups in a regex, nesting in a JSON schema
  uint32_t max_rules = 10'000;            // defined rules
  uint32_t max_repeat = 10'000;           // m and n of {m,n}
  uint32_t max_nfa_states = 250'000;      // after expanding repetitions and character classes, all rules
  uint32_t max_dfa_states = 100'000;      // positions of the automaton, all rules
  uint64_t max_dfa_work = 20'000'000;     // NFA states and edges visited by the subset construction, all rules
  uint64_t max_mask_work = 600'000'000;   // vocabulary trie nodes visited to build the token-mask cache
  uint32_t max_chain_words = 4'000'000;   // the precomputed rule-entry chains (ambiguity and nesting of calls)
  uint32_t max_stacks = 4'096;            // parse stacks alive at once while matching (ambiguity)
};

}  // namespace kiln::grammar
