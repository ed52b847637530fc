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

class NfaBuilder {
 public:
  NfaBuilder(const AstRule& rule, const Limits& limits, uint64_t* used) : rule_(rule), limits_(limits), used_(used) {}

  Result<Nfa> run(uint32_t* final_state) {
    const uint32_t start = add();
    const uint32_t end = emit(rule_.body, start, 0);
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

  uint32_t emit(const AstNode& n, uint32_t from, int depth) {
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
        const uint32_t end = add();
        if (ok_) nfa_.states[from].calls.push_back({n.rule, end});
        return end;
      }
      case AstNode::Kind::kSeq: {
        uint32_t cur = from;
        for (const AstNode& k : n.kids) cur = emit(k, cur, depth + 1);
        return cur;
      }
      case AstNode::Kind::kAlt: {
        const uint32_t end = add();
        for (const AstNode& k : n.kids) {
          const uint32_t s = add();
          eps(from, s);
          eps(emit(k, s, depth + 1), end);
        }
        return end;
      }
      case AstNode::Kind::kRepeat: {
        const AstNode& k = n.kids[0];
        uint32_t cur = from;
        for (uint32_t i = 0; i < n.min && ok_; ++i) cur = emit(k, cur, depth + 1);
        if (n.max == kUnbounded) {
          const uint32_t loop = add();
          eps(cur, loop);
          eps(emit(k, loop, depth + 1), loop);
          return loop;
        }
        const uint32_t end = add();
        eps(cur, end);
        for (uint32_t i = n.min; i < n.max && ok_; ++i) {
          cur = emit(k, cur, depth + 1);
          eps(cur, end);
        }
        return end;
      }
    }
    return from;
  }

  const AstRule& rule_;
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

}  // namespace

Result<RuleDfa> build_rule_dfa(const AstRule& rule, const Limits& limits, uint64_t* nfa_used, uint64_t* dfa_used) {
  uint32_t nfa_final = 0;
  KILN_ASSIGN_OR_RETURN(Nfa nfa, NfaBuilder(rule, limits, nfa_used).run(&nfa_final));
  std::vector<uint8_t> mark(nfa.states.size(), 0);

  RuleDfa dfa;
  std::unordered_map<StateSet, uint32_t, SetHash> ids;
  std::vector<StateSet> sets;
  auto intern = [&](StateSet s, uint32_t* id) -> Status {
    closure(nfa, &s, &mark);
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
    for (uint32_t s : cur) {
      if (s == nfa_final) final = true;
      for (const auto& e : nfa.states[s].bytes) {
        points.push_back(e.lo);
        points.push_back(static_cast<uint16_t>(e.hi + 1));
      }
      for (const auto& c : nfa.states[s].calls) call_targets[c.rule].push_back(c.to);
    }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    std::vector<RuleDfa::ByteEdge> bytes;
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
  return dfa;
}

}  // namespace kiln::grammar
