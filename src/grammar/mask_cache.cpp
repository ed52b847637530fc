// The adaptive token-mask cache (after XGrammar): for each byte-consuming position p, every token is classified by
// running its bytes from the stack [p] alone, with kEscapeNode below p:
//  - accepted: some run consumes all its bytes without popping below p, or pops out of p's rule exactly at the
//    last byte (the rule ends there; whatever the caller is, the stack stays alive: every rule can finish);
//  - uncertain: no run accepts it, but some run pops out of p's rule with bytes left whose first byte may follow
//    the rule (Automaton::follow) -- only the real stack below can decide;
//  - rejected: everything else.
// The walk goes over the vocabulary trie depth-first, so a shared prefix is matched once and a dead prefix prunes
// its subtree. While the run is a single stack [q] over the escape node and q is `simple` (nothing to push, cannot
// pop), a byte costs one table lookup and no stack node: that is the path string contents and numbers take.
#include <algorithm>
#include <atomic>
#include <thread>
#include <unordered_map>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/stacks.h"
#include "grammar/token_trie.h"
#include "util/timer.h"

namespace kiln::grammar {

namespace {

constexpr uint32_t kNone = UINT32_MAX;

struct VecHash {
  size_t operator()(const std::vector<uint32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

struct Classified {
  std::vector<uint32_t> accepted;   // ranks, ascending
  std::vector<uint32_t> uncertain;  // ranks, ascending
  bool overflow = false;            // more stacks than Limits::max_stacks: the entry is conservative
};

class PositionWalker {
 public:
  PositionWalker(const Automaton& a, const TokenTrie& trie, uint32_t max_stacks, std::atomic<int64_t>* budget)
      : a_(a), trie_(trie), max_stacks_(max_stacks), budget_(budget) {}

  // Returns false when the shared budget of trie nodes ran out (the whole compile fails then).
  bool run(uint32_t p, Classified* out) {
    out->accepted.clear();
    out->uncertain.clear();
    out->overflow = false;
    const ByteSet& follow = a_.follow[a_.pos_rule[p]];
    const auto& nodes = trie_.nodes();
    arena_.truncate(2);
    buf_.clear();
    frames_.clear();
    frames_.push_back({0, 1, 0, 0, p, false, false, arena_.size()});
    StackSet next;
    int64_t visited = 0;
    while (!frames_.empty()) {
      if (++visited == 65536) {
        if (budget_->fetch_sub(visited) < visited) return false;
        visited = 0;
      }
      Frame& f = frames_.back();
      if (f.next_child >= nodes[f.node].end) {
        arena_.truncate(f.arena_mark);
        buf_.resize(f.tops_begin);
        frames_.pop_back();
        continue;
      }
      const uint32_t c = f.next_child;
      f.next_child = nodes[c].end;
      const Frame parent = f;  // frames_ may reallocate below
      const uint8_t byte = nodes[c].byte;
      const bool pending = parent.pending || (parent.escaped && byteset_has(follow, byte));
      const size_t mark = arena_.size();
      const uint32_t tb = static_cast<uint32_t>(buf_.size());
      uint32_t fast = kNone;
      bool escaped = false;
      if (parent.fast != kNone) {
        const int32_t q = a_.next(parent.fast, byte);
        if (q >= 0) {
          if (a_.simple[q]) {
            fast = static_cast<uint32_t>(q);
          } else {
            next.clear();
            settle(a_, arena_, static_cast<uint32_t>(q), kEscapeNode, &next);
            escaped = next.escaped;
            add_tops(next);
          }
        }
      } else {
        if (!step(a_, arena_, buf_.data() + parent.tops_begin, parent.tops_end - parent.tops_begin, byte,
                  max_stacks_, &next)) {
          // Too ambiguous to follow: the subtree's tokens go to the uncertain list, where the matcher decides
          // them on the real stack (bounded the same way).
          out->overflow = true;
          push_range(&out->uncertain, nodes[c].rank_begin, nodes[c].rank_end);
          arena_.truncate(mark);
          continue;
        }
        escaped = next.escaped;
        add_tops(next);
      }
      const bool alive = fast != kNone || buf_.size() > tb;
      const TokenTrie::Node& n = nodes[c];
      if (alive || escaped) {
        push_range(&out->accepted, n.rank_begin, n.rank_here_end);
      } else if (pending) {
        push_range(&out->uncertain, n.rank_begin, n.rank_here_end);
      }
      if (alive) {
        frames_.push_back({c, c + 1, tb, static_cast<uint32_t>(buf_.size()), fast, escaped, pending, mark});
        continue;
      }
      if (pending) {
        push_range(&out->uncertain, n.rank_here_end, n.rank_end);
      } else if (escaped) {
        for (uint32_t k = c + 1; k < n.end; k = nodes[k].end)
          if (byteset_has(follow, nodes[k].byte)) push_range(&out->uncertain, nodes[k].rank_begin, nodes[k].rank_end);
      }
      arena_.truncate(mark);
      buf_.resize(tb);
    }
    // Ranks were appended in trie order except for whole-subtree ranges, which are in order too: a subtree is
    // appended when its root is visited, before any later sibling. Sorting is a cheap guarantee all the same.
    std::sort(out->uncertain.begin(), out->uncertain.end());
    return budget_->fetch_sub(visited) >= visited;
  }

 private:
  struct Frame {
    uint32_t node, next_child;
    uint32_t tops_begin, tops_end;  // general mode: the stacks after this node's bytes, in buf_
    uint32_t fast;                  // fast mode: the single stack [fast] over kEscapeNode; kNone otherwise
    bool escaped;                   // some run popped out of p's rule exactly at this node
    bool pending;                   // some run popped out earlier and may continue in the caller
    size_t arena_mark;
  };

  void add_tops(StackSet& s) {
    if (s.tops.size() > 1) {
      std::sort(s.tops.begin(), s.tops.end());
      s.tops.erase(std::unique(s.tops.begin(), s.tops.end()), s.tops.end());
    }
    buf_.insert(buf_.end(), s.tops.begin(), s.tops.end());
  }

  static void push_range(std::vector<uint32_t>* v, uint32_t b, uint32_t e) {
    for (uint32_t r = b; r < e; ++r) v->push_back(r);
  }

  const Automaton& a_;
  const TokenTrie& trie_;
  uint32_t max_stacks_;
  std::atomic<int64_t>* budget_;
  StackArena arena_;
  std::vector<uint32_t> buf_;
  std::vector<Frame> frames_;
};

// Positions whose cache entries are equal, so that one walk serves them all (a string of up to 1,000 characters
// is a chain of thousands of positions, nearly all alike to any token). A token has at most `depth` bytes, so two
// positions classify every token alike when they behave alike for `depth` bytes: Moore's refinement run for
// `depth` rounds over byte transitions. It only merges positions whose walk is a plain table walk -- `simple`
// ones (nothing pushed or popped) and ones that only leave their rule (final, nothing to match) -- of the same rule
// (the follow set is the rule's); every other position is a class of its own and is compared by identity.
// Returns rep[p]: the position whose entry p uses.
std::vector<uint32_t> shared_entries(const Automaton& a, uint32_t depth) {
  const uint32_t n = a.num_positions;
  std::vector<uint32_t> block(n);
  {
    std::unordered_map<uint64_t, uint32_t> ids;
    for (uint32_t p = 0; p < n; ++p) {
      const bool leave_only = a.pops[p] && a.chain_begin[p] == a.chain_begin[p + 1];
      uint64_t key;
      if (a.simple[p]) key = (uint64_t{a.pos_rule[p]} << 2) | 1;
      else if (leave_only) key = (uint64_t{a.pos_rule[p]} << 2) | 2;
      else key = (uint64_t{p} << 2) | 3;
      block[p] = ids.emplace(key, static_cast<uint32_t>(ids.size())).first->second;
    }
  }
  std::vector<uint32_t> sig, next(n);
  size_t count = 0;
  for (uint32_t round = 0; round < depth; ++round) {
    std::unordered_map<std::vector<uint32_t>, uint32_t, VecHash> ids;
    for (uint32_t p = 0; p < n; ++p) {
      const uint32_t r = a.pos_rule[p];
      sig.assign(1, block[p]);
      for (uint32_t c = 0; c < a.num_classes[r]; ++c) {
        const int32_t t = a.trans[a.trans_begin[p] + c];
        sig.push_back(t < 0 ? UINT32_MAX : block[static_cast<uint32_t>(t)]);
      }
      next[p] = ids.emplace(sig, static_cast<uint32_t>(ids.size())).first->second;
    }
    block.swap(next);
    if (ids.size() == count) break;
    count = ids.size();
  }
  std::vector<uint32_t> rep(n), first(n, UINT32_MAX);
  for (uint32_t p = 0; p < n; ++p) {
    if (first[block[p]] == UINT32_MAX) first[block[p]] = p;
    rep[p] = first[block[p]];
  }
  return rep;
}

}  // namespace

class MaskCacheBuilder {
 public:
  static Result<std::shared_ptr<const CompiledGrammar>> build(std::shared_ptr<const Grammar> grammar,
                                                              std::shared_ptr<const VocabIndex> vocab, int threads) {
    Timer timer;
    std::shared_ptr<CompiledGrammar> cg(new CompiledGrammar());
    cg->grammar_ = std::move(grammar);
    cg->vocab_ = std::move(vocab);
    const Automaton& a = cg->grammar_->automaton();
    const TokenTrie& trie = cg->vocab_->trie();
    const size_t words = cg->vocab_->mask_words();
    const uint32_t n = a.num_positions;
    cg->masks_.assign(n, {});

    const std::vector<uint32_t> rep = shared_entries(a, trie.max_token_bytes());
    cg->stats_.share_ms = timer.ms();
    std::vector<uint32_t> todo;
    for (uint32_t p = 0; p < n; ++p)
      if (a.has_bytes[p] && rep[p] == p) todo.push_back(p);
    // Each thread classifies positions into its own results; they are stored in position order afterwards so the
    // cache does not depend on the thread count.
    std::vector<Classified> results(todo.size());
    std::atomic<size_t> next{0};
    const uint64_t max_work = cg->grammar_->limits().max_mask_work;
    std::atomic<int64_t> budget{static_cast<int64_t>(std::min<uint64_t>(max_work, INT64_MAX / 2))};
    std::atomic<bool> over{false};
    const auto work = [&]() {
      PositionWalker walker(a, trie, cg->grammar_->limits().max_stacks, &budget);
      for (size_t i; !over.load() && (i = next.fetch_add(1)) < todo.size();)
        if (!walker.run(todo[i], &results[i])) over = true;
    };
    const int nt = std::max(1, std::min<int>(threads, static_cast<int>(todo.size())));
    std::vector<std::thread> pool;
    for (int t = 1; t < nt; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (over)
      return make_error(ErrorCode::kInvalidArgument,
                        "grammar: the token masks of its %zu positions would visit more than %llu vocabulary trie "
                        "nodes (the grammar is too large for this vocabulary)",
                        todo.size(), static_cast<unsigned long long>(max_work));

    Stats& st = cg->stats_;
    for (size_t i = 0; i < todo.size(); ++i) {
      CompiledGrammar::PositionMask& m = cg->masks_[todo[i]];
      Classified& r = results[i];
      // Dense sets as bitsets (vocab/8 bytes), sparse ones as id lists (4 bytes per id): whichever is smaller.
      if (r.accepted.size() > words) {
        m.bitset = true;
        m.accepted_begin = static_cast<uint32_t>(cg->bit_pool_.size());
        cg->bit_pool_.resize(cg->bit_pool_.size() + words, 0);
        uint32_t* bits = cg->bit_pool_.data() + m.accepted_begin;
        for (uint32_t rank : r.accepted) {
          const uint32_t id = trie.rank_to_id(rank);
          bits[id >> 5] |= 1u << (id & 31);
        }
        ++st.bitset_positions;
      } else {
        m.accepted_begin = static_cast<uint32_t>(cg->id_pool_.size());
        for (uint32_t rank : r.accepted) cg->id_pool_.push_back(trie.rank_to_id(rank));
        std::sort(cg->id_pool_.begin() + m.accepted_begin, cg->id_pool_.end());
      }
      m.accepted_count = static_cast<uint32_t>(r.accepted.size());
      m.uncertain_begin = static_cast<uint32_t>(cg->rank_pool_.size());
      m.uncertain_count = static_cast<uint32_t>(r.uncertain.size());
      cg->rank_pool_.insert(cg->rank_pool_.end(), r.uncertain.begin(), r.uncertain.end());
      st.uncertain_tokens += r.uncertain.size();
      Classified().accepted.swap(r.accepted);
    }
    for (uint32_t p = 0; p < n; ++p)
      if (a.has_bytes[p] && rep[p] != p) cg->masks_[p] = cg->masks_[rep[p]];
    st.positions = todo.size();
    st.memory_bytes = 4 * (cg->id_pool_.size() + cg->bit_pool_.size() + cg->rank_pool_.size()) +
                      sizeof(CompiledGrammar::PositionMask) * cg->masks_.size();
    st.compile_ms = timer.ms();
    return std::shared_ptr<const CompiledGrammar>(std::move(cg));
  }

  using Stats = CompiledGrammar::Stats;
};

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(std::shared_ptr<const Grammar> grammar,
                                                                        std::shared_ptr<const VocabIndex> vocab,
                                                                        int threads) {
  if (!grammar || !vocab) return make_error(ErrorCode::kInvalidArgument, "grammar: compile without a grammar or vocabulary");
  return MaskCacheBuilder::build(std::move(grammar), std::move(vocab), threads);
}

CompiledGrammar::~CompiledGrammar() = default;

}  // namespace kiln::grammar
