// The pieces of the engine loop's step (runtime/scheduler.h, runtime/hooks.h, runtime/stop_filter.h): the stop
// filter on its own; schedule()'s decisions within the token budget (decodes before prompt chunks, chunks sized to
// what is left, admission at the step boundary); the hooks' identity (processors, token mask, draft proposer
// change no token) and their contracts (who is called when, a mask really restricts, a mask that allows nothing
// ends the request with an error).
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "runtime/scheduler.h"
#include "runtime/stop_filter.h"

namespace kiln {
namespace {

std::string demo_model() { return std::string(KILN_SOURCE_DIR) + "/models/kiln-demo.gguf"; }

// ---- the stop filter ----

TEST(StopFilter, HoldsBackPossibleStartsAndCutsAtTheFirstMatch) {
  StopFilter f({"\nUser:", "END"});
  EXPECT_EQ(f.push("Hello"), "Hello");
  EXPECT_EQ(f.push(" world\n"), " world");  // "\n" may start "\nUser:"
  EXPECT_EQ(f.push("Us"), "");              // "\nUs" still may
  EXPECT_EQ(f.push("ual"), "\nUsual");      // it did not
  EXPECT_EQ(f.push("E"), "");
  EXPECT_EQ(f.push("N"), "");
  EXPECT_FALSE(f.hit());
  EXPECT_EQ(f.push("Dless"), "");  // "END" complete: nothing of it or after it
  EXPECT_TRUE(f.hit());
  EXPECT_EQ(f.matched(), "END");
  EXPECT_EQ(f.push("more"), "");
  EXPECT_EQ(f.flush(), "");
}

TEST(StopFilter, MatchInsideOnePieceAndEarliestOfSeveral) {
  StopFilter f({"cd", "bcd", "x"});
  EXPECT_EQ(f.push("abcdex"), "a");  // "bcd" starts first
  EXPECT_TRUE(f.hit());
  EXPECT_EQ(f.matched(), "bcd");
  StopFilter g({"ab"});
  EXPECT_EQ(g.push("xa"), "x");
  EXPECT_EQ(g.flush(), "a");  // the end: held text goes out when no stop string completed
  EXPECT_FALSE(g.hit());
  EXPECT_EQ(g.matched(), "");
}

TEST(StopFilter, NoStopsPassesEverythingAndEmptyStringsAreIgnored) {
  StopFilter none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.push("any \n text"), "any \n text");
  StopFilter empty({""});
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.push("abc"), "abc");
  EXPECT_FALSE(empty.hit());
}

// ---- schedule(): the step's token budget ----

// Three requests (prompts of 20, 5 and 12 tokens, 3 tokens each) with a budget of 8 tokens per step, submitted
// before the engine starts: each step's entries are what schedule() decided, in batch order.
TEST(EngineLoop, ScheduleSpendsTheBudgetDecodesFirst) {
  EngineConfig cfg;
  cfg.n_ctx = 1024;
  cfg.max_seqs = 3;
  cfg.batch_tokens = 8;
  cfg.prefix_cache = false;
  cfg.start = false;
  auto s = test::make_scheduler(demo_model(), cfg);
  ASSERT_TRUE(s);
  std::mutex mu;
  std::vector<StepInfo> steps;
  s->set_step_observer([&](const StepInfo& i) {
    std::lock_guard<std::mutex> lk(mu);
    steps.push_back(i);
  });
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int n : {20, 5, 12}) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(100 + 7 * i + n);
    auto h = s->submit(test::greedy_request(p, 3));
    ASSERT_TRUE(h.is_ok());
    hs.push_back(*h);
  }
  s->start();
  for (auto& h : hs) h->wait_all();
  ASSERT_TRUE(s->wait_idle(std::chrono::seconds(10)));
  s->set_step_observer(nullptr);
  const uint64_t A = hs[0]->id(), B = hs[1]->id(), C = hs[2]->id();
  using E = StepInfo::Entry;
  auto eq = [](const std::vector<E>& got, const std::vector<E>& want) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i].request != want[i].request || got[i].n_tokens != want[i].n_tokens || got[i].output != want[i].output)
        return false;
    return true;
  };
  const std::vector<std::vector<E>> want = {
      {{A, 8, false}},                                // A's prompt in chunks of the whole budget
      {{A, 8, false}},
      {{A, 4, true}, {B, 4, false}},                  // A's last chunk, then B is admitted with what is left
      {{A, 1, true}, {B, 1, true}, {C, 6, false}},    // A and B decode (B: its last prompt token); C admitted
      {{A, 1, true}, {B, 1, true}, {C, 6, true}},     // A finishes (3 tokens)
      {{B, 1, true}, {C, 1, true}},                   // B finishes
      {{C, 1, true}},
  };
  ASSERT_EQ(steps.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_TRUE(eq(steps[i].entries, want[i]));
    int32_t n = 0;
    for (auto& e : steps[i].entries) n += e.n_tokens;
    EXPECT_EQ(n, steps[i].n_tokens);
    EXPECT_LE(steps[i].n_tokens, 8);
  }
  EXPECT_EQ(steps[2].n_admitted, 1);
  EXPECT_EQ(steps[3].n_decode, 2);
  EXPECT_EQ(steps[3].n_prefill_tokens, 6);
  for (auto& h : hs) EXPECT_EQ(h->timings().n_gen, 3);
}

// ---- the hooks ----

struct Counts {
  std::mutex mu;
  int processed = 0, masked = 0, accepted = 0, proposed = 0, verified = 0;
  std::vector<int32_t> accepted_ids;
  int32_t max_k_seen = -1;
};

class CountingProcessor : public LogitsProcessor {
 public:
  explicit CountingProcessor(Counts* c) : c_(c) {}
  void process(std::span<float>) override { ++c_->processed; }
  Counts* c_;
};

// Allows every token (identity) or only `only` (when >= 0).
class Mask : public TokenMaskProvider {
 public:
  Mask(Counts* c, int32_t only) : c_(c), only_(only) {}
  bool restricts() const override { return only_ != -1; }
  bool allowed(std::span<uint64_t> mask) override {
    ++c_->masked;
    if (only_ == -1) return false;
    for (auto& w : mask) w = 0;
    if (only_ >= 0) mask[only_ / 64] |= uint64_t{1} << (only_ % 64);  // only_ == -2: nothing allowed
    return true;
  }
  void accept(int32_t token) override {
    ++c_->accepted;
    c_->accepted_ids.push_back(token);
  }
  Counts* c_;
  int32_t only_;
};

class Drafts : public DraftProposer {
 public:
  explicit Drafts(Counts* c) : c_(c) {}
  int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) override {
    ++c_->proposed;
    c_->max_k_seen = std::max(c_->max_k_seen, max_k);
    EXPECT_FALSE(tokens.empty());
    EXPECT_EQ(out.size(), static_cast<size_t>(max_k));
    return 0;
  }
  void accepted(int32_t n) override {
    ++c_->verified;
    EXPECT_EQ(n, 0);
  }
  Counts* c_;
};

SequenceHooksFactory all_hooks(Counts* c, int32_t only = -1) {
  return [c, only] {
    SequenceHooks h;
    h.processors.push_back(std::make_unique<CountingProcessor>(c));
    h.mask = std::make_unique<Mask>(c, only);
    h.drafts = std::make_unique<Drafts>(c);
    return h;
  };
}

// Identity hooks change no token, greedy or seeded, and each is called as runtime/hooks.h says: a processor and the
// mask once per sampled position, accept once per chosen token, propose once per decode step (asked for 0 drafts:
// speculation is off), accepted once per step with output.
TEST(EngineHooks, IdentityHooksChangeNothing) {
  auto s = test::make_scheduler(demo_model(), test::one_sequence(512));
  ASSERT_TRUE(s);
  const std::vector<int32_t> p = s->tokenizer().encode("And God said unto Moses,", true, false);
  for (float temp : {0.0f, 0.9f}) {
    SCOPED_TRACE("temp " + std::to_string(temp));
    GenRequest r = test::greedy_request(p, 12);
    r.sampling.temp = temp;
    r.sampling.seed = 77;
    const test::Generated plain = test::generate(*s, r);
    ASSERT_EQ(plain.ids.size(), 12u);
    Counts c;
    r.hooks = all_hooks(&c);
    const test::Generated hooked = test::generate(*s, r);
    ASSERT_TRUE(hooked.error.is_ok()) << hooked.error.to_string();
    EXPECT_EQ(hooked.ids, plain.ids);
    EXPECT_EQ(hooked.text, plain.text);
    EXPECT_EQ(c.processed, 12);
    EXPECT_EQ(c.masked, 12);
    EXPECT_EQ(c.accepted, 12);
    EXPECT_EQ(c.accepted_ids, plain.ids);
    EXPECT_EQ(c.proposed, 11);  // every step after the prompt's decodes one token
    EXPECT_EQ(c.max_k_seen, 0);  // speculation off (EngineConfig::spec): no room for drafts
    EXPECT_EQ(c.verified, 12);
  }
}

// A mask that allows one token makes every generated token that one, greedy or sampled; a mask that allows none
// ends the request with an error naming the mask.
TEST(EngineHooks, TokenMaskRestrictsTheSampler) {
  auto s = test::make_scheduler(demo_model(), test::one_sequence(512));
  ASSERT_TRUE(s);
  const std::vector<int32_t> p = s->tokenizer().encode("The LORD is my shepherd;", true, false);
  const int32_t only = 123;
  for (float temp : {0.0f, 1.0f}) {
    Counts c;
    GenRequest r = test::greedy_request(p, 6);
    r.sampling.temp = temp;
    r.hooks = all_hooks(&c, only);
    const test::Generated g = test::generate(*s, r);
    ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
    EXPECT_EQ(g.ids, std::vector<int32_t>(6, only));
  }
  Counts c;
  GenRequest r = test::greedy_request(p, 6);
  r.hooks = all_hooks(&c, -2);
  const test::Generated g = test::generate(*s, r);
  EXPECT_EQ(g.reason, FinishReason::kError);
  EXPECT_NE(g.error.message().find("token mask"), std::string::npos) << g.error.to_string();
  EXPECT_TRUE(g.ids.empty());
  EXPECT_TRUE(s->wait_idle(std::chrono::seconds(5)));
  EXPECT_EQ(s->stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace kiln
