// Thompson construction: each AST node becomes a fragment between a given entry state and a returned exit state;
// character classes become chains of byte ranges (utf8_sequences); repetitions are expanded into copies, which
// is what the NFA budget bounds. The subset construction splits the byte alphabet at every edge boundary of the
// current state set and keeps call edges as symbols of their own.
#include "grammar/rule_dfa.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "grammar/utf8.h"

namespace kiln::grammar {

namespace {

struct Nfa {
  struct State {
    std::vector<RuleDfa::ByteEdge> bytes;
    std::vector<RuleDfa::CallEdge> calls;
    std::vector<uint32_t> eps;
  };
  std::vector<State> states;
};

// Inlined rules nest at most this deep; deeper references stay calls (the result is the same language).
constexpr int kMaxInlineDepth = 32;
// A rule is inlined when its automaton (with its own inlined callees) has at most this many NFA states.
constexpr uint32_t kInlineMaxStates = 160;

class NfaBuilder {
 public:
  NfaBuilder(const Ast& ast, const AstRule& rule, const std::vector<uint8_t>& inline_rule, const Limits& limits,
             uint64_t* used)
      : ast_(ast), rule_(rule), inline_rule_(inline_rule), limits_(limits), used_(used) {}

  Result<Nfa> run(uint32_t* final_state) {
    const uint32_t start = add();
    const uint32_t end = emit(rule_.body, start, 0, 0);
    if (!ok_) return status_;
    *final_state = end;
    return std::move(nfa_);
  }

 private:
  uint32_t add() {
    if (++*used_ > limits_.max_nfa_states && ok_) {
      ok_ = false;
      status_ = make_error(ErrorCode::kInvalidArgument,
                           "grammar: rule '%s' (line %d): more than %u automaton states after expanding "
                           "repetitions and character classes",
                           rule_.name.c_str(), rule_.line, limits_.max_nfa_states);
    }
    if (!ok_) return 0;
    nfa_.states.emplace_back();
    return static_cast<uint32_t>(nfa_.states.size() - 1);
  }

  void eps(uint32_t from, uint32_t to) {
    if (ok_) nfa_.states[from].eps.push_back(to);
  }

  uint32_t emit(const AstNode& n, uint32_t from, int depth, int inline_depth) {
    if (!ok_) return from;
    if (depth > 4 * limits_.max_nesting + 8) {  // AST depth follows parenthesis nesting; a guard all the same
      ok_ = false;
      status_ = make_error(ErrorCode::kInvalidArgument, "grammar: rule '%s' nests too deeply", rule_.name.c_str());
      return from;
    }
    switch (n.kind) {
      case AstNode::Kind::kEmpty:
        return from;
      case AstNode::Kind::kChars: {
        const uint32_t end = add();
        for (const CodeRange& r : n.ranges) {
          for (const Utf8Sequence& s : utf8_sequences(r.lo, r.hi)) {
            uint32_t cur = from;
            for (int i = 0; i < s.n && ok_; ++i) {
              const uint32_t to = i + 1 == s.n ? end : add();
              if (!ok_) break;
              nfa_.states[cur].bytes.push_back({s.ranges[i].lo, s.ranges[i].hi, to});
              cur = to;
            }
          }
        }
        return end;
      }
      case AstNode::Kind::kRef: {
        if (inline_rule_[n.rule] && inline_depth < kMaxInlineDepth)
          return emit(ast_.rules[n.rule].body, from, 0, inline_depth + 1);
        const uint32_t end = add();
        if (ok_) nfa_.states[from].calls.push_back({n.rule, end});
        return end;
      }
      case AstNode::Kind::kSeq: {
        uint32_t cur = from;
        for (const AstNode& k : n.kids) cur = emit(k, cur, depth + 1, inline_depth);
        return cur;
      }
      case AstNode::Kind::kAlt: {
        const uint32_t end = add();
        for (const AstNode& k : n.kids) {
          const uint32_t s = add();
          eps(from, s);
          eps(emit(k, s, depth + 1, inline_depth), end);
        }
        return end;
      }
      case AstNode::Kind::kRepeat: {
        const AstNode& k = n.kids[0];
        uint32_t cur = from;
        for (uint32_t i = 0; i < n.min && ok_; ++i) cur = emit(k, cur, depth + 1, inline_depth);
        if (n.max == kUnbounded) {
          const uint32_t loop = add();
          eps(cur, loop);
          eps(emit(k, loop, depth + 1, inline_depth), loop);
          return loop;
        }
        const uint32_t end = add();
        eps(cur, end);
        for (uint32_t i = n.min; i < n.max && ok_; ++i) {
          cur = emit(k, cur, depth + 1, inline_depth);
          eps(cur, end);
        }
        return end;
      }
    }
    return from;
  }

  const Ast& ast_;
  const AstRule& rule_;
  const std::vector<uint8_t>& inline_rule_;
  const Limits& limits_;
  uint64_t* used_;
  bool ok_ = true;
  Status status_;
  Nfa nfa_;
};

using StateSet = std::vector<uint32_t>;

struct SetHash {
  size_t operator()(const StateSet& s) const {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t x : s) h = (h ^ x) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

void closure(const Nfa& nfa, StateSet* set, std::vector<uint8_t>* mark) {
  std::vector<uint32_t> work(set->begin(), set->end());
  for (uint32_t s : *set) (*mark)[s] = 1;
  while (!work.empty()) {
    const uint32_t s = work.back();
    work.pop_back();
    for (uint32_t t : nfa.states[s].eps) {
      if (!(*mark)[t]) {
        (*mark)[t] = 1;
        set->push_back(t);
        work.push_back(t);
      }
    }
  }
  for (uint32_t s : *set) (*mark)[s] = 0;
  std::sort(set->begin(), set->end());
}


// Moore's partition refinement: states start split by finality and are split again by the blocks their edges
// lead to, until nothing changes. Equivalent states (same future) become one; the start stays state 0.
// A long chain (a repetition {0,N}) needs about N rounds: past a work budget the automaton is kept as it is, which
// is correct, only larger (minimality merely shares positions).
RuleDfa minimize(RuleDfa d) {
  constexpr uint64_t kMaxWork = 8'000'000;
  uint64_t work = 0;
  const size_t n = d.states.size();
  std::vector<uint32_t> block(n);
  for (size_t i = 0; i < n; ++i) block[i] = d.states[i].final ? 1 : 0;
  size_t count = 0;
  std::vector<uint32_t> sig;
  for (;;) {
    std::unordered_map<std::vector<uint32_t>, uint32_t, SetHash> ids;
    std::vector<uint32_t> next(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& s = d.states[i];
      sig.clear();
      sig.push_back(block[i]);
      // Byte edges with adjacent ranges into the same block merged, so equal behaviour gives equal signatures.
      uint32_t lo = 0, hi = 0, to = UINT32_MAX;
      for (const auto& e : s.bytes) {
        if (to == block[e.to] && hi + 1 == e.lo) {
          hi = e.hi;
          continue;
        }
        if (to != UINT32_MAX) sig.insert(sig.end(), {lo, hi, to});
        lo = e.lo, hi = e.hi, to = block[e.to];
      }
      if (to != UINT32_MAX) sig.insert(sig.end(), {lo, hi, to});
      sig.push_back(UINT32_MAX);
      for (const auto& c : s.calls) sig.insert(sig.end(), {c.rule, block[c.to]});
      next[i] = ids.emplace(sig, static_cast<uint32_t>(ids.size())).first->second;
    }
    block.swap(next);
    if (ids.size() == count) break;
    count = ids.size();
    work += n + sig.size() * n / 4;
    if (work > kMaxWork) return d;
  }
  // Renumber blocks in order of first appearance, so the start state's block is 0.
  std::vector<uint32_t> id(count, UINT32_MAX);
  uint32_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (id[block[i]] == UINT32_MAX) id[block[i]] = k++;
  RuleDfa out;
  out.states.resize(k);
  std::vector<uint8_t> done(k, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = id[block[i]];
    if (done[b]) continue;
    done[b] = 1;
    RuleDfa::State& s = out.states[b];
    s.final = d.states[i].final;
    for (const auto& e : d.states[i].bytes) {
      const uint32_t to = id[block[e.to]];
      if (!s.bytes.empty() && s.bytes.back().to == to && s.bytes.back().hi + 1 == e.lo) {
        s.bytes.back().hi = e.hi;
      } else {
        s.bytes.push_back({e.lo, e.hi, to});
      }
    }
    for (const auto& c : d.states[i].calls) s.calls.push_back({c.rule, id[block[c.to]]});
  }
  return out;
}

// An estimate of a node's NFA states, saturating above `cap` (only "small or not" matters).
uint32_t nfa_size(const Ast& ast, const AstNode& n, const std::vector<uint32_t>& rule_size,
                  const std::vector<uint8_t>& inline_rule, uint32_t cap) {
  uint64_t s = 0;
  switch (n.kind) {
    case AstNode::Kind::kEmpty:
      return 0;
    case AstNode::Kind::kChars:
      s = 1;
      for (const CodeRange& r : n.ranges)
        for (const Utf8Sequence& q : utf8_sequences(r.lo, r.hi)) s += static_cast<uint64_t>(q.n - 1);
      break;
    case AstNode::Kind::kRef:
      s = inline_rule[n.rule] ? rule_size[n.rule] : 1;
      break;
    case AstNode::Kind::kSeq:
    case AstNode::Kind::kAlt:
      s = n.kids.size() + 1;
      for (const AstNode& k : n.kids) s += nfa_size(ast, k, rule_size, inline_rule, cap);
      break;
    case AstNode::Kind::kRepeat: {
      const uint64_t copies = n.max == kUnbounded ? uint64_t{n.min} + 1 : n.max;
      s = copies * nfa_size(ast, n.kids[0], rule_size, inline_rule, cap) + 2;
      break;
    }
  }
  return static_cast<uint32_t>(std::min<uint64_t>(s, cap + 1));
}

void collect_refs(const AstNode& n, std::vector<uint32_t>* out) {
  if (n.kind == AstNode::Kind::kRef) out->push_back(n.rule);
  for (const AstNode& k : n.kids) collect_refs(k, out);
}

}  // namespace

std::vector<uint8_t> choose_inline_rules(const Ast& ast, const std::vector<uint32_t>& reachable) {
  // Tarjan's strongly connected components, iteratively; components come out callees first, so every rule's
  // inlined callees are sized before the rule itself.
  const size_t nr = ast.rules.size();
  std::vector<std::vector<uint32_t>> refs(nr);
  for (uint32_t r : reachable) {
    collect_refs(ast.rules[r].body, &refs[r]);
    std::sort(refs[r].begin(), refs[r].end());
    refs[r].erase(std::unique(refs[r].begin(), refs[r].end()), refs[r].end());
  }
  std::vector<uint8_t> inline_rule(nr, 0);
  std::vector<uint32_t> rule_size(nr, 0), index(nr, UINT32_MAX), low(nr, 0);
  std::vector<uint8_t> on_stack(nr, 0);
  std::vector<uint32_t> stack;
  std::vector<std::pair<uint32_t, size_t>> call;  // (rule, next ref to visit)
  uint32_t counter = 0;
  for (uint32_t root : reachable) {
    if (index[root] != UINT32_MAX) continue;
    call.push_back({root, 0});
    index[root] = low[root] = counter++;
    stack.push_back(root);
    on_stack[root] = 1;
    while (!call.empty()) {
      auto& [v, i] = call.back();
      if (i < refs[v].size()) {
        const uint32_t w = refs[v][i++];
        if (index[w] == UINT32_MAX) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = 1;
          call.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      const uint32_t done = v;
      call.pop_back();
      if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
      if (low[done] != index[done]) continue;
      std::vector<uint32_t> comp;
      for (;;) {
        const uint32_t w = stack.back();
        stack.pop_back();
        on_stack[w] = 0;
        comp.push_back(w);
        if (w == done) break;
      }
      const bool recursive =
          comp.size() > 1 || std::binary_search(refs[done].begin(), refs[done].end(), done);
      if (recursive || done == ast.root) continue;
      rule_size[done] = nfa_size(ast, ast.rules[done].body, rule_size, inline_rule, kInlineMaxStates);
      inline_rule[done] = rule_size[done] <= kInlineMaxStates;
    }
  }
  return inline_rule;
}

namespace {
}  // namespace

Result<RuleDfa> build_rule_dfa(const Ast& ast, uint32_t rule_index, const std::vector<uint8_t>& inline_rule,
                               const Limits& limits, uint64_t* nfa_used, uint64_t* dfa_used, uint64_t* dfa_work) {
  const AstRule& rule = ast.rules[rule_index];
  uint32_t nfa_final = 0;
  KILN_ASSIGN_OR_RETURN(Nfa nfa, NfaBuilder(ast, rule, inline_rule, limits, nfa_used).run(&nfa_final));
  std::vector<uint8_t> mark(nfa.states.size(), 0);

  RuleDfa dfa;
  std::unordered_map<StateSet, uint32_t, SetHash> ids;
  std::vector<StateSet> sets;
  auto intern = [&](StateSet s, uint32_t* id) -> Status {
    closure(nfa, &s, &mark);
    // Nested optional repetitions make every position a large set of NFA states: the work is bounded too.
    *dfa_work += s.size();
    if (*dfa_work > limits.max_dfa_work)
      return make_error(ErrorCode::kInvalidArgument,
                        "grammar: rule '%s' (line %d): more than %llu steps to build the automaton (nested "
                        "repetitions?)",
                        rule.name.c_str(), rule.line, static_cast<unsigned long long>(limits.max_dfa_work));
    auto it = ids.find(s);
    if (it != ids.end()) {
      *id = it->second;
      return Status::ok();
    }
    if (++*dfa_used > limits.max_dfa_states)
      return make_error(ErrorCode::kInvalidArgument,
                        "grammar: rule '%s' (line %d): more than %u automaton positions in all rules",
                        rule.name.c_str(), rule.line, limits.max_dfa_states);
    *id = static_cast<uint32_t>(sets.size());
    ids.emplace(s, *id);
    sets.push_back(std::move(s));
    dfa.states.emplace_back();
    return Status::ok();
  };
  uint32_t start_id;
  KILN_TRY(intern({0}, &start_id));

  std::vector<uint16_t> points;
  std::map<uint32_t, StateSet> call_targets;
  for (size_t i = 0; i < sets.size(); ++i) {
    const StateSet cur = sets[i];
    bool final = false;
    points.clear();
    call_targets.clear();
    size_t n_edges = 0;
    for (uint32_t s : cur) {
      if (s == nfa_final) final = true;
      n_edges += nfa.states[s].bytes.size();
      for (const auto& e : nfa.states[s].bytes) {
        points.push_back(e.lo);
        points.push_back(static_cast<uint16_t>(e.hi + 1));
      }
      for (const auto& c : nfa.states[s].calls) call_targets[c.rule].push_back(c.to);
    }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    std::vector<RuleDfa::ByteEdge> bytes;
    *dfa_work += points.size() * (n_edges + 1);
    for (size_t k = 0; k + 1 < points.size(); ++k) {
      const uint16_t lo = points[k], hi = static_cast<uint16_t>(points[k + 1] - 1);
      StateSet target;
      for (uint32_t s : cur)
        for (const auto& e : nfa.states[s].bytes)
          if (e.lo <= lo && lo <= e.hi) target.push_back(e.to);
      if (target.empty()) continue;
      std::sort(target.begin(), target.end());
      target.erase(std::unique(target.begin(), target.end()), target.end());
      uint32_t to;
      KILN_TRY(intern(std::move(target), &to));
      if (!bytes.empty() && bytes.back().to == to && bytes.back().hi + 1 == lo) {
        bytes.back().hi = static_cast<uint8_t>(hi);
      } else {
        bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
      }
    }
    std::vector<RuleDfa::CallEdge> calls;
    for (auto& [r, targets] : call_targets) {
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      uint32_t to;
      KILN_TRY(intern(std::move(targets), &to));
      calls.push_back({r, to});
    }
    dfa.states[i].bytes = std::move(bytes);
    dfa.states[i].calls = std::move(calls);
    dfa.states[i].final = final;
  }
  return minimize(std::move(dfa));
}

}  // namespace kiln::grammar
