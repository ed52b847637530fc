// The engine loop (runtime/scheduler.h) and the prefix cache of the block manager (runtime/kv_cache.h): many
// sequences in one step give the outputs of each request run alone (greedy and seeded); the token budget holds
// every step and decode tokens go first; admission waits for slots and blocks; a pool too small for everyone
// preempts and recomputes without changing outputs; a shared prefix is attached, not recomputed; cancel frees the
// blocks; stop strings cut the text.
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

std::string demo_model() { return std::string(KILN_SOURCE_DIR) + "/models/kiln-demo.gguf"; }

std::unique_ptr<Model> load_model(const std::string& path) {
  LoadOptions lo;
  lo.devices.device = "cpu";
  lo.devices.backend.n_threads = 1;
  auto m = Model::load(path, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m ? std::move(m).value() : nullptr;
}

// Prompts of different lengths from the demo model's text.
std::vector<std::vector<int32_t>> prompts(const Tokenizer& tok, int n) {
  const char* texts[] = {"And God said unto Moses,",
                         "In the beginning God created the heaven and the earth. And the earth was without form,",
                         "The LORD is my shepherd;",
                         "And it came to pass",
                         "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they",
                         "Then Jesus",
                         "And Abraham",
                         "For God so loved the world, that he gave"};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) out.push_back(tok.encode(texts[i % 8], true, false));
  return out;
}

SamplerParams greedy_params() {
  SamplerParams p;
  p.temp = 0;
  return p;
}

// The reference: each prompt alone, one request at a time through a one-sequence engine loop (what `kiln run`
// does).
std::vector<std::vector<int32_t>> reference(const std::vector<std::vector<int32_t>>& ps, int n_predict,
                                            SamplerParams sp = greedy_params()) {
  auto s = test::make_scheduler(demo_model(), test::one_sequence(512));
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : ps) {
    GenRequest r = test::greedy_request(p, n_predict);
    r.sampling = sp;
    test::Generated g = test::generate(*s, r);
    EXPECT_TRUE(g.error.is_ok()) << g.error.to_string();
    out.push_back(g.ids);
  }
  return out;
}

std::unique_ptr<Scheduler> make_sched(EngineConfig cfg) {
  auto m = load_model(demo_model());
  if (!m) return nullptr;
  auto s = Scheduler::create(std::move(m), cfg);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s ? std::move(s).value() : nullptr;
}

std::vector<int32_t> ids_of(const std::vector<TokenEvent>& evs) {
  std::vector<int32_t> ids;
  for (auto& e : evs)
    if (e.id >= 0) ids.push_back(e.id);
  return ids;
}

GenRequest request(const std::vector<int32_t>& p, int n, SamplerParams sp = greedy_params()) {
  GenRequest r;
  r.prompt = p;
  r.max_new_tokens = n;
  r.ignore_eos = true;
  r.sampling = sp;
  return r;
}

struct RunResult {
  std::vector<std::vector<int32_t>> ids;
  std::vector<RequestTimings> timings;
  std::vector<FinishReason> reasons;
  std::vector<StepInfo> steps;
};

RunResult run_all(Scheduler& s, const std::vector<GenRequest>& reqs) {
  RunResult r;
  std::mutex mu;
  s.set_step_observer([&](const StepInfo& i) {
    std::lock_guard<std::mutex> lk(mu);
    r.steps.push_back(i);
  });
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& q : reqs) {
    auto h = s.submit(q);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  s.start();
  for (auto& h : hs) {
    r.ids.push_back(ids_of(h->wait_all()));
    r.timings.push_back(h->timings());
    r.reasons.push_back(h->finish_reason());
    EXPECT_TRUE(h->error().is_ok()) << h->error().to_string();
  }
  EXPECT_TRUE(s.wait_idle(std::chrono::seconds(10)));
  s.set_step_observer(nullptr);
  return r;
}

TEST(Scheduler, GreedyEqualsAloneWithBudgetAndChunks) {
  auto m0 = load_model(demo_model());
  ASSERT_TRUE(m0);
  auto ps = prompts(m0->tokenizer(), 8);
  const int n = 24;
  auto want = reference(ps, n);
  EngineConfig cfg;
  cfg.max_seqs = 4;
  cfg.batch_tokens = 16;  // prompts go in chunks, mixed with decode tokens
  cfg.n_ctx = 1024;
  cfg.start = false;
  auto s = make_sched(cfg);
  ASSERT_TRUE(s);
  std::vector<GenRequest> reqs;
  for (auto& p : ps) reqs.push_back(request(p, n));
  RunResult r = run_all(*s, reqs);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(r.ids[i], want[i]) << "request " << i;
    EXPECT_EQ(r.reasons[i], FinishReason::kLength);
    EXPECT_EQ(r.timings[i].n_gen, n);
  }
  bool mixed = false;
  int max_seqs = 0;
  for (auto& st : r.steps) {
    EXPECT_LE(st.n_tokens, 16);
    EXPECT_LE(st.n_seqs, 4);
    max_seqs = std::max(max_seqs, st.n_seqs);
    mixed |= st.n_decode > 0 && st.n_prefill_tokens > 0;
  }
  EXPECT_EQ(max_seqs, 4);
  EXPECT_TRUE(mixed) << "no step mixed decode tokens with a prompt chunk";
  auto stats = s->stats();
  EXPECT_EQ(stats.generated_tokens, 8u * n);
  EXPECT_EQ(stats.finished[static_cast<int>(FinishReason::kLength)], 8u);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

// Seeded sampling: each request has its own sampler; sampling in parallel changes nothing.
TEST(Scheduler, SeededSamplingEqualsAlone) {
  auto m0 = load_model(demo_model());
  ASSERT_TRUE(m0);
  auto ps = prompts(m0->tokenizer(), 4);
  SamplerParams sp;
  sp.temp = 0.9f;
  sp.seed = 1234;
  sp.repeat_penalty = 1.1f;
  auto want = reference(ps, 16, sp);
  EngineConfig cfg;
  cfg.max_seqs = 4;
  cfg.n_ctx = 1024;
  cfg.start = false;
  cfg.sampling_threads = 2;
  auto s = make_sched(cfg);
  ASSERT_TRUE(s);
  std::vector<GenRequest> reqs;
  for (auto& p : ps) reqs.push_back(request(p, 16, sp));
  RunResult r = run_all(*s, reqs);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(r.ids[i], want[i]) << "request " << i;
}

// A pool too small for all sequences at once: admission waits, decodes preempt the newest sequence, which is
// recomputed later; the outputs do not change.
TEST(Scheduler, PreemptionKeepsOutputs) {
  auto m0 = load_model(demo_model());
  ASSERT_TRUE(m0);
  auto ps = prompts(m0->tokenizer(), 6);
  const int n = 40;
  auto want = reference(ps, n);
  for (bool prefix : {true, false}) {
    SCOPED_TRACE(prefix ? "prefix cache" : "no prefix cache");
    EngineConfig cfg;
    cfg.max_seqs = 4;
    cfg.n_ctx = 160;  // 10 blocks; 4 sequences of ~50-60 tokens need 16
    cfg.prefix_cache = prefix;
    cfg.start = false;
    auto s = make_sched(cfg);
    ASSERT_TRUE(s);
    std::vector<GenRequest> reqs;
    for (auto& p : ps) reqs.push_back(request(p, n));
    RunResult r = run_all(*s, reqs);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(r.ids[i], want[i]) << "request " << i;
    auto stats = s->stats();
    EXPECT_GT(stats.preemptions, 0u);
    int preempted = 0;
    for (auto& t : r.timings) preempted += t.n_preempted;
    EXPECT_EQ(static_cast<uint64_t>(preempted), stats.preemptions);
    EXPECT_EQ(stats.kv_blocks_used, 0);
  }
}

TEST(Scheduler, PrefixCacheAttachesSharedPrefix) {
  auto m0 = load_model(demo_model());
  ASSERT_TRUE(m0);
  const Tokenizer& tok = m0->tokenizer();
  std::vector<int32_t> base = tok.encode(
      "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
      "darkness was upon the face of the deep.", true, false);
  ASSERT_GE(base.size(), 34u);
  base.resize(34);  // two full blocks and two tokens
  std::vector<int32_t> other = base;
  other.resize(32);
  for (int32_t t : tok.encode(" And the Spirit of God moved", false, false)) other.push_back(t);
  std::vector<int32_t> exact48 = base;
  for (int32_t t : tok.encode(" upon the face of the waters and God said let there be light", false, false))
    exact48.push_back(t);
  exact48.resize(48);  // three full blocks: all cached the second time, the last token is recomputed (COW)
  auto want = reference({base, other, exact48}, 8);
  for (bool prefix : {true, false}) {
    SCOPED_TRACE(prefix ? "prefix cache" : "no prefix cache");
    EngineConfig cfg;
    cfg.max_seqs = 2;
    cfg.n_ctx = 512;
    cfg.prefix_cache = prefix;
    auto s = make_sched(cfg);
    ASSERT_TRUE(s);
    auto one = [&](const std::vector<int32_t>& p) {
      auto h = s->submit(request(p, 8));
      EXPECT_TRUE(h.is_ok());
      auto ids = ids_of((*h)->wait_all());
      return std::make_pair(ids, (*h)->timings());
    };
    auto [a, ta] = one(base);
    EXPECT_EQ(a, want[0]);
    EXPECT_EQ(ta.n_cached, 0);
    auto [b, tb] = one(other);
    EXPECT_EQ(b, want[1]);
    EXPECT_EQ(tb.n_cached, prefix ? 32 : 0);
    auto [c, tc] = one(exact48);
    EXPECT_EQ(c, want[2]);
    auto [d, td] = one(exact48);  // all three blocks cached: 47 attached, the last one copied on write
    EXPECT_EQ(d, want[2]);
    EXPECT_EQ(td.n_cached, prefix ? 47 : 0);
    auto st = s->stats();
    EXPECT_EQ(st.prefix_hit_tokens, prefix ? 32u + 32u + 47u : 0u);  // exact48's first run shares base's 32
    EXPECT_EQ(st.kv_blocks_used, 0);
    if (prefix) EXPECT_GT(st.kv_blocks_cached, 0);
    else EXPECT_EQ(st.kv_blocks_cached, 0);
  }
}

TEST(Scheduler, CancelFreesBlocksAndStopStringsCut) {
  auto m0 = load_model(demo_model());
  ASSERT_TRUE(m0);
  auto ps = prompts(m0->tokenizer(), 1);
  EngineConfig cfg;
  cfg.max_seqs = 2;
  cfg.n_ctx = 1024;
  auto s = make_sched(cfg);
  ASSERT_TRUE(s);
  auto h = s->submit(request(ps[0], 500));
  ASSERT_TRUE(h.is_ok());
  std::vector<TokenEvent> evs;
  while (ids_of(evs).size() < 3 && (*h)->next(evs, std::chrono::milliseconds(1000))) {
  }
  (*h)->cancel();
  (*h)->wait_all();
  EXPECT_EQ((*h)->finish_reason(), FinishReason::kCancelled);
  EXPECT_TRUE(s->wait_idle(std::chrono::seconds(5)));
  EXPECT_EQ(s->stats().kv_blocks_used, 0);

  // Stop string: the text of a greedy run, cut before a string from its middle.
  auto full = s->submit(request(ps[0], 30));
  std::string text;
  for (auto& e : (*full)->wait_all()) text += e.text;
  ASSERT_GT(text.size(), 20u);
  const std::string stop = text.substr(text.size() / 2, 5);
  GenRequest r = request(ps[0], 30);
  r.stop = {"never appears \x01", stop};
  auto cut = s->submit(r);
  std::string got;
  for (auto& e : (*cut)->wait_all()) got += e.text;
  EXPECT_EQ(got, text.substr(0, text.find(stop)));
  EXPECT_EQ((*cut)->finish_reason(), FinishReason::kStop);
}

TEST(Scheduler, SubmitChecksRequests) {
  EngineConfig cfg;
  cfg.n_ctx = 64;
  auto s = make_sched(cfg);
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->submit(request({}, 4)).is_ok());
  EXPECT_FALSE(s->submit(request({1, s->n_vocab()}, 4)).is_ok());
  EXPECT_FALSE(s->submit(request({1, -1}, 4)).is_ok());
  EXPECT_FALSE(s->submit(request(std::vector<int32_t>(64, 1), 4)).is_ok());  // no room to generate
  GenRequest bad = request({1, 2}, 4);
  bad.sampling.top_p = -1;
  bad.sampling.temp = 1;
  EXPECT_FALSE(s->submit(bad).is_ok());
  EXPECT_FALSE(s->submit(request({1, 2}, -2)).is_ok());
  // The context of a sequence ends generation with "length".
  auto h = s->submit(request(std::vector<int32_t>(60, 5), -1));
  ASSERT_TRUE(h.is_ok());
  auto ids = ids_of((*h)->wait_all());
  EXPECT_EQ((*h)->finish_reason(), FinishReason::kLength);
  EXPECT_EQ(ids.size(), 5u);  // positions 60..63 fed, the 5th sampled from position 63
  EXPECT_TRUE(Scheduler::create(load_model(demo_model()), EngineConfig{.max_seqs = 0}).status().code() ==
              ErrorCode::kInvalidArgument);
}

// The block manager's prefix cache on its own.
TEST(KvCachePrefix, IndexLruAndCopyOnWrite) {
  KvCacheConfig c;
  c.n_ctx = 64;  // 4 blocks of 16
  c.max_seqs = 2;
  c.prefix_cache = true;
  auto r = KvCache::create(c);
  ASSERT_TRUE(r.is_ok());
  KvCache& k = **r;
  int copies = 0;
  k.set_block_copier([&](int32_t, int32_t, int32_t) {
    ++copies;
    return Status::ok();
  });
  std::vector<int32_t> t(40);
  for (int i = 0; i < 40; ++i) t[i] = i + 1;
  ASSERT_TRUE(k.reserve(0, 40).is_ok());
  ASSERT_TRUE(k.commit(0, 40).is_ok());
  k.cache_blocks(0, t);
  EXPECT_EQ(k.cached_prefix(t), 32);
  k.truncate(0, 0);
  EXPECT_EQ(k.n_blocks_cached(), 2);  // the two full blocks stay, unreferenced
  EXPECT_EQ(k.n_blocks_free(), 4);
  EXPECT_EQ(k.n_blocks_used(), 0);
  // Attach: the whole prefix, limited to 31 tokens (the last block held partly).
  EXPECT_EQ(k.attach_prefix(1, t, 31), 31);
  EXPECT_EQ(k.n_blocks_cached(), 0);
  EXPECT_EQ(k.n_blocks_used(), 2);
  EXPECT_EQ(k.blocks_needed(1, 1), 1);  // copy-on-write of the indexed block
  ASSERT_TRUE(k.reserve(1, 1).is_ok());
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(k.n_blocks_cached(), 1);  // the original of the copied block went back to the LRU
  // A different token sequence shares nothing.
  std::vector<int32_t> u = t;
  u[3] = 999;
  EXPECT_EQ(k.cached_prefix(u), 0);
  // Under pressure the cached blocks are taken (their index entries dropped), never-indexed ones first.
  k.truncate(1, 0);
  EXPECT_EQ(k.n_blocks_free(), 4);
  ASSERT_TRUE(k.reserve(0, 64).is_ok());
  EXPECT_EQ(k.n_blocks_cached(), 0);
  EXPECT_EQ(k.cached_prefix(t), 0);
  k.truncate(0, 0);
  EXPECT_EQ(k.n_blocks_free(), 4);
}

}  // namespace
}  // namespace kiln
