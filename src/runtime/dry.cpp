#include "runtime/dry.h"

#include <algorithm>
#include <cmath>

namespace kiln {

DryBreakers::DryBreakers(std::vector<std::vector<int32_t>> seqs) {
  for (auto& s : seqs) {
    if (s.empty()) continue;
    entries_.emplace_back(s[0], std::vector<int32_t>(s.begin() + 1, s.end()));
  }
  finish();
}

void DryBreakers::finish() {
  std::sort(entries_.begin(), entries_.end());
  entries_.erase(std::unique(entries_.begin(), entries_.end()), entries_.end());
}

DryBreakers DryBreakers::for_vocabulary(const Tokenizer& tok, const std::vector<std::string>& breakers) {
  std::vector<std::string> bs;
  for (const std::string& b : breakers)
    if (!b.empty()) bs.push_back(b.substr(0, kMaxBytes));
  DryBreakers out;
  if (bs.empty()) return out;
  const int32_t nv = tok.n_vocab();
  for (int32_t id = 0; id < nv; ++id) {
    const std::string piece = tok.token_to_piece(id, true);
    if (piece.empty()) continue;
    for (const std::string& b : bs) {
      if (piece.find(b) != std::string::npos) {
        out.entries_.emplace_back(id, std::vector<int32_t>());
        continue;
      }
      // The piece ends with b's first (piece.size() - pos) bytes: the rest of b follows as the tail.
      for (size_t pos = piece.find(b[0]); pos != std::string::npos; pos = piece.find(b[0], pos + 1)) {
        const size_t have = piece.size() - pos;  // < b.size(): the piece does not contain b
        if (piece.compare(pos, have, b, 0, have) != 0) continue;
        std::vector<int32_t> tail = tok.encode(std::string_view(b).substr(have), false, false);
        if (tail.size() > kMaxTailTokens) tail.resize(kMaxTailTokens);
        out.entries_.emplace_back(id, std::move(tail));
      }
    }
  }
  out.finish();
  return out;
}

std::pair<size_t, size_t> DryBreakers::headed_by(int32_t t) const {
  auto lo = std::lower_bound(entries_.begin(), entries_.end(), t,
                             [](const auto& e, int32_t v) { return e.first < v; });
  auto hi = lo;
  while (hi != entries_.end() && hi->first == t) ++hi;
  return {static_cast<size_t>(lo - entries_.begin()), static_cast<size_t>(hi - entries_.begin())};
}

bool DryBreakers::single(int32_t t) const {
  // Sorted by (head, tail): an empty tail comes first among t's entries.
  auto [b, e] = headed_by(t);
  return b < e && entries_[b].second.empty();
}

namespace {

// rep_limit of the definition: tokens after the end of the latest breaker occurrence in w (|w| when none).
int64_t repetition_limit(std::span<const int32_t> w, const DryBreakers& br) {
  const int64_t n = static_cast<int64_t>(w.size());
  for (int64_t i = 0; i < n; ++i) {  // i: the head's distance from the end
    auto [b, e] = br.headed_by(w[static_cast<size_t>(n - 1 - i)]);
    int64_t longest = -1;
    for (size_t k = b; k < e; ++k) {
      const std::vector<int32_t>& tail = br.entries()[k].second;
      const int64_t len = static_cast<int64_t>(tail.size());
      if (len <= longest || len > i) continue;
      bool match = true;
      for (int64_t j = 0; j < len && match; ++j) match = tail[static_cast<size_t>(j)] == w[static_cast<size_t>(n - i + j)];
      if (match) longest = len;
    }
    if (longest >= 0) return i - longest;
  }
  return n;
}

}  // namespace

void dry_repeat_lengths(std::span<const int32_t> w, const DryBreakers* breakers, int32_t allowed_length,
                        std::vector<int32_t>* z, std::vector<int32_t>* len, std::vector<int32_t>* touched) {
  const int64_t n = static_cast<int64_t>(w.size());
  if (n <= allowed_length) return;
  const int64_t limit = breakers ? repetition_limit(w, *breakers) : n;
  if (limit < allowed_length) return;
  // Z-array of the reversed window r (r[j] = w[n - 1 - j]): z[k] = the longest common prefix of r and r[k..], i.e.
  // the longest common suffix of w and w[0 .. n - 1 - k].
  auto r = [&](int64_t j) { return w[static_cast<size_t>(n - 1 - j)]; };
  z->assign(static_cast<size_t>(n), 0);
  int32_t* Z = z->data();
  Z[0] = static_cast<int32_t>(n);
  int64_t lo = 0, hi = 0;  // the rightmost match box [lo, hi)
  for (int64_t k = 1; k < n; ++k) {
    int64_t m = k < hi ? std::min<int64_t>(hi - k, Z[k - lo]) : 0;
    while (k + m < n && r(m) == r(k + m)) ++m;
    if (k + m > hi) lo = k, hi = k + m;
    Z[k] = static_cast<int32_t>(m);
  }
  const int32_t nv = static_cast<int32_t>(len->size());
  for (int64_t k = 1; k < n; ++k) {
    const int32_t L = static_cast<int32_t>(std::min<int64_t>(Z[k], limit));
    if (L < allowed_length) continue;
    const int32_t t = w[static_cast<size_t>(n - k)];  // follows the repetition that ends k tokens before the end
    if (t < 0 || t >= nv) continue;
    int32_t& cur = (*len)[static_cast<size_t>(t)];
    if (cur == 0) touched->push_back(t);
    cur = std::max(cur, L + 1);
  }
}

float dry_penalty(float multiplier, float base, int32_t allowed_length, int32_t L) {
  int64_t e = static_cast<int64_t>(L) - allowed_length;
  if (base > 1.000001f) {
    const int64_t max_e = static_cast<int64_t>(88.7228391f / std::log(base));  // log(FLT_MAX)
    if (max_e > 0 && e > max_e) e = max_e;
  }
  return multiplier * std::pow(base, static_cast<float>(e));
}

}  // namespace kiln
