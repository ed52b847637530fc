#include "tokenizer/bpe.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln::tok {

namespace {

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Sym {
  int32_t id;      // symbol id (token id when < n_vocab), -1: a character that is in no merge and no token
  uint32_t start;  // byte range in the word
  uint32_t len;    // 0: merged into its left neighbour
  int32_t prev, next;
};

struct Cand {
  int32_t rank, left, right;
  int32_t left_id, right_id;
};

// std heap functions build a max-heap: "greater" puts the lowest (rank, left) on top.
struct CandAfter {
  bool operator()(const Cand& a, const Cand& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

struct Scratch {
  std::vector<Sym> syms;
  std::vector<Cand> heap;
  std::vector<Span> words;
  std::string reencoded, regex_safe, escaped, encoded_word;
};

}  // namespace

int32_t BpeModel::lookup(std::string_view s) const {
  const int32_t id = vocab_.find(s);
  if (id >= 0) return id;
  auto it = extra_.find(std::string(s));
  return it == extra_.end() ? -1 : it->second;
}

int32_t BpeModel::intern(std::string_view s) {
  const int32_t id = lookup(s);
  if (id >= 0) return id;
  const int32_t nid = static_cast<int32_t>(vocab_.text.size() + extra_.size());
  extra_.emplace(std::string(s), nid);
  return nid;
}

Result<std::unique_ptr<BpeModel>> BpeModel::create(const gguf::File& file, const Vocab& vocab) {
  std::unique_ptr<BpeModel> m(new BpeModel(vocab));
  KILN_ASSIGN_OR_RETURN(m->spec_, pretokenizer_spec(vocab.pre.empty() ? "default" : vocab.pre));
  KILN_ASSIGN_OR_RETURN(m->pre_, PreTokenizer::get(m->spec_));

  const gguf::Value* mv = file.find("tokenizer.ggml.merges");
  if (!mv) return make_error(ErrorCode::kNotFound, "metadata key 'tokenizer.ggml.merges' is missing (needed by BPE)");
  if (!mv->is_array() || mv->arr().type != gguf::ValueType::STRING)
    return make_error(ErrorCode::kInvalidFile, "metadata key 'tokenizer.ggml.merges' is %s, expected an array of strings",
                      mv->is_array() ? "an array of another type" : gguf::value_type_name(mv->type()));
  const auto& items = mv->arr().items;
  m->merges_.reserve(items.size() * 2);
  std::string joined;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& s = items[i].str();
    const size_t sp = s.find(' ', 1);
    if (sp == std::string::npos) continue;  // "a" alone names no pair: it can never apply
    const std::string_view left(s.data(), sp), right(s.data() + sp + 1, s.size() - sp - 1);
    if (right.empty()) continue;
    const int32_t l = m->intern(left), r = m->intern(right);
    joined.assign(left);
    joined.append(right);
    const int32_t res = m->intern(joined);
    m->merges_.emplace(pair_key(l, r), Merge{static_cast<int32_t>(i), res});  // emplace: the first rank stays
  }
  for (int b = 0; b < 256; ++b) m->byte_symbol_[b] = m->lookup(byte_to_unicode(static_cast<uint8_t>(b)));
  return m;
}

void BpeModel::emit_symbol(std::string_view text, int32_t sym, std::vector<int32_t>* out) const {
  const int32_t n_vocab = static_cast<int32_t>(vocab_.text.size());
  if (sym >= 0 && sym < n_vocab) {
    out->push_back(sym);
    return;
  }
  // Not a token: fall back to one token per byte where the vocabulary has one (llama.cpp drops the others).
  if (spec_.byte_encode) {
    std::string enc;
    for (char c : text) enc += byte_to_unicode(static_cast<uint8_t>(c));
    for (char c : enc) {
      const int32_t id = vocab_.find(std::string_view(&c, 1));
      if (id >= 0) out->push_back(id);
    }
  } else {
    for (char c : text) {
      static const char* hex = "0123456789ABCDEF";
      const uint8_t b = static_cast<uint8_t>(c);
      const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      const int32_t id = vocab_.find(std::string_view(buf, 6));
      if (id >= 0) out->push_back(id);
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  thread_local Scratch s;
  if (spec_.ignore_merges) {
    s.encoded_word.clear();
    for (char c : word) s.encoded_word += byte_to_unicode(static_cast<uint8_t>(c));
    const int32_t id = vocab_.find(s.encoded_word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  if (!spec_.byte_encode && word.find_first_not_of('\n') == std::string_view::npos) {
    const int32_t id = vocab_.find(word);  // gemma4: a run of newlines that is a token is kept whole
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }

  auto& syms = s.syms;
  syms.clear();
  if (spec_.byte_encode) {
    for (size_t i = 0; i < word.size(); ++i)
      syms.push_back({byte_symbol_[static_cast<uint8_t>(word[i])], static_cast<uint32_t>(i), 1, 0, 0});
  } else {
    for (size_t i = 0; i < word.size();) {
      const size_t len = std::min(word.size() - i, utf8_len(static_cast<uint8_t>(word[i])));
      syms.push_back({lookup(word.substr(i, len)), static_cast<uint32_t>(i), static_cast<uint32_t>(len), 0, 0});
      i += len;
    }
  }
  const int32_t n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }

  auto& heap = s.heap;
  heap.clear();
  const auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t a = syms[l].id, b = syms[r].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, l, r, a, b});
    std::push_heap(heap.begin(), heap.end(), CandAfter());
  };
  for (int32_t i = 1; i < n; ++i) try_pair(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandAfter());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& L = syms[c.left];
    Sym& R = syms[c.right];
    if (L.len == 0 || R.len == 0 || L.id != c.left_id || R.id != c.right_id || L.next != c.right) continue;
    L.id = merges_.find(pair_key(c.left_id, c.right_id))->second.result;
    L.len += R.len;
    R.len = 0;
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = c.left;
    try_pair(L.prev, c.left);
    try_pair(c.left, L.next);
  }

  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next)
    emit_symbol(word.substr(syms[i].start, syms[i].len), syms[i].id, out);
}

void BpeModel::encode(std::string_view text, std::vector<int32_t>* out) const {
  thread_local Scratch s;
  if (spec_.escape_whitespace && text.find(' ') != std::string_view::npos) {
    s.escaped.clear();
    for (char c : text) {
      if (c == ' ') s.escaped += kSpaceEscape;
      else s.escaped += c;
    }
    text = s.escaped;
  }
  std::string_view work = text, match = text;
  if (normalize_utf8(text, &s.reencoded, &s.regex_safe)) {
    work = s.reencoded;
    match = s.regex_safe;
  }
  std::vector<Span> words;
  pre_->split(match, &words);
  for (const Span& w : words) encode_word(work.substr(w.begin, w.end - w.begin), out);
}

}  // namespace kiln::tok
