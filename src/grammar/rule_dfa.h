// One rule's body -> a deterministic automaton over bytes and rule calls (Thompson NFA, then subset
// construction). Internal to the grammar layer; automaton.cpp numbers the states of all rules globally.
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/limits.h"
#include "util/status.h"

namespace kiln::grammar {

struct RuleDfa {
  struct ByteEdge {
    uint8_t lo, hi;
    uint32_t to;
  };
  struct CallEdge {
    uint32_t rule;  // AST rule index
    uint32_t to;
  };
  struct State {
    std::vector<ByteEdge> bytes;  // sorted, disjoint
    std::vector<CallEdge> calls;  // sorted by rule, one edge per rule
    bool final = false;
  };
  std::vector<State> states;  // states[0] is the start
};

// Budgets are shared by all rules of a grammar: `nfa_used` / `dfa_used` accumulate against the limits.
Result<RuleDfa> build_rule_dfa(const AstRule& rule, const Limits& limits, uint64_t* nfa_used, uint64_t* dfa_used);

}  // namespace kiln::grammar
