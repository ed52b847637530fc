#include "tokenizer/spm.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln::tok {

namespace {

struct Sym {
  uint32_t start, len;  // len 0: merged into its left neighbour
  int32_t prev, next;
};

struct Cand {
  float score;
  int32_t left, right;
  uint32_t size;  // bytes of the pair when queued; a different sum when popped means it is stale
};

// Max-heap order: higher score first, then smaller left index.
struct CandBefore {
  bool operator()(const Cand& a, const Cand& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  syms.clear();
  heap.clear();
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::min(text.size() - i, utf8_len(static_cast<uint8_t>(text[i])));
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
    i += len;
  }
  const auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::string_view pair = text.substr(syms[l].start, syms[l].len + syms[r].len);
    const int32_t id = vocab.find(pair);
    if (id < 0) return;
    heap.push_back({vocab.score[id], l, r, static_cast<uint32_t>(pair.size())});
    std::push_heap(heap.begin(), heap.end(), CandBefore());
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_pair(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandBefore());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& L = syms[c.left];
    Sym& R = syms[c.right];
    if (L.len == 0 || R.len == 0 || L.len + R.len != c.size) continue;
    L.len += R.len;
    R.len = 0;
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = c.left;
    try_pair(L.prev, c.left);
    try_pair(c.left, L.next);
  }

  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].start, syms[i].len);
    const int32_t id = vocab.find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Only unmerged single characters get here (merges only ever form tokens): write them as bytes.
    for (char c : piece) {
      const int32_t b = vocab.byte_token(static_cast<uint8_t>(c));
      if (b >= 0) out->push_back(b);
      else if (vocab.unk >= 0) out->push_back(vocab.unk);  // llama.cpp would abort here (no byte token)
    }
  }
}

}  // namespace kiln::tok
