#include "runtime/ngram_draft.h"

#include <algorithm>

namespace kiln {

uint64_t NgramDraft::hash_at(std::span<const int32_t> tokens, size_t end) const {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the ids' 32-bit values
  for (size_t i = end - static_cast<size_t>(p_.size_n); i < end; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

int32_t NgramDraft::propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) {
  const size_t n = static_cast<size_t>(std::max(p_.size_n, 1)), len = tokens.size();
  if (len < indexed_) indexed_ = 0, last_end_.clear();  // another sequence (never in the engine loop): start over
  const int32_t k = std::min({max_k, p_.size_m, static_cast<int32_t>(out.size())});
  if (len <= n || k <= 0) return 0;
  // The n-grams ending before the last one (whose continuation is known) join the index first.
  for (size_t end = std::max(indexed_, n); end < len; ++end) last_end_[hash_at(tokens, end)] = end;
  indexed_ = len;
  const auto it = last_end_.find(hash_at(tokens, len));
  int32_t got = 0;
  if (it != last_end_.end() && std::equal(tokens.begin() + static_cast<std::ptrdiff_t>(it->second - n),
                                          tokens.begin() + static_cast<std::ptrdiff_t>(it->second),
                                          tokens.end() - static_cast<std::ptrdiff_t>(n))) {
    for (size_t i = it->second; i < len && got < k; ++i) out[static_cast<size_t>(got++)] = tokens[i];
  }
  last_end_[hash_at(tokens, len)] = len;  // the current n-gram: a later step may continue from here
  return got;
}

}  // namespace kiln
