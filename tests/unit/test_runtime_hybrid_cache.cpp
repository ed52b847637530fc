// The prefix cache of hybrid models (runtime/kv_cache.h "Checkpoints", runtime/scheduler.h): the block pool's
// checkpoint bookkeeping on its own; a sequence resumed from a checkpoint computes what a cold one computes; the
// engine loop prefills only what follows the checkpoint, never resumes a different prefix, and stays correct when
// a small pool evicts; the prefill progress reports; the memory check counts the checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "common/engine_util.h"
#include "common/test_util.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

std::string qwen35() { return test::fixtures_dir() + "/models-next/fixture-qwen35-f16.gguf"; }
std::string demo_model() { return std::string(KILN_SOURCE_DIR) + "/models/kiln-demo.gguf"; }

using test::ids;

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- the bookkeeping (no model) ----

struct Pool {
  std::unique_ptr<KvCache> k;
  explicit Pool(int64_t n_ctx, int32_t checkpoints) {
    KvCacheConfig c;
    c.n_ctx = n_ctx;
    c.max_seqs = 2;
    c.prefix_cache = true;
    c.checkpoints = checkpoints;
    auto r = KvCache::create(c);
    EXPECT_TRUE(r.is_ok());
    k = std::move(r).value();
  }
  // Sequence `seq` grows to n tokens of `toks`; its full blocks are indexed.
  void grow(int32_t seq, const std::vector<int32_t>& toks, int64_t n) {
    const int64_t add = n - k->seq_len(seq);
    ASSERT_TRUE(k->reserve(seq, add).is_ok());
    ASSERT_TRUE(k->commit(seq, add).is_ok());
    k->cache_blocks(seq, toks);
  }
};

TEST(KvCacheCheckpoints, AttachOnlyAtACheckpointOfTheSamePrefix) {
  Pool p(256, 4);
  KvCache& k = *p.k;
  const auto t = ids(60, 1);
  p.grow(0, t, 32);
  const int32_t slot = k.add_checkpoint(0);
  ASSERT_GE(slot, 0);
  EXPECT_EQ(k.add_checkpoint(0), -1);  // the block has one
  p.grow(0, t, 48);                     // indexed, without a checkpoint
  p.grow(0, t, 52);
  EXPECT_EQ(k.add_checkpoint(0), -1);  // not a block boundary
  EXPECT_EQ(k.n_checkpoints_used(), 1);
  k.truncate(0, 0);

  EXPECT_EQ(k.cached_prefix(t), 32);  // not 48: the block ending there carries no checkpoint
  int32_t c = -2;
  EXPECT_EQ(k.attach_prefix(1, t, 59, &c), 32);
  EXPECT_EQ(c, slot);
  EXPECT_EQ(k.table(1).size(), 2u);
  k.truncate(1, 0);
  // Whole blocks only: a limit below the checkpoint's position attaches nothing (no partial hold).
  EXPECT_EQ(k.attach_prefix(1, t, 31, &c), 0);
  EXPECT_EQ(c, -1);
  EXPECT_TRUE(k.table(1).empty());
  // A token that differs anywhere before the checkpoint: nothing; after it: the checkpoint.
  for (int at : {0, 5, 16, 31}) {
    SCOPED_TRACE(at);
    auto u = t;
    u[at] ^= 1;
    EXPECT_EQ(k.attach_prefix(1, u, 59, &c), 0);
    EXPECT_EQ(c, -1);
    EXPECT_EQ(k.seq_len(1), 0);
  }
  auto u = t;
  u[40] ^= 1;
  EXPECT_EQ(k.attach_prefix(1, u, 59, &c), 32);
  EXPECT_EQ(c, slot);
  k.truncate(1, 0);
  EXPECT_EQ(k.n_blocks_used(), 0);
}

TEST(KvCacheCheckpoints, SlotsAreEvictedLeastRecentlyUsedAndWithTheirBlocks) {
  Pool p(128, 2);  // 8 blocks, 2 checkpoints
  KvCache& k = *p.k;
  const auto t = ids(64, 2);
  for (int64_t n : {16, 32, 48}) {
    p.grow(0, t, n);
    EXPECT_GE(k.add_checkpoint(0), 0);
  }
  EXPECT_EQ(k.n_checkpoints_used(), 2);  // the one at 16 made room for the one at 48
  k.truncate(0, 0);
  int32_t c = -1;
  EXPECT_EQ(k.attach_prefix(1, t, 20, &c), 0);
  EXPECT_EQ(k.attach_prefix(1, t, 40, &c), 32);  // uses (refreshes) the one at 32
  k.truncate(1, 0);
  // A new checkpoint takes the slot of the least recently used one: 48's, not 32's.
  const auto v = ids(16, 3);
  p.grow(1, v, 16);
  EXPECT_GE(k.add_checkpoint(1), 0);
  k.truncate(1, 0);
  EXPECT_EQ(k.cached_prefix(t), 32);
  EXPECT_EQ(k.attach_prefix(1, t, 63, &c), 32);
  k.truncate(1, 0);
  // The pool needs every block: the cached ones are taken back and their checkpoints go with them.
  ASSERT_TRUE(k.reserve(0, 128).is_ok());
  EXPECT_EQ(k.n_checkpoints_used(), 0);
  EXPECT_EQ(k.cached_prefix(t), 0);
  k.truncate(0, 0);
  // Without the prefix cache there are none.
  KvCacheConfig off;
  off.prefix_cache = false;
  off.checkpoints = 4;
  auto r = KvCache::create(off);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ((*r)->config().checkpoints, 0);
}

// ---- the engine: a resumed sequence computes what a cold one computes ----

// Feeds toks[from, to) to sequence seq; with `out`, the logits of every position.
void feed(Engine& e, int32_t seq, const std::vector<int32_t>& toks, int from, int to, std::vector<float>* out) {
  Batch b;
  for (int i = from; i < to; ++i) b.add(toks[i], i, seq, out != nullptr);
  ASSERT_TRUE(e.forward(b, out).is_ok());
}

// The devices of this build present here ("cpu", "cuda:0", ...): the checkpoints are copies within the layers'
// backend, a device copy on a GPU.
std::vector<std::string> devices() {
  std::vector<std::string> out;
  if (auto d = list_devices())
    for (const DeviceInfo& x : *d) out.push_back(x.id);
  return out;
}

std::unique_ptr<Model> load_on(const std::string& device) {
  LoadOptions lo;
  lo.devices.device = device;
  lo.devices.backend.n_threads = 1;
  auto m = Model::load(qwen35(), lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m ? std::move(m).value() : nullptr;
}

// Sequence 0 keeps a checkpoint, moves on and ends; sequence 1 resumes from it: its logits are those of a cold run
// fed in the same steps, bit for bit.
void resumed_matches_cold(const std::string& device) {
  auto model = load_on(device);
  ASSERT_TRUE(model);
  KvCacheConfig cfg;
  cfg.n_ctx = 256;
  cfg.max_seqs = 2;
  cfg.prefix_cache = true;
  cfg.checkpoints = 4;
  auto warm = Engine::create(*model, cfg);
  ASSERT_TRUE(warm.is_ok()) << warm.status().to_string();
  Engine& w = **warm;
  ASSERT_TRUE(w.checkpoints());
  EXPECT_GT(w.state().checkpoint_bytes(), 0u);
  KvCacheConfig cold_cfg = cfg;
  cold_cfg.prefix_cache = false;
  auto cold = Engine::create(*model, cold_cfg);
  ASSERT_TRUE(cold.is_ok());

  const auto t = ids(90, 7);
  // Sequence 0 keeps a checkpoint at 48, then goes on with other tokens (its state moves past it) and ends.
  feed(w, 0, t, 0, 48, nullptr);
  w.cache().cache_blocks(0, t);
  ASSERT_TRUE(w.checkpoint(0).is_ok());
  auto other = t;
  for (size_t i = 48; i < other.size(); ++i) other[i] = 500;
  feed(w, 0, other, 48, 80, nullptr);
  w.cache().truncate(0, 0);
  // Sequence 1 resumes at 48: the state restored, the K/V blocks reused, only [48, 90) computed.
  EXPECT_EQ(w.attach_prefix(1, t, 89), 48);
  std::vector<float> resumed, fresh;
  feed(w, 1, t, 48, 90, &resumed);
  // The cold run is fed the same way: [0, 48), then [48, 90) (Engine::forward cuts both alike into steps).
  feed(**cold, 0, t, 0, 48, nullptr);
  feed(**cold, 0, t, 48, 90, &fresh);
  ASSERT_EQ(resumed.size(), fresh.size());
  ASSERT_EQ(resumed.size(), 42u * model->hparams().n_vocab);
  EXPECT_EQ(std::memcmp(resumed.data(), fresh.data(), resumed.size() * sizeof(float)), 0);

  // Without checkpoints a hybrid model keeps no prefix cache.
  cfg.checkpoints = 0;
  auto none = Engine::create(*model, cfg);
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE((*none)->cache().config().prefix_cache);
  EXPECT_FALSE((*none)->checkpoints());
  EXPECT_EQ((*none)->state().checkpoint_bytes(), 0u);
}

TEST(HybridPrefixCache, ResumedSequenceMatchesAColdOneBitForBit) {
  KILN_REQUIRE_FIXTURES();
  for (const std::string& device : devices()) {
    SCOPED_TRACE(device);
    resumed_matches_cold(device);
  }
}

TEST(HybridPrefixCache, TooManyCheckpointsIsAnErrorBeforeAllocating) {
  KILN_REQUIRE_FIXTURES();
  for (const std::string& device : devices()) {  // the CPU's available RAM, a GPU's free memory
    SCOPED_TRACE(device);
    auto model = load_on(device);
    ASSERT_TRUE(model);
    KvCacheConfig cfg;
    cfg.n_ctx = 256;
    cfg.prefix_cache = true;
    cfg.checkpoints = 1 << 20;  // 1M copies of the fixture's 0.8 MiB state: more than this machine has
    auto e = Engine::create(*model, cfg);
    ASSERT_FALSE(e.is_ok());
    const std::string m = e.status().message();
    EXPECT_EQ(e.status().code(), ErrorCode::kOutOfRange);
    for (const std::string& want : {std::string("needs"), std::string(" bytes"), "on " + device,
                                   std::string("1048576 checkpoints (--ctx-checkpoints)"), std::string("are available"),
                                   std::string("lower -c or --ctx-checkpoints")})
      EXPECT_NE(m.find(want), std::string::npos) << want << " in: " << m;
  }
}

// ---- the engine loop ----

EngineConfig hybrid_config(int64_t n_ctx = 512, int32_t checkpoints = 4) {
  EngineConfig c = test::one_sequence(n_ctx);
  c.prefix_cache = true;
  c.ctx_checkpoints = checkpoints;
  return c;
}

// The reference: no prefix cache, every prompt computed from position 0.
EngineConfig cold_config(int64_t n_ctx = 512) {
  EngineConfig c = hybrid_config(n_ctx);
  c.prefix_cache = false;
  return c;
}

struct Output {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> rows;
  RequestTimings timings;
};

Output run(Scheduler& s, const std::vector<int32_t>& prompt, int32_t n) {
  Output o;
  GenRequest req = test::greedy_request(prompt, n);
  req.hooks = test::record_rows(&o.rows);
  test::Generated g = test::generate(s, std::move(req));
  EXPECT_TRUE(g.error.is_ok()) << g.error.to_string();
  o.ids = g.ids;
  o.timings = g.timings;
  return o;
}

// A run against a cold run of the same prompt: every row within the fixtures' limit for two correct paths of an
// F16 model (NMSE 1e-4: the chunks differ, so the rounding does), and the same greedy tokens up to the first row
// whose top-2 margin is within twice the largest difference between the two rows (below that the rounding may
// decide: the runs may part there, legitimately).
void expect_same_output(const Output& got, const Output& cold) {
  ASSERT_EQ(got.rows.size(), cold.rows.size());
  ASSERT_EQ(got.ids.size(), cold.ids.size());
  size_t compared = 0;
  for (size_t i = 0; i < cold.rows.size(); ++i) {
    const std::vector<float>& r = cold.rows[i];
    EXPECT_LE(test::nmse(got.rows[i].data(), r.data(), r.size()), 1e-4) << "row " << i;
    float diff = 0;
    for (size_t j = 0; j < r.size(); ++j) diff = std::max(diff, std::fabs(got.rows[i][j] - r[j]));
    std::vector<float> s = r;
    std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
    if (s[0] - s[1] <= 2 * diff) break;
    EXPECT_EQ(got.ids[i], cold.ids[i]) << "token " << i;
    ++compared;
  }
  EXPECT_GE(compared, 2u);
}

TEST(HybridPrefixCache, NextTurnPrefillsOnlyWhatFollowsTheCheckpoint) {
  KILN_REQUIRE_FIXTURES();
  auto s = test::make_scheduler(qwen35(), hybrid_config());
  ASSERT_TRUE(s);
  EXPECT_GT(s->checkpoint_bytes(), 0u);
  const auto a = ids(70, 3);
  const Output t1 = run(*s, a, 6);
  SchedulerStats st = s->stats();
  EXPECT_EQ(st.prefix_hit_tokens, 0u);
  EXPECT_EQ(st.prompt_tokens_computed, 70u);
  EXPECT_EQ(st.kv_checkpoints_total, 4);
  EXPECT_EQ(st.kv_checkpoints_used, 1);  // at 64: the last block boundary before the prompt's last token
  // The next turn: the first prompt, the reply and a new message.
  const auto b = cat(cat(a, t1.ids), ids(30, 4));
  const Output t2 = run(*s, b, 8);
  st = s->stats();
  EXPECT_EQ(t2.timings.n_cached, 64);
  EXPECT_EQ(st.prefix_hit_tokens, 64u);
  EXPECT_EQ(st.prompt_tokens_computed, 70u + (b.size() - 64));
  auto cold = test::make_scheduler(qwen35(), cold_config());
  ASSERT_TRUE(cold);
  const Output c2 = run(*cold, b, 8);
  EXPECT_EQ(cold->stats().prefix_hit_tokens, 0u);
  expect_same_output(t2, c2);
  // The same prompt again (a regenerated reply) resumes at its own checkpoint, one block before its end.
  const Output again = run(*s, b, 8);
  EXPECT_EQ(again.timings.n_cached, static_cast<int64_t>((b.size() - 1) / 16 * 16));
  expect_same_output(again, c2);
}

TEST(HybridPrefixCache, NeverResumesADifferentPrefix) {
  KILN_REQUIRE_FIXTURES();
  auto s = test::make_scheduler(qwen35(), hybrid_config());
  ASSERT_TRUE(s);
  const auto a = ids(40, 5);  // a checkpoint at 32
  run(*s, a, 2);
  EXPECT_EQ(s->stats().kv_checkpoints_used, 1);
  // A token before the checkpoint differs: a cold start, and the cold result.
  auto b = cat(a, ids(10, 6));
  b[20] = b[20] == 7 ? 8 : 7;
  const Output ob = run(*s, b, 6);
  EXPECT_EQ(ob.timings.n_cached, 0);
  auto cold = test::make_scheduler(qwen35(), cold_config());
  ASSERT_TRUE(cold);
  expect_same_output(ob, run(*cold, b, 6));
  // The same 32 tokens, then others: resumed at 32.
  auto c = a;
  c.resize(32);
  c = cat(c, ids(20, 8));
  const Output oc = run(*s, c, 6);
  EXPECT_EQ(oc.timings.n_cached, 32);
  expect_same_output(oc, run(*cold, c, 6));
}

TEST(HybridPrefixCache, SmallPoolEvictsAndStaysCorrect) {
  KILN_REQUIRE_FIXTURES();
  // 6 blocks of 16 and two checkpoints (each prompt here makes one, at the last block boundary before its end):
  //   1. p1 (40 tokens): a checkpoint at 32.           2. p2 (44): nothing cached; its checkpoint at 32.
  //   3. p1 + 20: resumes at p1's 32 (which becomes the most recently used); its checkpoint at 48 takes p2's slot.
  //   4. p2 + 30: p2's blocks are cached, its checkpoint is not: from 0. Its 5 blocks take the free one and the 4
  //      oldest cached (p2's two, then 3.'s block with the checkpoint at 48 and p1's second with the one at 32).
  //   5. the same again: resumes at its checkpoint at 64.
  auto s = test::make_scheduler(qwen35(), hybrid_config(96, 2));
  ASSERT_TRUE(s);
  auto cold = test::make_scheduler(qwen35(), cold_config(96));
  ASSERT_TRUE(cold);
  const auto p1 = ids(40, 11), p2 = ids(44, 12);
  const auto p4 = cat(p2, ids(30, 14));
  const std::vector<int32_t> prompts[] = {p1, p2, cat(p1, ids(20, 13)), p4, p4};
  const int64_t expect_cached[] = {0, 0, 32, 0, 64};
  for (size_t i = 0; i < std::size(prompts); ++i) {
    SCOPED_TRACE(i);
    const Output o = run(*s, prompts[i], 4);
    EXPECT_EQ(o.timings.n_cached, expect_cached[i]);
    const SchedulerStats st = s->stats();
    EXPECT_LE(st.kv_checkpoints_used, 2);
    EXPECT_EQ(st.kv_blocks_used, 0);
    expect_same_output(o, run(*cold, prompts[i], 4));
  }
}

// ---- prefill progress ----

TEST(PrefillProgress, ReportsEveryChunkAndTheEnd) {
  EngineConfig c = test::one_sequence(256, 16);
  c.progress_interval_s = 0;
  std::vector<PrefillProgress> seen;
  c.on_prefill = [&](const PrefillProgress& p) { seen.push_back(p); };  // the engine thread, before the request ends
  auto s = test::make_scheduler(demo_model(), c);
  ASSERT_TRUE(s);
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = 1 + i % 50;
  test::Generated g = test::generate(*s, test::greedy_request(prompt, 3));
  ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
  ASSERT_EQ(seen.size(), 7u);  // 6 chunks of 16, then the last one (4 tokens) ends the prefill
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_FALSE(seen[i].finished);
    EXPECT_EQ(seen[i].done, static_cast<int64_t>(16 * (i + 1)));
    EXPECT_EQ(seen[i].computed, seen[i].done);
    EXPECT_EQ(seen[i].total, 100);
    EXPECT_EQ(seen[i].slot, 0);
  }
  EXPECT_TRUE(seen[6].finished);
  EXPECT_EQ(seen[6].done, 100);
  EXPECT_EQ(seen[6].computed, 100);
  EXPECT_GT(seen[6].seconds, 0);
  // A prompt whose prefill ends within the interval is not reported at all.
  seen.clear();
  c.progress_interval_s = 1e9;
  auto quiet = test::make_scheduler(demo_model(), c);
  ASSERT_TRUE(quiet);
  ASSERT_TRUE(test::generate(*quiet, test::greedy_request(prompt, 3)).error.is_ok());
  EXPECT_TRUE(seen.empty());
}

}  // namespace
}  // namespace kiln
