// The vocabulary's byte trie (internal to the grammar layer). Tokens are sorted by their bytes; rank = index in
// that order. Nodes are stored in depth-first order, so a node's subtree is the node range [i, end) and its
// tokens are the rank range [rank_begin, rank_end); the tokens whose bytes end exactly at the node come first,
// [rank_begin, rank_here_end). Node 0 is the root (the empty prefix, which no token has: tokens without bytes are
// left out of the trie and never allowed as text). A node's first child is i + 1 (when i + 1 < end); its next
// sibling is its own end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::grammar {

class TokenTrie {
 public:
  struct Node {
    uint32_t end;
    uint32_t rank_begin, rank_here_end, rank_end;
    uint8_t byte;
  };

  explicit TokenTrie(const std::vector<std::string>& tokens);

  const std::vector<Node>& nodes() const { return nodes_; }
  uint32_t rank_to_id(uint32_t rank) const { return sorted_ids_[rank]; }
  uint32_t num_ranked() const { return static_cast<uint32_t>(sorted_ids_.size()); }
  uint32_t max_token_bytes() const { return max_bytes_; }

 private:
  std::vector<Node> nodes_;
  std::vector<uint32_t> sorted_ids_;  // rank -> token id
  uint32_t max_bytes_ = 0;
};

}  // namespace kiln::grammar
