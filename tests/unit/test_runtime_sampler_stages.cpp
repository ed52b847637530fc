// The sampler stages beyond top-k/top-p/min-p (logit bias, DRY, typical, XTC, mirostat) on hand-made logits, each
// outcome worked out from the definition in runtime/sampler.h and runtime/dry.h; their place in the chain; seeding;
// the greedy path and when a greedy sequence may take the device argmax; DRY's sequence breakers for a real
// vocabulary; no allocation per call.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <set>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "runtime/dry.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "tokenizer/tokenizer.h"

#include "common/sampler_test_util.h"

namespace kiln {
namespace {

// Every stage off, temperature 1: a test switches on the one it checks.
SamplerParams plain(float temp = 1.0f) { return test::plain_sampler(temp, 77); }

using test::log_probs;

int32_t pick(Sampler& s, const std::vector<float>& l) { return s.sample(l); }

std::vector<Sampler::TokenProb> cands(Sampler& s, const std::vector<float>& l) {
  std::vector<Sampler::TokenProb> c;
  s.candidates(l, &c);
  return c;
}

std::set<int32_t> ids(const std::vector<Sampler::TokenProb>& c) {
  std::set<int32_t> out;
  for (auto& t : c) out.insert(t.id);
  return out;
}

float prob_of(const std::vector<Sampler::TokenProb>& c, int32_t id) {
  for (auto& t : c)
    if (t.id == id) return t.p;
  return -1;
}

TEST(SamplerStages, DefaultsAreLlamaCpps) {
  SamplerParams p;
  EXPECT_FLOAT_EQ(p.typical_p, 1.0f);
  EXPECT_FLOAT_EQ(p.xtc_probability, 0.0f);
  EXPECT_FLOAT_EQ(p.xtc_threshold, 0.1f);
  EXPECT_FLOAT_EQ(p.dry_multiplier, 0.0f);
  EXPECT_FLOAT_EQ(p.dry_base, 1.75f);
  EXPECT_EQ(p.dry_allowed_length, 2);
  EXPECT_EQ(p.dry_penalty_last_n, -1);
  EXPECT_EQ(p.dry_sequence_breakers, (std::vector<std::string>{"\n", ":", "\"", "*"}));
  EXPECT_TRUE(p.logit_bias.empty());
  EXPECT_FALSE(p.dry_enabled());
  EXPECT_EQ(p.mirostat, 0);
  EXPECT_FLOAT_EQ(p.mirostat_tau, 5.0f);
  EXPECT_FLOAT_EQ(p.mirostat_eta, 0.1f);
}

// ---- logit bias ----

TEST(SamplerLogitBias, ShiftsTheLogitsBeforeEverything) {
  // Uniform logits, +ln 2 on token 2: p = {1/4, 1/4, 1/2}.
  SamplerParams p = plain();
  p.logit_bias = {{2, std::log(2.0f)}};
  Sampler s(p, 3);
  auto c = cands(s, {0, 0, 0});
  EXPECT_NEAR(prob_of(c, 0), 0.25, 1e-6);
  EXPECT_NEAR(prob_of(c, 2), 0.5, 1e-6);
  // Greedy: -100 on the argmax hands it to the next; +100 forces a token; the device argmax cannot be used.
  SamplerParams g = plain(0);
  Sampler none(g, 3);
  EXPECT_TRUE(none.argmax_only());
  EXPECT_EQ(pick(none, {1, 3, 2}), 1);
  g.logit_bias = {{1, -100.0f}};
  Sampler down(g, 3);
  EXPECT_FALSE(down.argmax_only());
  EXPECT_EQ(pick(down, {1, 3, 2}), 2);
  g.logit_bias = {{0, 100.0f}};
  Sampler up(g, 3);
  EXPECT_EQ(pick(up, {1, 3, 2}), 0);
  // Entries for one token add up (llama.cpp applies each).
  g.logit_bias = {{0, 1.5f}, {0, 1.5f}};
  Sampler twice(g, 3);
  EXPECT_EQ(pick(twice, {1, 3, 2}), 0);
}

TEST(SamplerLogitBias, MinusInfinityBansTheToken) {
  SamplerParams p = plain();
  p.logit_bias = {{1, -std::numeric_limits<float>::infinity()}};
  Sampler s(p, 3);
  for (int i = 0; i < 2000; ++i) EXPECT_NE(pick(s, {0, 5, 0}), 1);
}

// ---- typical ----

// p = {1/2, 1/4, 1/8, 1/8}: entropy H = 1.75 ln 2; surprises -ln p = {1, 2, 3, 3} ln 2, so |-ln p - H| =
// {0.75, 0.25, 1.25, 1.25} ln 2 and the typical order is 1, 0, 2, 3 (2 and 3 tie: the lower id first) with
// cumulative mass 1/4, 3/4, 7/8, 1.
TEST(SamplerTypical, KeepsTheMostTypicalTokensUpToTheMass) {
  const std::vector<float> l = log_probs({0.5, 0.25, 0.125, 0.125});
  SamplerParams p = plain();
  p.typical_p = 0.5f;  // 3/4 is the first mass above 0.5
  Sampler s(p, 4);
  auto c = cands(s, l);
  EXPECT_EQ(ids(c), (std::set<int32_t>{0, 1}));
  EXPECT_NEAR(prob_of(c, 0), 2.0 / 3.0, 1e-5);  // renormalized over the kept tokens
  EXPECT_NEAR(prob_of(c, 1), 1.0 / 3.0, 1e-5);
  p.typical_p = 0.2f;  // 1/4 > 0.2: the most typical token alone, not the most likely
  Sampler one(p, 4);
  EXPECT_EQ(ids(cands(one, l)), (std::set<int32_t>{1}));
  p.typical_p = 0.8f;  // 7/8: token 2 before token 3
  Sampler three(p, 4);
  EXPECT_EQ(ids(cands(three, l)), (std::set<int32_t>{0, 1, 2}));
  p.typical_p = 1.0f;  // off
  Sampler off(p, 4);
  EXPECT_EQ(ids(cands(off, l)).size(), 4u);
}

TEST(SamplerTypical, GreedyTakesTheBestOfTheTypicalSet) {
  const std::vector<float> l = log_probs({0.5, 0.25, 0.125, 0.125});
  SamplerParams p = plain(0);
  p.typical_p = 0.2f;
  Sampler s(p, 4);
  EXPECT_FALSE(s.argmax_only());
  EXPECT_EQ(s.sample(l), 1);  // the argmax 0 is not in the typical set {1}
}

// ---- XTC ----

TEST(SamplerXtc, RemovesEveryTopChoiceButTheLeastProbable) {
  const std::vector<float> l = log_probs({0.4, 0.3, 0.2, 0.1});
  SamplerParams p = plain();
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.15f;  // 0, 1, 2 qualify: 0 and 1 go, 2 stays
  Sampler s(p, 4);
  auto c = cands(s, l);
  EXPECT_EQ(ids(c), (std::set<int32_t>{2, 3}));
  EXPECT_NEAR(prob_of(c, 2), 2.0 / 3.0, 1e-5);
  p.xtc_threshold = 0.35f;  // only token 0 qualifies: nothing to remove
  Sampler one(p, 4);
  EXPECT_EQ(ids(cands(one, l)).size(), 4u);
  p.xtc_threshold = 0.25f;  // 0 and 1 qualify: 0 goes
  Sampler two(p, 4);
  EXPECT_EQ(ids(cands(two, l)), (std::set<int32_t>{1, 2, 3}));
  p.xtc_threshold = 0.6f;  // > 0.5: off
  Sampler off(p, 4);
  EXPECT_EQ(ids(cands(off, l)).size(), 4u);
  p.xtc_threshold = 0.15f;
  p.xtc_probability = 0.0f;  // off
  Sampler never(p, 4);
  EXPECT_EQ(ids(cands(never, l)).size(), 4u);
}

TEST(SamplerXtc, AppliesWithItsProbabilityAndIsSeeded) {
  const std::vector<float> l = log_probs({0.4, 0.3, 0.2, 0.1});
  SamplerParams p = plain();
  p.xtc_probability = 0.5f;
  p.xtc_threshold = 0.15f;
  Sampler s(p, 4);
  int applied = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) applied += cands(s, l).size() == 2 ? 1 : 0;
  EXPECT_NEAR(applied / double(n), 0.5, 0.04);
  // Same seed, same draws (XTC's own and the token draw); reset() starts both over.
  Sampler a(p, 4), b(p, 4);
  std::vector<int32_t> ra, rb;
  for (int i = 0; i < 200; ++i) ra.push_back(a.sample(l)), rb.push_back(b.sample(l));
  EXPECT_EQ(ra, rb);
  a.reset();
  std::vector<int32_t> again;
  for (int i = 0; i < 200; ++i) again.push_back(a.sample(l));
  EXPECT_EQ(again, ra);
  // Greedy: the top token is removed when XTC applies.
  SamplerParams g = plain(0);
  g.xtc_probability = 1.0f;
  g.xtc_threshold = 0.15f;
  Sampler gs(g, 4);
  EXPECT_EQ(gs.sample(l), 2);
}

// ---- DRY ----

SamplerParams dry(int32_t allowed = 2) {
  SamplerParams p = plain();
  p.dry_multiplier = 0.8f;
  p.dry_base = 1.75f;
  p.dry_allowed_length = allowed;
  p.dry_penalty_last_n = -1;
  return p;
}

// log(p[a] / p[b]) under the sampler's candidates (temperature 1, no truncation): the logit difference.
double log_ratio(Sampler& s, const std::vector<float>& l, int32_t a, int32_t b) {
  auto c = cands(s, l);
  return std::log(static_cast<double>(prob_of(c, a)) / prob_of(c, b));
}

TEST(SamplerDry, PenalizesTheTokenThatExtendsARepetition) {
  // Context 1 2 3 4 5 1 2 3: the end "1 2 3" occurred before, followed by 4. Emitting 4 repeats 3 tokens:
  // 0.8 * 1.75^(3 - 2) = 1.4 off its logit; no other token extends a repetition of 2 or more.
  const std::vector<float> zeros(10, 0.0f);
  Sampler s(dry(), 10);
  for (int32_t t : {1, 2, 3, 4, 5, 1, 2, 3}) s.accept(t);
  EXPECT_NEAR(log_ratio(s, zeros, 4, 0), -1.4, 1e-5);
  for (int32_t t : {0, 1, 2, 3, 5, 6})
    EXPECT_NEAR(log_ratio(s, zeros, t, 0), 0.0, 1e-6) << t;
  // allowed_length 3: 0.8 * 1.75^0; allowed_length 4: the repetition is allowed.
  Sampler a3(dry(3), 10), a4(dry(4), 10);
  for (int32_t t : {1, 2, 3, 4, 5, 1, 2, 3}) a3.accept(t), a4.accept(t);
  EXPECT_NEAR(log_ratio(a3, zeros, 4, 0), -0.8, 1e-5);
  EXPECT_NEAR(log_ratio(a4, zeros, 4, 0), 0.0, 1e-6);
}

TEST(SamplerDry, TheLongestRepetitionCounts) {
  // 1 2 3 4 1 2 3 4 1 2 3: emitting 4 repeats the last 7 tokens (1 2 3 4 1 2 3 at 0..6, followed by 4).
  const std::vector<float> zeros(10, 0.0f);
  Sampler s(dry(), 10);
  for (int32_t t : {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3}) s.accept(t);
  EXPECT_NEAR(log_ratio(s, zeros, 4, 0), -0.8 * std::pow(1.75, 5), 1e-4);
  // dry_penalty_last_n 5: the window 3 4 1 2 3 holds one earlier "3" (followed by 4) and no earlier "2 3".
  SamplerParams w = dry(1);
  w.dry_penalty_last_n = 5;
  Sampler win(w, 10);
  for (int32_t t : {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3}) win.accept(t);
  EXPECT_NEAR(log_ratio(win, zeros, 4, 0), -0.8, 1e-5);  // L = 1, allowed 1: 0.8 * 1.75^0
}

TEST(SamplerDry, SequenceBreakersCutTheRepetition) {
  const std::vector<float> zeros(10, 0.0f);
  const std::vector<int32_t> ctx = {8, 1, 2, 3, 9, 8, 1, 2, 3};
  // Without breakers: "8 1 2 3" repeats, followed by 9: 0.8 * 1.75^(4 - 2).
  Sampler free(dry(), 10);
  for (int32_t t : ctx) free.accept(t);
  EXPECT_NEAR(log_ratio(free, zeros, 9, 0), -0.8 * 1.75 * 1.75, 1e-4);
  // 8 a breaker: a repetition starts after its last occurrence (1 2 3, 3 tokens): 0.8 * 1.75.
  SamplerParams p = dry();
  p.dry_breakers = std::make_shared<const DryBreakers>(std::vector<std::vector<int32_t>>{{8}});
  Sampler cut(p, 10);
  for (int32_t t : ctx) cut.accept(t);
  EXPECT_NEAR(log_ratio(cut, zeros, 9, 0), -1.4, 1e-5);
  // A two-token breaker (2, 3) ends the context: nothing is left to repeat.
  p.dry_breakers = std::make_shared<const DryBreakers>(std::vector<std::vector<int32_t>>{{2, 3}});
  Sampler two(p, 10);
  for (int32_t t : ctx) two.accept(t);
  EXPECT_NEAR(log_ratio(two, zeros, 9, 0), 0.0, 1e-6);
  // (2, 5) never occurs: no cut.
  p.dry_breakers = std::make_shared<const DryBreakers>(std::vector<std::vector<int32_t>>{{2, 5}});
  Sampler miss(p, 10);
  for (int32_t t : ctx) miss.accept(t);
  EXPECT_NEAR(log_ratio(miss, zeros, 9, 0), -0.8 * 1.75 * 1.75, 1e-4);
}

TEST(SamplerDry, ABreakerTokenIsNeverPenalized) {
  // 1 2 9 3 1 2: "1 2" repeats, followed by 9 (L = 2 >= 2): penalized unless 9 is a breaker.
  const std::vector<float> zeros(10, 0.0f);
  Sampler plain_dry(dry(), 10);
  for (int32_t t : {1, 2, 9, 3, 1, 2}) plain_dry.accept(t);
  EXPECT_NEAR(log_ratio(plain_dry, zeros, 9, 0), -0.8, 1e-5);
  SamplerParams p = dry();
  p.dry_breakers = std::make_shared<const DryBreakers>(std::vector<std::vector<int32_t>>{{9}});
  Sampler s(p, 10);
  for (int32_t t : {1, 2, 9, 3, 1, 2}) s.accept(t);
  EXPECT_NEAR(log_ratio(s, zeros, 9, 0), 0.0, 1e-6);
}

TEST(SamplerDry, HugeRepetitionsStayFinite) {
  SamplerParams p = dry(0);
  p.dry_base = 3.0f;
  Sampler s(p, 4);
  for (int i = 0; i < 400; ++i) s.accept(1);  // 1 1 1 ...: emitting 1 repeats 399 tokens
  auto c = cands(s, {0, 0, 0, 0});
  EXPECT_GT(prob_of(c, 0), 0.0f);
  EXPECT_TRUE(std::isfinite(prob_of(c, 1)));
  EXPECT_LT(prob_of(c, 1), 1e-30);
  // The exponent is capped at log(FLT_MAX) / log(base): the penalty is finite.
  EXPECT_TRUE(std::isfinite(dry_penalty(0.8f, 3.0f, 0, 399)));
  EXPECT_NEAR(dry_penalty(0.8f, 1.75f, 2, 5), 0.8 * std::pow(1.75, 3), 1e-4);
}

// ---- the chain ----

TEST(SamplerChain, BiasThenPenaltiesThenDry) {
  // Token 1 (logit 1) was seen once; repeat_penalty 2, bias -3: bias first gives (1 - 3) * 2 = -4 (penalties
  // first would give 0.5 - 3 = -2.5).
  SamplerParams p = plain();
  p.repeat_penalty = 2.0f;
  p.logit_bias = {{1, -3.0f}};
  Sampler s(p, 3);
  s.accept(1);
  EXPECT_NEAR(log_ratio(s, {0, 1, 0}, 1, 0), -4.0, 1e-5);
  // Penalties then DRY: context 5 6 7 5 6, token 7 (logit 2) repeats "5 6": 2 / 2 - 0.8 = 0.2 (DRY first would
  // give (2 - 0.8) / 2 = 0.6).
  SamplerParams q = dry();
  q.repeat_penalty = 2.0f;
  Sampler t(q, 10);
  for (int32_t x : {5, 6, 7, 5, 6}) t.accept(x);
  std::vector<float> l(10, 0.0f);
  l[7] = 2.0f;
  EXPECT_NEAR(log_ratio(t, l, 7, 0), 0.2, 1e-5);
}

TEST(SamplerChain, TopKThenXtc) {
  // top-k 3 on {0.4, 0.3, 0.2, 0.1} leaves {0.4, 0.3, 0.2} / 0.9; XTC at 0.25 then removes 0 (0.44) and keeps 1.
  SamplerParams p = plain();
  p.top_k = 3;
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.25f;
  Sampler s(p, 4);
  EXPECT_EQ(ids(cands(s, log_probs({0.4, 0.3, 0.2, 0.1}))), (std::set<int32_t>{1, 2}));
}

TEST(SamplerChain, SeededRunsRepeatWithEveryStageOn) {
  const int nv = 50;
  std::vector<float> l(nv);
  for (int i = 0; i < nv; ++i) l[i] = std::sin(i * 0.7f) * 2;
  SamplerParams p = dry();
  p.top_k = 20;
  p.typical_p = 0.9f;
  p.top_p = 0.95f;
  p.xtc_probability = 0.5f;
  p.logit_bias = {{3, 1.0f}, {4, -std::numeric_limits<float>::infinity()}};
  p.dry_breakers = std::make_shared<const DryBreakers>(std::vector<std::vector<int32_t>>{{7}});
  auto run = [&](Sampler& s) {
    std::vector<int32_t> out;
    for (int i = 0; i < 300; ++i) {
      const int32_t t = s.sample(l);
      out.push_back(t);
      s.accept(t);
    }
    return out;
  };
  Sampler a(p, nv), b(p, nv);
  const std::vector<int32_t> ra = run(a);
  EXPECT_EQ(ra, run(b));
  for (int32_t t : ra) EXPECT_NE(t, 4);
  a.reset();
  EXPECT_EQ(run(a), ra);
}

TEST(SamplerChain, HistoryWindowCoversPenaltiesAndDry) {
  SamplerParams p = plain();
  EXPECT_EQ(Sampler(p, 4).history_window(), 0);  // nothing reads the history
  p.repeat_penalty = 1.1f;
  EXPECT_EQ(Sampler(p, 4).history_window(), 64);
  p.dry_multiplier = 0.8f;  // dry_penalty_last_n -1: the whole context
  EXPECT_EQ(Sampler(p, 4).history_window(), -1);
  p.dry_penalty_last_n = 200;
  EXPECT_EQ(Sampler(p, 4).history_window(), 200);
}

TEST(SamplerChain, NoAllocationPerCall) {
  const int nv = 5000;
  std::vector<float> l(nv);
  for (int i = 0; i < nv; ++i) l[i] = std::sin(i * 0.37f) * 4;
  for (int mode = 0; mode < 4; ++mode) {
    SamplerParams p;
    p.seed = 5;
    p.logit_bias = {{10, 2.0f}, {11, -1.0f}};
    p.dry_multiplier = 0.8f;
    p.dry_penalty_last_n = 256;
    p.dry_breakers = std::make_shared<const DryBreakers>(std::vector<std::vector<int32_t>>{{3}, {5, 6}});
    if (mode == 1) p.typical_p = 0.9f;
    if (mode == 2) p.xtc_probability = 0.7f, p.top_k = 0;
    if (mode == 3) p.temp = 0, p.typical_p = 0.95f;
    Sampler s(p, nv);
    for (int i = 0; i < 600; ++i) s.accept(i * 7 % 40);  // repetitive, and past the window
    g_allocs = 0;
    g_count_allocs = true;
    for (int i = 0; i < 100; ++i) s.accept(s.sample(l));
    g_count_allocs = false;
    EXPECT_EQ(g_allocs.load(), 0) << "mode " << mode;
  }
}

TEST(SamplerChain, ValidateNamesTheParameter) {
  auto bad = [](auto set, const char* name) {
    SamplerParams p;
    set(p);
    Status st = Sampler(p, 10).validate();
    EXPECT_FALSE(st.is_ok()) << name;
    EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
  };
  bad([](SamplerParams& p) { p.typical_p = NAN; }, "typical_p");
  bad([](SamplerParams& p) { p.xtc_probability = 1.5f; }, "xtc_probability");
  bad([](SamplerParams& p) { p.xtc_threshold = -0.1f; }, "xtc_threshold");
  bad([](SamplerParams& p) { p.dry_multiplier = -1; }, "dry_multiplier");
  bad([](SamplerParams& p) { p.dry_base = 0.5f; }, "dry_base");
  bad([](SamplerParams& p) { p.dry_allowed_length = -1; }, "dry_allowed_length");
  bad([](SamplerParams& p) { p.dry_penalty_last_n = -2; }, "dry_penalty_last_n");
  bad([](SamplerParams& p) { p.dry_sequence_breakers = {"a", ""}; }, "dry_sequence_breakers");
  bad([](SamplerParams& p) { p.mirostat = 3; }, "mirostat");
  bad([](SamplerParams& p) { p.mirostat_tau = -1; }, "mirostat_tau");
  bad([](SamplerParams& p) { p.mirostat_eta = NAN; }, "mirostat_eta");
  bad([](SamplerParams& p) { p.logit_bias = {{10, 1.0f}}; }, "logit_bias");
  bad([](SamplerParams& p) { p.logit_bias = {{1, NAN}}; }, "logit_bias");
  bad([](SamplerParams& p) { p.logit_bias = {{1, std::numeric_limits<float>::infinity()}}; }, "logit_bias");
  SamplerParams ok;
  ok.logit_bias = {{9, -std::numeric_limits<float>::infinity()}};
  EXPECT_TRUE(Sampler(ok, 10).validate().is_ok());
}

// ---- the device argmax ----

std::unique_ptr<Tokenizer> load_vocab(const std::string& name);

// A greedy sequence takes the backend's argmax (the logits row stays on the device) only while its sampler does
// nothing but take the argmax: a logit bias, penalties, DRY, typical or XTC make it fetch the row and sample here.
TEST(SamplerChain, OnlyAPlainGreedySequenceTakesTheDeviceArgmax) {
  auto tok = load_vocab("gpt-2");
  ASSERT_TRUE(tok);
  KvCacheConfig kc;
  kc.n_ctx = 256;
  kc.block_size = 16;
  kc.max_seqs = 1;
  auto cache = KvCache::create(kc);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto kind = [&](SamplerParams sp) {
    SequenceOptions o;
    o.sampling = sp;
    Sequence seq(0, *tok, tok->n_vocab(), 256, o, **cache);
    const std::vector<int32_t> ctx = {11, 12, 13, 14, 11, 12, 13};  // "11 12 13" repeats: DRY has work
    EXPECT_TRUE(seq.append(ctx).is_ok());
    return seq.output_kind();
  };
  const SamplerParams g = plain(0);
  EXPECT_EQ(kind(g), OutputKind::kArgmax);
  SamplerParams b = g;
  b.logit_bias = {{5, 1.0f}};
  EXPECT_EQ(kind(b), OutputKind::kLogits);
  SamplerParams d = g;
  d.dry_multiplier = 0.8f;
  EXPECT_EQ(kind(d), OutputKind::kLogits);
  SamplerParams t = g;
  t.typical_p = 0.9f;
  EXPECT_EQ(kind(t), OutputKind::kLogits);
  SamplerParams x = g;
  x.xtc_probability = 0.5f;
  EXPECT_EQ(kind(x), OutputKind::kLogits);
  x.xtc_threshold = 0.6f;  // XTC off
  EXPECT_EQ(kind(x), OutputKind::kArgmax);
  SamplerParams r = g;
  r.repeat_penalty = 1.1f;
  EXPECT_EQ(kind(r), OutputKind::kLogits);
  // Mirostat's chain has no penalties: greedy mirostat takes the argmax (unless a bias moves the logits).
  r.mirostat = 2;
  EXPECT_EQ(kind(r), OutputKind::kArgmax);
  r.logit_bias = {{5, 1.0f}};
  EXPECT_EQ(kind(r), OutputKind::kLogits);
}

// ---- mirostat ----
// Probabilities 8/15, 4/15, 2/15, 1/15: surprises -log2 p = 0.907, 1.907, 2.907, 3.907 bits. Mirostat 1's Zipf fit
// over the 3 ratios (each ln 2): t_i = ln 2, ln 1.5, ln 4/3, s = ln 2 * ln 4 / sum t_i^2 = 1.32062; e = 0.32062;
// with n_vocab 4: k(mu) = (e * 2^mu / (1 - 4^-e))^(1 / s): k(2) = 2.623, k(4) = 7.49.

const std::vector<float> kZipf = log_probs({8.0 / 15, 4.0 / 15, 2.0 / 15, 1.0 / 15});

SamplerParams mirostat(int version, float tau, float eta = 0.1f, float temp = 1.0f) {
  SamplerParams p = plain(temp);
  p.mirostat = version;
  p.mirostat_tau = tau;
  p.mirostat_eta = eta;
  return p;
}

TEST(SamplerMirostat, V1KeepsTheTopKOfTheZipfFit) {
  Sampler a(mirostat(1, 1.0f), 4);  // mu = 2: k = 2.62, the top 2
  EXPECT_FLOAT_EQ(a.mirostat_mu(), 2.0f);
  auto c = cands(a, kZipf);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 0);
  EXPECT_NEAR(c[0].p, 2.0 / 3, 1e-6);
  EXPECT_NEAR(c[1].p, 1.0 / 3, 1e-6);
  Sampler b(mirostat(1, 2.0f), 4);  // mu = 4: k = 7.5 >= n_vocab, every token
  c = cands(b, kZipf);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_NEAR(prob_of(c, 3), 1.0 / 15, 1e-6);
  // n_vocab enters k: with 1000 tokens (the rest at -inf, left out of the fit) 1 - n^-e grows, k(2) = 1.32: one token.
  std::vector<float> wide(1000, -std::numeric_limits<float>::infinity());
  std::copy(kZipf.begin(), kZipf.end(), wide.begin());
  Sampler w(mirostat(1, 1.0f), 1000);
  EXPECT_EQ(ids(cands(w, wide)), (std::set<int32_t>{0}));
}

TEST(SamplerMirostat, V2KeepsTheTokensWithinTheSurpriseBudget) {
  Sampler two(mirostat(2, 1.25f), 4), three(mirostat(2, 1.5f), 4);  // mu = 2.5, 3
  EXPECT_EQ(ids(cands(two, kZipf)), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(ids(cands(three, kZipf)), (std::set<int32_t>{0, 1, 2}));
  // mu = 0.5 < 0.907: not even the top token qualifies; it is kept alone.
  Sampler z(mirostat(2, 0.25f), 4);
  auto c = cands(z, kZipf);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 0);
  EXPECT_FLOAT_EQ(c[0].p, 1.0f);
  // Temperature comes first: at 0.5 the probabilities are 64, 16, 4, 1 / 85 and mu = 2.5 keeps 0.8 and 0.2.
  Sampler t(mirostat(2, 1.25f, 0.1f, 0.5f), 4);
  c = cands(t, kZipf);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[0].p, 0.8, 1e-6);
  EXPECT_NEAR(c[1].p, 0.2, 1e-6);
}

// mu -= eta * (-log2 p(drawn) - tau), p among the kept candidates.
TEST(SamplerMirostat, MuMovesByTheObservedSurprise) {
  for (int version : {1, 2}) {
    SCOPED_TRACE(version);
    const float tau = version == 1 ? 1.0f : 1.25f;  // both keep {2/3, 1/3} at mu = 2 * tau
    Sampler s(mirostat(version, tau, 0.1f), 4);
    const int32_t t = s.sample(kZipf);
    ASSERT_TRUE(t == 0 || t == 1) << t;
    const double p = t == 0 ? 2.0 / 3 : 1.0 / 3;
    EXPECT_NEAR(s.mirostat_mu(), 2 * tau - 0.1 * (-std::log2(p) - tau), 1e-5);
    // Further draws follow the rule with the candidates of the mu they start from.
    for (int i = 0; i < 20; ++i) {
      const float mu = s.mirostat_mu();
      auto c = cands(s, kZipf);
      const int32_t u = s.sample(kZipf);
      const float q = prob_of(c, u);
      ASSERT_GT(q, 0.0f) << "drawn outside the candidates";
      EXPECT_NEAR(s.mirostat_mu(), mu - 0.1 * (-std::log2(q) - tau), 1e-5);
    }
  }
  // Greedy mirostat: the argmax, whose surprise is 0.
  Sampler g(mirostat(2, 3.0f, 0.5f, 0.0f), 4);
  EXPECT_EQ(g.sample(kZipf), 0);
  EXPECT_FLOAT_EQ(g.mirostat_mu(), 6.0f + 0.5f * 3.0f);
}

TEST(SamplerMirostat, ReplacesTheTruncationsAndThePenalties) {
  SamplerParams p = mirostat(2, 1.25f);
  p.top_k = 1;
  p.top_p = 0.1f;
  p.min_p = 0.9f;
  p.typical_p = 0.1f;
  p.xtc_probability = 1.0f;
  p.repeat_penalty = 5.0f;
  p.presence_penalty = 3.0f;
  p.dry_multiplier = 2.0f;
  Sampler s(p, 4);
  EXPECT_EQ(s.history_window(), 0);
  for (int32_t t : {0, 0, 1, 0, 1}) s.accept(t);
  auto c = cands(s, kZipf);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[0].p, 2.0 / 3, 1e-6);
  // The logit bias still comes first: +ln 8 on token 3 makes the probabilities 8, 4, 2, 8 / 22, surprises 1.46,
  // 2.46, 3.46, 1.46 bits: mu = 2.5 keeps tokens 0, 3 and 1.
  p.logit_bias = {{3, std::log(8.0f)}};
  Sampler b(p, 4);
  c = cands(b, kZipf);
  EXPECT_EQ(ids(c), (std::set<int32_t>{0, 1, 3}));
  EXPECT_NEAR(prob_of(c, 3), 8.0 / 20, 1e-6);
}

TEST(SamplerMirostat, SeededRunsRepeatAndResetRestartsMu) {
  std::vector<float> flat(64);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = -0.05f * static_cast<float>(i);
  for (int version : {1, 2}) {
    SCOPED_TRACE(version);
    auto run = [&](Sampler& s) {
      std::vector<int32_t> out;
      for (int i = 0; i < 40; ++i) out.push_back(s.sample(flat));
      return out;
    };
    SamplerParams p = mirostat(version, 4.0f, 0.2f);
    p.seed = 1234;
    Sampler a(p, 64), b(p, 64);
    const std::vector<int32_t> ra = run(a);
    EXPECT_EQ(ra, run(b));
    EXPECT_EQ(a.mirostat_mu(), b.mirostat_mu());
    EXPECT_NE(a.mirostat_mu(), 8.0f);
    EXPECT_GT(std::set<int32_t>(ra.begin(), ra.end()).size(), 3u);
    a.reset();
    EXPECT_FLOAT_EQ(a.mirostat_mu(), 8.0f);
    EXPECT_EQ(run(a), ra);
    p.seed = 99;
    Sampler c(p, 64);
    EXPECT_NE(run(c), ra);
  }
}

// ---- DRY's breakers for a vocabulary ----

std::unique_ptr<Tokenizer> load_vocab(const std::string& name) {
  auto f = gguf::File::open(test::vocab_path(name));
  if (!f) return nullptr;
  auto t = Tokenizer::from_gguf(*f);
  return t ? std::move(t).value() : nullptr;
}

TEST(DryBreakers, ForAVocabulary) {
  auto tok = load_vocab("gpt-2");
  ASSERT_TRUE(tok);
  // "\n": exactly the tokens whose text contains a newline are breakers alone.
  const DryBreakers nl = DryBreakers::for_vocabulary(*tok, {"\n"});
  int n_single = 0;
  for (int32_t id = 0; id < tok->n_vocab(); ++id) {
    const bool has = tok->token_to_piece(id, true).find('\n') != std::string::npos;
    EXPECT_EQ(nl.single(id), has) << id;
    n_single += has ? 1 : 0;
  }
  EXPECT_GT(n_single, 0);
  EXPECT_EQ(nl.entries().size(), static_cast<size_t>(n_single));
  // " hello world": the token " hello" ends with a prefix of it and heads (" hello", encode(" world")).
  const std::vector<int32_t> hello = tok->encode(" hello", false, false);
  ASSERT_EQ(hello.size(), 1u);
  const DryBreakers hw = DryBreakers::for_vocabulary(*tok, {" hello world"});
  EXPECT_FALSE(hw.single(hello[0]));
  const std::vector<int32_t> world = tok->encode(" world", false, false);
  bool found = false;
  auto [b, e] = hw.headed_by(hello[0]);
  for (size_t k = b; k < e; ++k) found = found || hw.entries()[k].second == world;
  EXPECT_TRUE(found);
  // Cut to 40 bytes as llama.cpp: a longer breaker behaves as its first 40 bytes.
  const std::string long_b = " hello world" + std::string(60, 'x');
  EXPECT_EQ(DryBreakers::for_vocabulary(*tok, {long_b}).entries(),
            DryBreakers::for_vocabulary(*tok, {long_b.substr(0, 40)}).entries());
}

}  // namespace
}  // namespace kiln
