// The byte-level pushdown automaton a grammar compiles to (internal to the grammar layer).
//
// Every rule reachable from `root` becomes a deterministic automaton over bytes whose edges are byte ranges or
// calls of other rules (a call edge `R -> t`: run rule R, then continue at t). The states of all rules are
// numbered globally and called positions. A parse stack is a list of positions: the top is where the next byte
// is matched; every position below it is a return position (where its rule continues once the rule above ends).
//
// Precomputed per position p, so that matching never searches:
//  - chains(p): every way to reach a byte-consuming position from p without consuming a byte: a chain
//    [t1, ..., tk, top] pushes return positions t1..tk (t1 in p's rule) and then top. Calls of rules that can
//    match the empty string are also skipped over (their return position joins p's closure). Left recursion
//    would make this infinite: it is an error, as in llama.cpp.
//  - pops(p): p's rule can end at p without consuming a byte (the stack then pops to the return position below).
//  - simple(p): chains(p) is exactly [[p]] and p cannot pop (the matcher's fast path: nothing to push or pop).
//  - dist(p): the fewest bytes that finish p's rule from p (all rules reachable from root are productive: a
//    rule that can never finish is an error, so every stack can always be completed).
//  - follow(rule): the bytes that may come right after the rule ends, in any context.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/limits.h"
#include "util/status.h"

namespace kiln::grammar {

using ByteSet = std::array<uint64_t, 4>;
inline bool byteset_has(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void byteset_add(ByteSet& s, uint8_t b) { s[b >> 6] |= uint64_t{1} << (b & 63); }

struct Automaton {
  std::vector<std::string> rule_names;  // compiled rules (reachable from root), root first
  std::vector<uint32_t> rule_start;     // start position of each rule
  uint32_t num_positions = 0;

  std::vector<uint32_t> pos_rule;
  std::vector<uint8_t> final;  // the rule may end here
  // Byte transitions: byte b in rule r belongs to class byte_class[r * 256 + b]; position p's row of targets is
  // trans[trans_begin[p] .. + num_classes[r]) (-1: no transition).
  std::vector<uint8_t> byte_class;
  std::vector<uint16_t> num_classes;
  std::vector<uint32_t> trans_begin;
  std::vector<int32_t> trans;
  std::vector<uint8_t> has_bytes;
  // Calls out of each position: (rule, return position), CSR.
  std::vector<uint32_t> call_begin;
  std::vector<std::pair<uint32_t, uint32_t>> calls;

  // chains(p): chain_data[chain_begin[p] .. chain_begin[p + 1]) holds chains as [length, positions...].
  std::vector<uint32_t> chain_begin;
  std::vector<uint32_t> chain_data;
  std::vector<uint8_t> pops;
  std::vector<uint8_t> simple;
  std::vector<uint32_t> dist;
  std::vector<ByteSet> follow;  // per rule

  int32_t next(uint32_t p, uint8_t b) const {
    const uint32_t r = pos_rule[p];
    return trans[trans_begin[p] + byte_class[size_t{r} * 256 + b]];
  }
  uint32_t start() const { return rule_start[0]; }
};

Result<Automaton> build_automaton(const Ast& ast, const Limits& limits);

}  // namespace kiln::grammar
