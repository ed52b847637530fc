// Paged KV cache bookkeeping (block tables, reference counts, fork / copy-on-write, truncate, limits) and its use
// by the forward pass: a forked sequence continues exactly like one that was fed the shared prefix itself.
#include "common/test_util.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

namespace kiln {
namespace {

std::unique_ptr<KvCache> make(int64_t n_ctx, int32_t bs, int32_t max_seqs, DType t = DType::F16) {
  KvCacheConfig c;
  c.n_ctx = n_ctx;
  c.block_size = bs;
  c.max_seqs = max_seqs;
  c.dtype = t;
  auto r = KvCache::create(c);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(KvCache, CreateValidates) {
  KvCacheConfig c;
  c.dtype = DType::Q4_0;
  auto r = KvCache::create(c);
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  c.dtype = DType::Q8_0;
  c.block_size = 0;
  EXPECT_EQ(KvCache::create(c).status().code(), ErrorCode::kInvalidArgument);
  c.block_size = 16;
  c.n_ctx = int64_t{1} << 40;  // checked before anything proportional to it is allocated
  Status st = KvCache::create(c).status();
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("-c"), std::string::npos) << st.message();
}

// The head-dim check of a quantized cache type is the model state's (it knows the head dims).
TEST(KvCache, QuantizedCacheNeedsWholeBlocksPerHead) {
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), LoadOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  StepCaps caps;
  caps.kv_dtype = DType::Q8_0;
  EXPECT_TRUE((*m)->create_state(caps).is_ok());  // head dim 64: two q8_0 blocks
  caps.kv_dtype = DType::Q4_K;  // blocks of 256
  EXPECT_EQ((*m)->create_state(caps).status().code(), ErrorCode::kUnsupported);
}

TEST(KvCache, ReserveTruncateAndLimits) {
  auto c = make(100, 16, 2);  // 7 blocks
  auto& p = *c;
  EXPECT_EQ(c->n_blocks_total(), 7);
  ASSERT_TRUE(c->reserve(0, 20).is_ok());
  EXPECT_EQ(c->n_blocks_free(), 5);
  ASSERT_TRUE(p.commit(0, 20).is_ok());
  EXPECT_EQ(c->seq_len(0), 20);
  ASSERT_TRUE(c->reserve(0, 12).is_ok());  // 32 tokens still fit in 2 blocks
  EXPECT_EQ(c->n_blocks_free(), 5);
  Status st = c->reserve(1, 81);  // fits the context (100) but needs 6 blocks, 5 are free
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("out of KV cache blocks"), std::string::npos) << st.message();
  st = c->reserve(1, 101);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("context full"), std::string::npos) << st.message();
  EXPECT_EQ(c->reserve(2, 1).code(), ErrorCode::kInvalidArgument);
  c->truncate(0, 5);  // keeps 1 block
  EXPECT_EQ(c->seq_len(0), 5);
  EXPECT_EQ(c->n_blocks_free(), 6);
  c->truncate(0, 0);
  EXPECT_EQ(c->n_blocks_free(), 7);
  c->clear();
  EXPECT_EQ(c->n_blocks_free(), 7);
}

TEST(KvCache, ForkSharesBlocksAndCopiesOnWrite) {
  auto c = make(160, 16, 3);  // 10 blocks
  auto& p = *c;
  ASSERT_TRUE(c->reserve(0, 40).is_ok());  // 3 blocks, last one partial
  ASSERT_TRUE(p.commit(0, 40).is_ok());
  ASSERT_TRUE(c->fork(0, 1).is_ok());
  EXPECT_EQ(c->seq_len(1), 40);
  EXPECT_EQ(c->n_blocks_free(), 7);  // shared, nothing new
  EXPECT_EQ(p.table(0), p.table(1));
  ASSERT_TRUE(c->reserve(1, 1).is_ok());  // appending into the shared partial block: private copy
  EXPECT_EQ(c->n_blocks_free(), 6);
  EXPECT_EQ(p.table(0)[0], p.table(1)[0]);
  EXPECT_EQ(p.table(0)[1], p.table(1)[1]);
  EXPECT_NE(p.table(0)[2], p.table(1)[2]);
  c->truncate(0, 0);  // the full blocks stay alive through sequence 1
  EXPECT_EQ(c->n_blocks_free(), 7);
  c->truncate(1, 0);
  EXPECT_EQ(c->n_blocks_free(), 10);
}

// A forked sequence continues exactly like a sequence fed the whole text, through a copy-on-write block.
TEST(KvCache, ForkedSequenceMatchesFreshOne) {
  LoadOptions lo;
  lo.devices.backend.n_threads = 2;
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), lo);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  Model& model = *m.value();
  const int64_t nv = model.hparams().n_vocab;
  KvCacheConfig kc;
  kc.n_ctx = 256;
  kc.max_seqs = 3;
  auto er = Engine::create(model, kc);
  ASSERT_TRUE(er.is_ok()) << er.status().to_string();
  Engine& engine = *er.value();
  KvCache& cache = engine.cache();
  const std::vector<int32_t> prefix = {997, 331, 970, 154, 404, 666, 49, 74, 840, 548, 96, 374, 596, 59, 931, 519,
                                       219, 38, 88, 444};  // 20 tokens: the second block is partial
  const std::vector<int32_t> tail_a = {428, 71, 246}, tail_b = {92, 564};
  Batch b;
  std::vector<float> lg;
  for (size_t i = 0; i < prefix.size(); ++i) b.add(prefix[i], static_cast<int32_t>(i), 0, false);
  ASSERT_TRUE(engine.forward(b, &lg).is_ok());
  ASSERT_TRUE(cache.fork(0, 1).is_ok());
  // Both continue from the shared prefix with different tokens, in one batch.
  b.clear();
  for (size_t i = 0; i < tail_a.size(); ++i) b.add(tail_a[i], static_cast<int32_t>(prefix.size() + i), 0, true);
  for (size_t i = 0; i < tail_b.size(); ++i) b.add(tail_b[i], static_cast<int32_t>(prefix.size() + i), 1, true);
  Status st = engine.forward(b, &lg);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(lg.size(), 5u * nv);
  // Fresh sequence 2: prefix + tail_b in one go.
  b.clear();
  std::vector<int32_t> full = prefix;
  full.insert(full.end(), tail_b.begin(), tail_b.end());
  for (size_t i = 0; i < full.size(); ++i) b.add(full[i], static_cast<int32_t>(i), 2, i >= prefix.size());
  std::vector<float> fresh;
  ASSERT_TRUE(engine.forward(b, &fresh).is_ok());
  for (int r = 0; r < 2; ++r)
    EXPECT_LE(test::nmse(lg.data() + (3 + r) * nv, fresh.data() + r * nv, nv), 1e-9) << "row " << r;
  // Position errors name the sequence.
  b.clear();
  b.add(5, 7, 0, true);
  st = engine.forward(b, &lg);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("does not continue sequence 0"), std::string::npos) << st.message();
  b.clear();
  b.add(static_cast<int32_t>(nv), static_cast<int32_t>(cache.seq_len(0)), 0, true);
  st = engine.forward(b, &lg);
  EXPECT_NE(st.message().find("id 1000 is out of range"), std::string::npos) << st.message();
}

TEST(KvCache, ContextOverflowInForwardIsAnError) {
  LoadOptions lo;
  lo.devices.backend.n_threads = 1;
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), lo);
  ASSERT_TRUE(m.is_ok());
  KvCacheConfig kc;
  kc.n_ctx = 8;
  kc.block_size = 4;
  auto cr = Engine::create(**m, kc);
  ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
  Batch b;
  std::vector<float> lg;
  for (int i = 0; i < 6; ++i) b.add(i + 1, i, 0, i == 5);
  ASSERT_TRUE(cr.value()->forward(b, &lg).is_ok());
  b.clear();
  for (int i = 6; i < 9; ++i) b.add(i + 1, i, 0, true);
  Status st = cr.value()->forward(b, &lg);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("context full"), std::string::npos) << st.message();
  EXPECT_EQ(cr.value()->cache().seq_len(0), 6);
}

}  // namespace
}  // namespace kiln
