#include "grammar/token_trie.h"

#include <algorithm>

#include "grammar/grammar.h"

namespace kiln::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& tokens) {
  for (uint32_t id = 0; id < tokens.size(); ++id)
    if (!tokens[id].empty()) sorted_ids_.push_back(id);
  std::sort(sorted_ids_.begin(), sorted_ids_.end(), [&](uint32_t a, uint32_t b) {
    const int c = tokens[a].compare(tokens[b]);
    return c != 0 ? c < 0 : a < b;
  });
  nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the current token
  const std::string* prev = nullptr;
  const auto close_to = [&](size_t depth, uint32_t rank) {
    while (path.size() > depth + 1) {
      Node& n = nodes_[path.back()];
      n.end = static_cast<uint32_t>(nodes_.size());
      n.rank_end = rank;
      path.pop_back();
    }
  };
  for (uint32_t rank = 0; rank < sorted_ids_.size(); ++rank) {
    const std::string& s = tokens[sorted_ids_[rank]];
    max_bytes_ = std::max(max_bytes_, static_cast<uint32_t>(s.size()));
    size_t lcp = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), s.size());
      while (lcp < m && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    close_to(lcp, rank);
    for (size_t d = lcp; d < s.size(); ++d) {
      nodes_.push_back({0, rank, rank, 0, static_cast<uint8_t>(s[d])});
      path.push_back(static_cast<uint32_t>(nodes_.size() - 1));
    }
    nodes_[path.back()].rank_here_end = rank + 1;  // duplicates of one string are adjacent ranks
    prev = &s;
  }
  close_to(0, num_ranked());
  nodes_[0].end = static_cast<uint32_t>(nodes_.size());
  nodes_[0].rank_end = num_ranked();
}

std::shared_ptr<const VocabIndex> VocabIndex::build(Vocabulary vocab) {
  std::shared_ptr<VocabIndex> v(new VocabIndex());
  v->vocab_ = std::move(vocab);
  v->is_eog_.assign(v->vocab_.tokens.size(), 0);
  std::vector<int32_t> eog;
  for (int32_t id : v->vocab_.eog_ids) {
    if (id >= 0 && static_cast<size_t>(id) < v->vocab_.tokens.size() && !v->is_eog_[id]) {
      v->is_eog_[id] = 1;
      eog.push_back(id);
    }
  }
  v->vocab_.eog_ids = std::move(eog);
  // An end-of-generation token is never text, whatever bytes its piece has.
  std::vector<std::string> text = v->vocab_.tokens;
  for (int32_t id : v->vocab_.eog_ids) text[id].clear();
  v->trie_ = std::make_unique<TokenTrie>(text);
  return v;
}

VocabIndex::~VocabIndex() = default;

size_t VocabIndex::trie_nodes() const { return trie_->nodes().size(); }

bool VocabIndex::is_eog(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < is_eog_.size() && is_eog_[id];
}

}  // namespace kiln::grammar
