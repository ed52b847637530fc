// Paged KV cache bookkeeping (block tables, reference counts, fork / copy-on-write, truncate, limits) and its use
// by the forward pass: a forked sequence continues exactly like one that was fed the shared prefix itself.
#include <cstdio>

#include "common/test_util.h"
#include "gguf/gguf.h"
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
  c.type_k = c.type_v = t;
  auto r = KvCache::create(c);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(KvCache, CreateValidates) {
  KvCacheConfig c;
  c.type_v = DType::Q4_K;  // not a cache type (llama.cpp's -ctv list)
  auto r = KvCache::create(c);
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("-ctv q4_K: not a KV cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, "
                                      "q5_0, q5_1)"), std::string::npos) << r.status().message();
  for (DType t : kKvCacheTypes) {
    c.type_k = t, c.type_v = t == DType::F16 ? DType::Q4_0 : DType::F16;
    EXPECT_TRUE(KvCache::create(c).is_ok()) << dtype_name(t);
  }
  c.type_k = c.type_v = DType::Q8_0;
  c.block_size = 0;
  EXPECT_EQ(KvCache::create(c).status().code(), ErrorCode::kInvalidArgument);
  c.block_size = 16;
  c.n_ctx = int64_t{1} << 40;  // checked before anything proportional to it is allocated
  Status st = KvCache::create(c).status();
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("-c"), std::string::npos) << st.message();
}

// llama.cpp's names, spelled exactly; an unknown one lists the accepted names.
TEST(KvCache, CacheTypeNames) {
  for (DType t : kKvCacheTypes) {
    auto r = kv_cache_type_from_name("-ctk", dtype_name(t));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(*r, t);
  }
  for (const char* bad : {"q4_k", "Q8_0", "f8", "", "q8_0 "}) {
    auto r = kv_cache_type_from_name("-ctv", bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "-ctv: '" + std::string(bad) +
                                        "' is not a KV cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)");
  }
}

// The head-dim check of a quantized cache type is the model state's (it knows the head dims): each head's row must
// be whole blocks of its side's type. The llama fixture (heads of 64) rewritten with heads of 16: 16 query and 8 KV
// heads keep every matrix's shape.
TEST(KvCache, QuantizedCacheNeedsWholeBlocksPerHead) {
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), LoadOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  StepCaps caps;
  for (DType t : kKvCacheTypes) {  // head dim 64: whole blocks of every cache type, on the CPU every pair
    caps.kv_type_k = t, caps.kv_type_v = t == DType::Q4_0 ? DType::F16 : DType::Q4_0;
    EXPECT_TRUE((*m)->create_state(caps).is_ok()) << dtype_name(t);
  }
  static gguf::File src = gguf::File::open(test::data_path("models/fixture-llama-q8_0.gguf")).value();
  gguf::Writer w;
  for (const auto& kv : src.kvs()) w.set(kv.key, kv.value);
  w.set("llama.attention.head_count", uint32_t{16});
  w.set("llama.attention.head_count_kv", uint32_t{8});
  w.set("llama.rope.dimension_count", uint32_t{16});
  for (const auto& t : src.tensors()) {  // llama3 rope factors: one per rotated pair, the first 8 of the 32
    const bool freqs = std::string(t.name) == "rope_freqs.weight";
    const std::vector<int64_t> ne = freqs ? std::vector<int64_t>{8} : std::vector<int64_t>(t.ne, t.ne + t.n_dims);
    ASSERT_TRUE(w.add_tensor(t.name, t.type, ne, t.data).is_ok());
  }
  const std::string path = test::temp_dir() + "kiln-kv-head16.gguf";
  ASSERT_TRUE(w.write(path).is_ok());
  auto m16 = Model::load(path, LoadOptions{});
  ASSERT_TRUE(m16.is_ok()) << m16.status().to_string();
  ASSERT_EQ((*m16)->hparams().head_dim_k, 16);
  caps.kv_type_k = caps.kv_type_v = DType::F16;
  EXPECT_TRUE((*m16)->create_state(caps).is_ok());
  caps.kv_type_k = DType::BF16, caps.kv_type_v = DType::F32;
  EXPECT_TRUE((*m16)->create_state(caps).is_ok());
  caps.kv_type_k = DType::F16, caps.kv_type_v = DType::Q4_0;
  Status st = (*m16)->create_state(caps).status();
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("-ctv q4_0: a V head of 16 values is not a whole number of q4_0 blocks (32 values)"),
            std::string::npos) << st.message();
  caps.kv_type_k = DType::IQ4_NL, caps.kv_type_v = DType::F16;
  st = (*m16)->create_state(caps).status();
  EXPECT_NE(st.message().find("-ctk iq4_nl: a K head of 16 values"), std::string::npos) << st.message();
  std::remove(path.c_str());
}

// A CPU backend that stores f16, f32 or q8_0 caches with K and V of one type (what the CUDA backend stores), to
// check on any machine that creating the model state refuses the rest, naming the flag.
class OneTypeCacheBackend final : public Backend {
 public:
  OneTypeCacheBackend() : cpu_(make_cpu_backend({1, false})) {}
  const char* name() const override { return "one-type"; }
  bool host_memory() const override { return true; }
  bool supports(Op op, DType a, DType b) const override {
    const bool cache = op == Op::kKvStore || op == Op::kAttention || op == Op::kAttentionWindow;
    return cpu_->supports(op, a, b) &&
           (!cache || (a == b && (a == DType::F16 || a == DType::F32 || a == DType::Q8_0)));
  }
  Result<std::unique_ptr<Buffer>> alloc(size_t n) override { return cpu_->alloc(n); }
  Status write(const Tensor& d, size_t o, const void* s, size_t n) override { return cpu_->write(d, o, s, n); }
  Status read(const Tensor& s, size_t o, void* d, size_t n) override { return cpu_->read(s, o, d, n); }
  Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t n) override {
    return cpu_->import_weight(t, ne, host, n);
  }
  Status get_rows(const Tensor& w, const Tensor& i, const Tensor& d) override { return cpu_->get_rows(w, i, d); }
  Status rms_norm(const Tensor& x, const Tensor& w, float e, const Tensor& d) override { return cpu_->rms_norm(x, w, e, d); }
  Status matmul(const Tensor& w, const Tensor& x, const Tensor& b, const Tensor& d) override {
    return cpu_->matmul(w, x, b, d);
  }
  Status rope(const Tensor& x, const Tensor& p, const RopeParams& r) override { return cpu_->rope(x, p, r); }
  Status kv_store(const Tensor& k, const Tensor& v, const KvLayer& c, const Tensor& s) override {
    return cpu_->kv_store(k, v, c, s);
  }
  Status attention(const Tensor& q, const KvLayer& c, const AttnBatch& m, float s, const Tensor& d) override {
    return cpu_->attention(q, c, m, s, d);
  }
  Status swiglu(const Tensor& g, const Tensor& u, const Tensor& d) override { return cpu_->swiglu(g, u, d); }
  Status add(const Tensor& a, const Tensor& b, const Tensor& d) override { return cpu_->add(a, b, d); }
  Status mul(const Tensor& a, const Tensor& b, const Tensor& d) override { return cpu_->mul(a, b, d); }
  Status scale(const Tensor& x, float s, const Tensor& d) override { return cpu_->scale(x, s, d); }
  Status softmax(const Tensor& x, const Tensor& d) override { return cpu_->softmax(x, d); }
  Status argmax(const Tensor& x, const Tensor& d) override { return cpu_->argmax(x, d); }
  Status argmax_masked(const Tensor& x, const Tensor& m, const Tensor& d) override {
    return cpu_->argmax_masked(x, m, d);
  }
  Status copy(const Tensor& s, const Tensor& d) override { return cpu_->copy(s, d); }

 private:
  std::unique_ptr<Backend> cpu_;
};

TEST(KvCache, ABackendRefusesTheCacheTypesItDoesNotStore) {
  auto be = std::make_shared<OneTypeCacheBackend>();
  LoadOptions lo;
  lo.placement.layers = {be, be};
  lo.placement.input = lo.placement.output = be;
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), lo);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(stored_cache_types(*be), "f32, f16 or q8_0");
  struct Case {
    DType k, v;
    const char* error;  // "": created
  } cases[] = {
      {DType::F16, DType::F16, ""},
      {DType::Q8_0, DType::Q8_0, ""},
      {DType::Q4_0, DType::Q4_0, "-ctk q4_0: backend one-type stores f32, f16 or q8_0 caches"},
      {DType::F16, DType::IQ4_NL, "-ctv iq4_nl: backend one-type stores f32, f16 or q8_0 caches"},
      {DType::Q8_0, DType::F16, "-ctk q8_0 -ctv f16: backend one-type stores K and V in one type"},
  };
  for (const Case& c : cases) {
    KvCacheConfig kc;
    kc.n_ctx = 64;
    kc.type_k = c.k, kc.type_v = c.v;
    auto e = Engine::create(**m, kc);
    if (!*c.error) {
      EXPECT_TRUE(e.is_ok()) << e.status().to_string();
      continue;
    }
    ASSERT_FALSE(e.is_ok()) << c.error;
    EXPECT_EQ(e.status().code(), ErrorCode::kUnsupported);
    EXPECT_NE(e.status().message().find(c.error), std::string::npos) << e.status().message();
  }
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
