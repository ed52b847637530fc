// Grammar AST -> Automaton: per-rule DFAs numbered globally, then the analyses the matcher relies on (distances
// and productivity, rule-entry chains with left-recursion detection, follow sets). See automaton.h.
#include "grammar/automaton.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "grammar/rule_dfa.h"

namespace kiln::grammar {

namespace {

constexpr uint32_t kInf = std::numeric_limits<uint32_t>::max();

// The AST rules reachable from root, root first (breadth-first order).
std::vector<uint32_t> reachable_rules(const Ast& ast) {
  std::vector<uint32_t> order{ast.root};
  std::vector<uint8_t> seen(ast.rules.size(), 0);
  seen[ast.root] = 1;
  std::vector<const AstNode*> work;
  for (size_t i = 0; i < order.size(); ++i) {
    work.push_back(&ast.rules[order[i]].body);
    while (!work.empty()) {
      const AstNode* n = work.back();
      work.pop_back();
      if (n->kind == AstNode::Kind::kRef && !seen[n->rule]) {
        seen[n->rule] = 1;
        order.push_back(n->rule);
      }
      for (const AstNode& k : n->kids) work.push_back(&k);
    }
  }
  return order;
}

// Knuth's generalization of Dijkstra: d[p] = min(0 if final, 1 + d[byte target], d[start of callee] + d[return]).
// Every term is a sum of non-negative parts, so values finalize in increasing order.
void compute_dist(Automaton& a) {
  const uint32_t n = a.num_positions;
  struct Term {
    uint32_t owner, x, y;  // value = add + d[x] + (y == kInf ? 0 : d[y])
    uint32_t add;
  };
  std::vector<Term> terms;
  for (uint32_t p = 0; p < n; ++p) {
    const uint32_t r = a.pos_rule[p];
    std::vector<int32_t> targets(a.trans.begin() + a.trans_begin[p], a.trans.begin() + a.trans_begin[p] + a.num_classes[r]);
    std::sort(targets.begin(), targets.end());
    targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
    for (int32_t t : targets)
      if (t >= 0) terms.push_back({p, static_cast<uint32_t>(t), kInf, 1});
    for (uint32_t c = a.call_begin[p]; c < a.call_begin[p + 1]; ++c)
      terms.push_back({p, a.rule_start[a.calls[c].first], a.calls[c].second, 0});
  }
  std::vector<std::vector<uint32_t>> uses(n);
  for (uint32_t i = 0; i < terms.size(); ++i) {
    uses[terms[i].x].push_back(i);
    if (terms[i].y != kInf && terms[i].y != terms[i].x) uses[terms[i].y].push_back(i);
  }
  std::vector<uint32_t> d(n, kInf);
  std::vector<uint8_t> done(n, 0);
  using Item = std::pair<uint32_t, uint32_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
  for (uint32_t p = 0; p < n; ++p)
    if (a.final[p]) {
      d[p] = 0;
      pq.push({0, p});
    }
  while (!pq.empty()) {
    const auto [dv, p] = pq.top();
    pq.pop();
    if (done[p] || dv != d[p]) continue;
    done[p] = 1;
    for (uint32_t ti : uses[p]) {
      const Term& t = terms[ti];
      if (done[t.owner] || !done[t.x] || (t.y != kInf && !done[t.y])) continue;
      const uint64_t v = uint64_t{t.add} + d[t.x] + (t.y == kInf ? 0 : d[t.y]);
      if (v < d[t.owner]) {
        d[t.owner] = static_cast<uint32_t>(std::min<uint64_t>(v, kInf - 1));
        pq.push({d[t.owner], t.owner});
      }
    }
  }
  a.dist = std::move(d);
}

class ChainBuilder {
 public:
  ChainBuilder(Automaton& a, const Limits& limits) : a_(a), limits_(limits) {}

  Status run() {
    const uint32_t n = a_.num_positions;
    state_.assign(n, 0);
    chains_.resize(n);
    a_.pops.assign(n, 0);
    for (uint32_t p = 0; p < n && ok_; ++p)
      if (state_[p] == 0) compute(p, 0);
    if (!ok_) return status_;
    a_.chain_begin.assign(n + 1, 0);
    a_.chain_data.clear();
    a_.simple.assign(n, 0);
    for (uint32_t p = 0; p < n; ++p) {
      a_.chain_begin[p] = static_cast<uint32_t>(a_.chain_data.size());
      for (const auto& c : chains_[p]) {
        a_.chain_data.push_back(static_cast<uint32_t>(c.size()));
        a_.chain_data.insert(a_.chain_data.end(), c.begin(), c.end());
      }
      a_.simple[p] = !a_.pops[p] && chains_[p].size() == 1 && chains_[p][0].size() == 1 && chains_[p][0][0] == p;
    }
    a_.chain_begin[n] = static_cast<uint32_t>(a_.chain_data.size());
    return Status::ok();
  }

 private:
  void fail(Status s) {
    if (ok_) status_ = std::move(s);
    ok_ = false;
  }

  // The positions reachable from p in its rule by skipping calls of rules that can match nothing.
  std::vector<uint32_t> closure(uint32_t p) {
    std::vector<uint32_t> out{p};
    for (size_t i = 0; i < out.size(); ++i) {
      const uint32_t q = out[i];
      for (uint32_t c = a_.call_begin[q]; c < a_.call_begin[q + 1]; ++c) {
        const auto [rule, ret] = a_.calls[c];
        if (a_.dist[a_.rule_start[rule]] == 0 && std::find(out.begin(), out.end(), ret) == out.end())
          out.push_back(ret);
      }
    }
    return out;
  }

  void compute(uint32_t p, int depth) {
    if (depth > 2000) {
      fail(make_error(ErrorCode::kInvalidArgument,
                      "grammar: rule '%s': rules call each other more than 2000 deep before matching a byte",
                      a_.rule_names[a_.pos_rule[p]].c_str()));
      return;
    }
    state_[p] = 1;
    std::vector<std::vector<uint32_t>> out;
    for (uint32_t q : closure(p)) {
      if (a_.final[q]) a_.pops[p] = 1;
      if (a_.has_bytes[q]) out.push_back({q});
      for (uint32_t c = a_.call_begin[q]; c < a_.call_begin[q + 1] && ok_; ++c) {
        const auto [rule, ret] = a_.calls[c];
        const uint32_t s = a_.rule_start[rule];
        if (state_[s] == 1) {
          fail(make_error(ErrorCode::kInvalidArgument,
                          "grammar: rule '%s' is left-recursive (it can reach itself without matching a byte)",
                          a_.rule_names[rule].c_str()));
          return;
        }
        if (state_[s] == 0) compute(s, depth + 1);
        if (!ok_) return;
        for (const auto& c2 : chains_[s]) {
          std::vector<uint32_t> chain{ret};
          chain.insert(chain.end(), c2.begin(), c2.end());
          words_ += chain.size() + 1;
          out.push_back(std::move(chain));
        }
        if (words_ > limits_.max_chain_words) {
          fail(make_error(ErrorCode::kInvalidArgument,
                          "grammar: rule '%s': the grammar is too ambiguous (more than %u words of rule-entry "
                          "chains)",
                          a_.rule_names[a_.pos_rule[p]].c_str(), limits_.max_chain_words));
          return;
        }
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    chains_[p] = std::move(out);
    state_[p] = 2;
  }

  Automaton& a_;
  const Limits& limits_;
  std::vector<uint8_t> state_;  // 0 not visited, 1 in progress, 2 done
  std::vector<std::vector<std::vector<uint32_t>>> chains_;
  uint64_t words_ = 0;
  bool ok_ = true;
  Status status_;
};

// follow(R) >= first(t) for every call R -> t; follow(R) >= follow(caller) when the caller can end at t.
void compute_follow(Automaton& a) {
  const uint32_t n = a.num_positions;
  const size_t nr = a.rule_names.size();
  std::vector<ByteSet> first(n, ByteSet{});
  for (uint32_t p = 0; p < n; ++p) {
    for (uint32_t i = a.chain_begin[p]; i < a.chain_begin[p + 1];) {
      const uint32_t len = a.chain_data[i];
      const uint32_t top = a.chain_data[i + len];
      for (int b = 0; b < 256; ++b)
        if (a.next(top, static_cast<uint8_t>(b)) >= 0) byteset_add(first[p], static_cast<uint8_t>(b));
      i += len + 1;
    }
  }
  a.follow.assign(nr, ByteSet{});
  std::vector<std::vector<uint32_t>> into(nr);  // into[S]: rules R whose follow includes follow(S)
  for (uint32_t p = 0; p < n; ++p) {
    for (uint32_t c = a.call_begin[p]; c < a.call_begin[p + 1]; ++c) {
      const auto [rule, ret] = a.calls[c];
      for (int w = 0; w < 4; ++w) a.follow[rule][w] |= first[ret][w];
      if (a.pops[ret]) into[a.pos_rule[p]].push_back(rule);
    }
  }
  std::vector<uint32_t> work(nr);
  for (uint32_t r = 0; r < nr; ++r) work[r] = r;
  while (!work.empty()) {
    const uint32_t s = work.back();
    work.pop_back();
    for (uint32_t r : into[s]) {
      bool changed = false;
      for (int w = 0; w < 4; ++w) {
        const uint64_t v = a.follow[r][w] | a.follow[s][w];
        changed |= v != a.follow[r][w];
        a.follow[r][w] = v;
      }
      if (changed) work.push_back(r);
    }
  }
}

}  // namespace

Result<Automaton> build_automaton(const Ast& ast, const Limits& limits) {
  Automaton a;

  // Inlined rules disappear as rules: only the root and the rules still called get automata.
  const std::vector<uint8_t> inline_rule = choose_inline_rules(ast, reachable_rules(ast));
  std::vector<RuleDfa> dfas;
  uint64_t nfa_used = 0, dfa_used = 0, dfa_work = 0;
  std::vector<uint32_t> order;
  std::vector<uint32_t> index(ast.rules.size(), kInf);
  order.push_back(ast.root);
  index[ast.root] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t r = order[i];
    KILN_ASSIGN_OR_RETURN(RuleDfa d, build_rule_dfa(ast, r, inline_rule, limits, &nfa_used, &dfa_used, &dfa_work));
    for (const auto& s : d.states)
      for (const auto& c : s.calls)
        if (index[c.rule] == kInf) {
          index[c.rule] = static_cast<uint32_t>(order.size());
          order.push_back(c.rule);
        }
    a.rule_names.push_back(ast.rules[r].name);
    a.rule_start.push_back(a.num_positions);
    a.num_positions += static_cast<uint32_t>(d.states.size());
    dfas.push_back(std::move(d));
  }
  const uint32_t n = a.num_positions;
  a.pos_rule.resize(n);
  a.final.resize(n);
  a.has_bytes.resize(n);
  a.trans_begin.resize(n);
  a.call_begin.assign(n + 1, 0);
  a.byte_class.assign(dfas.size() * 256, 0);
  a.num_classes.resize(dfas.size());
  for (uint32_t r = 0; r < dfas.size(); ++r) {
    const RuleDfa& d = dfas[r];
    // Byte classes: bytes no edge boundary of this rule separates behave the same in every state.
    std::vector<uint8_t> cut(257, 0);
    for (const auto& s : d.states)
      for (const auto& e : s.bytes) cut[e.lo] = cut[e.hi + 1] = 1;
    uint16_t cls = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[b]) ++cls;
      a.byte_class[size_t{r} * 256 + b] = static_cast<uint8_t>(cls);
    }
    a.num_classes[r] = static_cast<uint16_t>(cls + 1);
    const uint32_t base = a.rule_start[r];
    for (uint32_t i = 0; i < d.states.size(); ++i) {
      const uint32_t p = base + i;
      const auto& s = d.states[i];
      a.pos_rule[p] = r;
      a.final[p] = s.final;
      a.has_bytes[p] = !s.bytes.empty();
      a.trans_begin[p] = static_cast<uint32_t>(a.trans.size());
      a.trans.resize(a.trans.size() + a.num_classes[r], -1);
      for (const auto& e : s.bytes)
        for (int b = e.lo; b <= e.hi; ++b)
          a.trans[a.trans_begin[p] + a.byte_class[size_t{r} * 256 + b]] = static_cast<int32_t>(base + e.to);
      for (const auto& c : s.calls) a.calls.push_back({index[c.rule], base + c.to});
      a.call_begin[p + 1] = static_cast<uint32_t>(a.calls.size());
    }
  }

  compute_dist(a);
  for (uint32_t r = 0; r < a.rule_names.size(); ++r) {
    if (a.dist[a.rule_start[r]] == kInf) {
      const AstRule& ar = ast.rules[order[r]];
      return make_error(ErrorCode::kInvalidArgument,
                        "grammar: line %d: rule '%s' can never finish (every alternative refers back to it)",
                        ar.line, ar.name.c_str());
    }
  }
  for (uint32_t p = 0; p < n; ++p) {
    if (a.dist[p] == kInf)  // unreachable in practice: Thompson fragments of productive rules always finish
      return make_error(ErrorCode::kInternal, "grammar: rule '%s' has a position that cannot finish",
                        a.rule_names[a.pos_rule[p]].c_str());
  }
  KILN_TRY(ChainBuilder(a, limits).run());
  compute_follow(a);
  return a;
}

}  // namespace kiln::grammar
