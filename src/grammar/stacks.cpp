#include "grammar/stacks.h"

#include <algorithm>
#include <limits>

namespace kiln::grammar {

namespace {

inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

inline uint64_t key(uint32_t pos, uint32_t parent) { return (uint64_t{pos} << 32) | parent; }

}  // namespace

StackArena::StackArena() {
  // The sentinels are never looked up by key, so they are not in the table.
  nodes_.push_back({UINT32_MAX, UINT32_MAX, 0});
  nodes_.push_back({UINT32_MAX, UINT32_MAX, 0});
  slot_of_.assign(2, UINT32_MAX);
  table_.assign(1024, 0);
}

void StackArena::rehash(size_t capacity) {
  table_.assign(capacity, 0);
  const size_t m = capacity - 1;
  for (uint32_t id = 2; id < nodes_.size(); ++id) {
    size_t s = mix(key(nodes_[id].pos, nodes_[id].parent)) & m;
    while (table_[s] != 0) s = (s + 1) & m;
    table_[s] = id + 1;
    slot_of_[id] = static_cast<uint32_t>(s);
  }
}

uint32_t StackArena::get(const Automaton& a, uint32_t pos, uint32_t parent) {
  const uint64_t k = key(pos, parent);
  size_t m = table_.size() - 1;
  size_t s = mix(k) & m;
  while (uint32_t e = table_[s]) {
    const StackNode& n = nodes_[e - 1];
    if (n.pos == pos && n.parent == parent) return e - 1;
    s = (s + 1) & m;
  }
  if ((nodes_.size() + 1) * 2 > table_.size()) {
    rehash(table_.size() * 2);
    m = table_.size() - 1;
    s = mix(k) & m;
    while (table_[s] != 0) s = (s + 1) & m;
  }
  const uint32_t id = static_cast<uint32_t>(nodes_.size());
  const uint64_t d = uint64_t{a.dist[pos]} + nodes_[parent].dist;
  nodes_.push_back({pos, parent, static_cast<uint32_t>(std::min<uint64_t>(d, UINT32_MAX))});
  slot_of_.push_back(static_cast<uint32_t>(s));
  table_[s] = id + 1;
  return id;
}

void StackArena::truncate(size_t n) {
  n = std::max<size_t>(n, 2);
  // Undoing insertions newest first leaves the linear-probing table exactly as it was before them.
  for (size_t id = nodes_.size(); id > n; --id) table_[slot_of_[id - 1]] = 0;
  if (nodes_.size() > n) {
    nodes_.resize(n);
    slot_of_.resize(n);
  }
}

void settle(const Automaton& a, StackArena& arena, uint32_t q, uint32_t parent, StackSet* out) {
  for (;;) {
    const uint32_t* c = a.chain_data.data() + a.chain_begin[q];
    const uint32_t* end = a.chain_data.data() + a.chain_begin[q + 1];
    while (c < end) {
      const uint32_t len = *c++;
      uint32_t n = parent;
      for (uint32_t i = 0; i < len; ++i) n = arena.get(a, c[i], n);
      out->tops.push_back(n);
      c += len;
    }
    if (!a.pops[q]) return;
    if (parent == kRootNode) {
      out->complete = true;
      return;
    }
    if (parent == kEscapeNode) {
      out->escaped = true;
      return;
    }
    q = arena[parent].pos;
    parent = arena[parent].parent;
  }
}

bool step(const Automaton& a, StackArena& arena, const uint32_t* tops, size_t n, uint8_t b, uint32_t max_stacks,
          StackSet* out) {
  out->clear();
  for (size_t i = 0; i < n; ++i) {
    const StackNode node = arena[tops[i]];
    const int32_t q = a.next(node.pos, b);
    if (q >= 0) settle(a, arena, static_cast<uint32_t>(q), node.parent, out);
  }
  if (out->tops.size() > 1) {
    std::sort(out->tops.begin(), out->tops.end());
    out->tops.erase(std::unique(out->tops.begin(), out->tops.end()), out->tops.end());
  }
  return out->tops.size() <= max_stacks;
}

}  // namespace kiln::grammar
