// Matcher: the live stacks of one sequence, token masks from the per-position cache plus a stack walk for the
// uncertain tokens, and rollback through a history of states (the stack arena is truncated with it).
#include <algorithm>
#include <cstring>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/stacks.h"
#include "grammar/token_trie.h"

namespace kiln::grammar {

struct Matcher::State {
  std::vector<uint32_t> tops;  // sorted, unique
  bool complete = false;
  bool terminated = false;
  size_t arena_size = 0;  // nodes up to here belong to this state or earlier ones
};

struct Matcher::Impl {
  StackArena arena;
  State cur;
  std::vector<State> history;  // history[i]: the state before the i-th accept call still undoable
  StackSet next;
  // fill_mask's walk over the uncertain tokens: the stacks after each prefix length of the current token.
  struct Level {
    uint32_t begin, end;  // tops in buf
    bool complete;
    size_t arena_mark;
  };
  std::vector<uint32_t> buf;
  std::vector<Level> levels;
  std::vector<uint32_t> uncertain;
};

namespace {

std::string printable(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 40)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      out += strprintf("\\x%02X", c);
    } else {
      out += ch;
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)), impl_(new Impl()) {
  reset();
}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

void Matcher::reset() {
  const Automaton& a = grammar_->grammar().automaton();
  Impl& m = *impl_;
  m.arena.truncate(2);
  m.history.clear();
  m.next.clear();
  settle(a, m.arena, a.start(), kRootNode, &m.next);
  std::sort(m.next.tops.begin(), m.next.tops.end());
  m.next.tops.erase(std::unique(m.next.tops.begin(), m.next.tops.end()), m.next.tops.end());
  m.cur = State{m.next.tops, m.next.complete, false, m.arena.size()};
}

bool Matcher::is_complete() const { return impl_->cur.complete && !impl_->cur.terminated; }
bool Matcher::is_terminated() const { return impl_->cur.terminated; }
int Matcher::history_size() const { return static_cast<int>(impl_->history.size()); }
size_t Matcher::num_stacks() const { return impl_->cur.tops.size(); }

uint32_t Matcher::min_bytes_to_complete() const {
  const Impl& m = *impl_;
  if (m.cur.complete || m.cur.terminated) return 0;
  uint32_t best = UINT32_MAX;
  for (uint32_t t : m.cur.tops) best = std::min(best, m.arena[t].dist);
  return best;
}

Status Matcher::advance(std::string_view bytes, const char* what) {
  const Automaton& a = grammar_->grammar().automaton();
  const uint32_t max_stacks = grammar_->grammar().limits().max_stacks;
  Impl& m = *impl_;
  if (m.cur.terminated)
    return make_error(ErrorCode::kInvalidArgument, "grammar: %s after the end of generation", what);
  const size_t mark = m.arena.size();
  std::vector<uint32_t> tops = m.cur.tops;
  bool complete = m.cur.complete;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!step(a, m.arena, tops.data(), tops.size(), static_cast<uint8_t>(bytes[i]), max_stacks, &m.next)) {
      m.arena.truncate(mark);
      return make_error(ErrorCode::kOutOfRange, "grammar: %s: more than %u parse stacks (the grammar is too ambiguous)",
                        what, max_stacks);
    }
    if (m.next.tops.empty() && !(m.next.complete && i + 1 == bytes.size())) {
      m.arena.truncate(mark);
      return make_error(ErrorCode::kInvalidArgument, "grammar: %s (\"%s\") does not match at byte %zu", what,
                        printable(bytes).c_str(), i);
    }
    tops.swap(m.next.tops);
    complete = m.next.complete;
  }
  m.history.push_back(std::move(m.cur));
  m.cur = State{std::move(tops), complete, false, m.arena.size()};
  return Status::ok();
}

Status Matcher::accept_token(int32_t id) {
  const VocabIndex& v = grammar_->vocab();
  if (id < 0 || id >= v.size())
    return make_error(ErrorCode::kInvalidArgument, "grammar: token id %d is outside the vocabulary (%d tokens)", id,
                      v.size());
  Impl& m = *impl_;
  if (v.is_eog(id)) {
    if (m.cur.terminated)
      return make_error(ErrorCode::kInvalidArgument, "grammar: token %d after the end of generation", id);
    if (!m.cur.complete)
      return make_error(ErrorCode::kInvalidArgument,
                        "grammar: end-of-generation token %d before the grammar is complete", id);
    m.history.push_back(m.cur);
    m.cur.terminated = true;
    return Status::ok();
  }
  if (v.token(id).empty())
    return make_error(ErrorCode::kInvalidArgument, "grammar: token %d has no text (a control token) and is not allowed",
                      id);
  const std::string what = strprintf("token %d", id);
  return advance(v.token(id), what.c_str());
}

Status Matcher::accept_bytes(std::string_view bytes) { return advance(bytes, "forced text"); }

Status Matcher::rollback(int n) {
  Impl& m = *impl_;
  if (n < 0 || static_cast<size_t>(n) > m.history.size())
    return make_error(ErrorCode::kInvalidArgument, "grammar: cannot roll back %d steps (%zu recorded)", n,
                      m.history.size());
  if (n == 0) return Status::ok();
  m.cur = std::move(m.history[m.history.size() - static_cast<size_t>(n)]);
  m.history.resize(m.history.size() - static_cast<size_t>(n));
  m.arena.truncate(m.cur.arena_size);
  return Status::ok();
}

bool Matcher::can_accept(int32_t id) {
  const VocabIndex& v = grammar_->vocab();
  if (id < 0 || id >= v.size() || impl_->cur.terminated) return false;
  if (v.is_eog(id)) return impl_->cur.complete;
  const std::string& bytes = v.token(id);
  if (bytes.empty()) return false;
  const Automaton& a = grammar_->grammar().automaton();
  Impl& m = *impl_;
  const size_t mark = m.arena.size();
  std::vector<uint32_t> tops = m.cur.tops;
  bool ok = true;
  for (size_t i = 0; i < bytes.size() && ok; ++i) {
    ok = step(a, m.arena, tops.data(), tops.size(), static_cast<uint8_t>(bytes[i]),
              grammar_->grammar().limits().max_stacks, &m.next) &&
         (!m.next.tops.empty() || (m.next.complete && i + 1 == bytes.size()));
    tops.swap(m.next.tops);
  }
  m.arena.truncate(mark);
  return ok;
}

void Matcher::fill_mask(std::span<uint32_t> words) {
  std::fill(words.begin(), words.end(), 0u);
  Impl& m = *impl_;
  const CompiledGrammar& cg = *grammar_;
  const VocabIndex& v = cg.vocab();
  const size_t nw = std::min(words.size(), v.mask_words());
  if (m.cur.terminated) return;
  const auto set_bit = [&](uint32_t id) {
    if ((id >> 5) < nw) words[id >> 5] |= 1u << (id & 31);
  };
  if (m.cur.complete)
    for (int32_t id : v.eog_ids()) set_bit(static_cast<uint32_t>(id));

  m.uncertain.clear();
  for (uint32_t t : m.cur.tops) {
    const auto& pm = cg.position_mask(m.arena[t].pos);
    if (pm.bitset) {
      const uint32_t* bits = cg.accepted_bits(pm);
      for (size_t w = 0; w < nw; ++w) words[w] |= bits[w];
    } else {
      const uint32_t* ids = cg.accepted_ids(pm);
      for (uint32_t i = 0; i < pm.accepted_count; ++i) set_bit(ids[i]);
    }
    const uint32_t* ranks = cg.uncertain_ranks(pm);
    m.uncertain.insert(m.uncertain.end(), ranks, ranks + pm.uncertain_count);
  }
  if (m.uncertain.empty()) return;
  if (m.cur.tops.size() > 1) {
    std::sort(m.uncertain.begin(), m.uncertain.end());
    m.uncertain.erase(std::unique(m.uncertain.begin(), m.uncertain.end()), m.uncertain.end());
  }

  // Uncertain tokens in byte order: each one reuses the stacks of the prefix it shares with the one before, and
  // a prefix that died rejects every later token sharing it without stepping.
  const Automaton& a = cg.grammar().automaton();
  const TokenTrie& trie = v.trie();
  const uint32_t max_stacks = cg.grammar().limits().max_stacks;
  const size_t base_mark = m.arena.size();
  m.buf.assign(m.cur.tops.begin(), m.cur.tops.end());
  m.levels.clear();
  m.levels.push_back({0, static_cast<uint32_t>(m.buf.size()), m.cur.complete, base_mark});
  std::string_view prev;
  for (uint32_t rank : m.uncertain) {
    const uint32_t id = trie.rank_to_id(rank);
    if ((words[id >> 5] >> (id & 31)) & 1) continue;
    const std::string_view s = v.token(static_cast<int32_t>(id));
    size_t lcp = 0;
    const size_t lim = std::min(prev.size(), s.size());
    while (lcp < lim && prev[lcp] == s[lcp]) ++lcp;
    prev = s;
    const size_t keep = std::min(lcp, m.levels.size() - 1);
    while (m.levels.size() > keep + 1) {
      m.arena.truncate(m.levels.back().arena_mark);
      m.buf.resize(m.levels.back().begin);
      m.levels.pop_back();
    }
    bool dead = m.levels.back().begin == m.levels.back().end;
    for (size_t d = keep; d < s.size() && !dead; ++d) {
      const Impl::Level lv = m.levels.back();
      const size_t mark = m.arena.size();
      const bool ok = step(a, m.arena, m.buf.data() + lv.begin, lv.end - lv.begin, static_cast<uint8_t>(s[d]),
                           max_stacks, &m.next);
      const uint32_t b = static_cast<uint32_t>(m.buf.size());
      if (ok) m.buf.insert(m.buf.end(), m.next.tops.begin(), m.next.tops.end());
      m.levels.push_back({b, static_cast<uint32_t>(m.buf.size()), ok && m.next.complete, mark});
      dead = m.next.tops.empty() || !ok;
    }
    const Impl::Level& last = m.levels.back();
    if (m.levels.size() == s.size() + 1 && (last.end > last.begin || last.complete)) set_bit(id);
  }
  m.arena.truncate(base_mark);
}

}  // namespace kiln::grammar
