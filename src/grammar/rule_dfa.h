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

// The rules whose bodies are copied into their callers instead of being called (inline_rule[r] != 0): small
// rules that are not recursive. Fewer rule boundaries means fewer tokens whose fate depends on the stack (a token
// crossing the end of a rule is "uncertain" in the mask cache), at the price of more positions.
std::vector<uint8_t> choose_inline_rules(const Ast& ast, const std::vector<uint32_t>& reachable);

// Budgets are shared by all rules of a grammar: `nfa_used` / `dfa_used` / `dfa_work` accumulate against the
// limits. The DFA is
// minimal (equivalent states merged), so copies of one inlined rule with the same continuation share positions.
Result<RuleDfa> build_rule_dfa(const Ast& ast, uint32_t rule, const std::vector<uint8_t>& inline_rule,
                               const Limits& limits, uint64_t* nfa_used, uint64_t* dfa_used, uint64_t* dfa_work);

}  // namespace kiln::grammar
