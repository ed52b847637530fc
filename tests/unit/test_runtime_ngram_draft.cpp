// NgramDraft (runtime/ngram_draft.h): prompt-lookup drafts against a brute-force search, incremental use as the
// engine loop calls it (a growing sequence), and the caps (max_k, size_m, the output span).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/ngram_draft.h"

namespace kiln {
namespace {

// The continuation of the latest earlier occurrence of the last n tokens, at most k tokens.
std::vector<int32_t> brute(const std::vector<int32_t>& t, size_t n, size_t k) {
  const size_t len = t.size();
  if (len <= n) return {};
  for (size_t e = len - 1; e >= n; --e) {
    if (std::equal(t.begin() + static_cast<long>(e - n), t.begin() + static_cast<long>(e), t.end() - static_cast<long>(n)))
      return std::vector<int32_t>(t.begin() + static_cast<long>(e), t.begin() + static_cast<long>(std::min(len, e + k)));
  }
  return {};
}

std::vector<int32_t> propose(NgramDraft& d, const std::vector<int32_t>& t, int32_t max_k, size_t out_size = 64) {
  std::vector<int32_t> out(out_size, -1);
  const int32_t got = d.propose(t, max_k, out);
  out.resize(static_cast<size_t>(got));
  return out;
}

TEST(NgramDraft, ContinuesTheLatestEarlierOccurrence) {
  NgramDraft d({3, 48});
  std::vector<int32_t> t = {9, 1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3};
  // 1 2 3 last occurs ending at index 10 (followed by 7 8 1 2 3), the earlier one by 4 5 9 ...
  EXPECT_EQ(propose(d, t, 4), (std::vector<int32_t>{7, 8, 1, 2}));
  EXPECT_EQ(propose(d, {5, 6, 7, 8}, 4), std::vector<int32_t>{}) << "a shorter sequence starts over: no match";
}

TEST(NgramDraft, NothingWithoutAMatchOrRoom) {
  NgramDraft d({2, 48});
  EXPECT_TRUE(propose(d, {1, 2, 3, 4, 5}, 8).empty());
  NgramDraft e({2, 48});
  EXPECT_TRUE(propose(e, {1, 2, 1, 2}, 0).empty()) << "max_k 0";
  NgramDraft f({4, 48});
  EXPECT_TRUE(propose(f, {1, 2, 3, 4}, 8).empty()) << "no earlier n-gram in a sequence of n tokens";
}

TEST(NgramDraft, CapsAtMaxKSizeMAndTheOutputSpan) {
  std::vector<int32_t> t;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 20; ++i) t.push_back(i);
  t.push_back(0), t.push_back(1);  // matches the start of each period: 18 tokens follow in the file
  NgramDraft a({2, 48});
  EXPECT_EQ(propose(a, t, 5).size(), 5u);
  NgramDraft b({2, 3});
  EXPECT_EQ(propose(b, t, 5).size(), 3u);
  NgramDraft c({2, 48});
  EXPECT_EQ(propose(c, t, 16, 2).size(), 2u);
  NgramDraft e({2, 48});
  EXPECT_EQ(propose(e, t, 40), brute(t, 2, 40));
}

// The engine loop's use: one proposer per sequence, asked at every step as the sequence grows by the accepted
// drafts and one sampled token. Every answer equals a fresh brute-force search.
TEST(NgramDraft, IncrementalUseMatchesBruteForce) {
  std::mt19937 rng(3);
  for (int n : {1, 2, 3, 5}) {
    NgramDraft d({n, 6});
    std::vector<int32_t> t;
    std::uniform_int_distribution<int> tok(0, 5), step(1, 4);
    while (t.size() < 400) {
      const int s = step(rng);
      for (int i = 0; i < s; ++i) t.push_back(tok(rng));
      ASSERT_EQ(propose(d, t, 8), brute(t, static_cast<size_t>(n), 6)) << "n " << n << " len " << t.size();
    }
  }
}

}  // namespace
}  // namespace kiln
