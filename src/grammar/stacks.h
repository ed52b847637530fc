// Parse stacks of the pushdown automaton (internal to the grammar layer).
//
// A stack is a linked list of nodes (position, parent): the top node's position is where the next byte is
// matched, every node below holds a return position. Nodes are hash-consed -- one id per (position, parent) --
// so equal stacks have equal ids and a set of stacks is a sorted vector of top ids. The arena only grows and is
// undone in LIFO order (truncate), which restores the hash table exactly: the matcher truncates on rollback, the
// mask computation after its trial walks.
//
// Two sentinels sit below every stack: kRootNode (popping to it completes the grammar) and kEscapeNode (used
// when a position is examined alone for the mask cache: popping to it leaves that position's rule).
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/automaton.h"

namespace kiln::grammar {

inline constexpr uint32_t kRootNode = 0;
inline constexpr uint32_t kEscapeNode = 1;

struct StackNode {
  uint32_t pos;
  uint32_t parent;
  uint32_t dist;  // the fewest bytes that empty this stack: dist(pos) + the parent's
};

class StackArena {
 public:
  StackArena();
  uint32_t get(const Automaton& a, uint32_t pos, uint32_t parent);
  const StackNode& operator[](uint32_t id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }
  void truncate(size_t n);

 private:
  void rehash(size_t capacity);
  std::vector<StackNode> nodes_;
  std::vector<uint32_t> slot_of_;  // the table slot of each node
  std::vector<uint32_t> table_;    // node id + 1; 0 = empty (linear probing)
};

// The stacks reached after one byte (or the start): tops sorted and unique, plus whether a stack emptied down to
// kRootNode (complete) or kEscapeNode (escaped).
struct StackSet {
  std::vector<uint32_t> tops;
  bool complete = false;
  bool escaped = false;
  void clear() {
    tops.clear();
    complete = escaped = false;
  }
};

// Position q was just reached with `parent` below it: push q's chains; if q's rule can end, pop and continue at
// the parent's return position. Appends tops (unsorted) to out->tops.
void settle(const Automaton& a, StackArena& arena, uint32_t q, uint32_t parent, StackSet* out);

// Moves the stacks tops[0..n) over byte b into *out (cleared first; tops sorted and unique). Returns false when
// more than max_stacks stacks would be alive.
bool step(const Automaton& a, StackArena& arena, const uint32_t* tops, size_t n, uint8_t b, uint32_t max_stacks,
          StackSet* out);

}  // namespace kiln::grammar
