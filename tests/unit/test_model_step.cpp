// The step contract (model/step.h): execute() allocates nothing, reads nothing back and derives no shape from data.
// A ModelState is driven directly with hand-written plans (what the runtime planner would write) on a placement of
// two counting backends (so the layer boundary copy is inside the measured region too); every allocation is
// counted: Backend::alloc / alloc_host on either backend, and every global operator new of the process.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "backend/registry.h"
#include "common/test_util.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_news{0};
}  // namespace

// GCC pairs the replaced operator new with its own idea of it and warns on free() in operator delete; both sides
// are malloc/free here.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
// Counting global allocation functions for this test binary: every form is replaced (plain, array, nothrow,
// aligned), all on malloc/free, so no allocation bypasses the count and no pair mixes two allocators (ASan checks
// that new/delete pairs match).
namespace {
void* counted_alloc(size_t n, size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  return align <= alignof(std::max_align_t) ? std::malloc(n) : std::aligned_alloc(align, (n + align - 1) / align * align);
}
void* counted_or_throw(size_t n, size_t align) {
  if (void* p = counted_alloc(n, align)) return p;
  throw std::bad_alloc();
}
}  // namespace
void* operator new(size_t n) { return counted_or_throw(n, 0); }
void* operator new[](size_t n) { return counted_or_throw(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return counted_or_throw(n, static_cast<size_t>(a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted_or_throw(n, static_cast<size_t>(a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_alloc(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_alloc(n, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace kiln {
namespace {

// Forwards every call to a CPU backend and counts the allocations made through it.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(int threads) : inner_(make_cpu_backend({threads, false})) {}
  int64_t allocs = 0;

  const char* name() const override { return "counting-cpu"; }
  bool host_memory() const override { return true; }
  bool supports(Op op, DType a, DType b) const override { return inner_->supports(op, a, b); }
  uint64_t memory_available() const override { return inner_->memory_available(); }
  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override {
    ++allocs;
    return inner_->alloc(bytes);
  }
  Result<std::unique_ptr<Buffer>> alloc_host(size_t bytes) override {
    ++allocs;
    return inner_->alloc_host(bytes);
  }
  Status write(const Tensor& dst, size_t off, const void* src, size_t n) override { return inner_->write(dst, off, src, n); }
  Status read(const Tensor& src, size_t off, void* dst, size_t n) override { return inner_->read(src, off, dst, n); }
  Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t nbytes) override {
    KILN_ASSIGN_OR_RETURN(Tensor w, inner_->import_weight(t, ne, host, nbytes));
    w.backend = this;
    return w;
  }
  Status get_rows(const Tensor& w, const Tensor& ids, const Tensor& dst) override { return inner_->get_rows(w, ids, dst); }
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& dst) override {
    return inner_->rms_norm(x, w, eps, dst);
  }
  Status matmul(const Tensor& w, const Tensor& x, const Tensor& b, const Tensor& dst) override {
    return inner_->matmul(w, x, b, dst);
  }
  Status matmul_group(const Tensor& x, const MatmulOut* outs, int n) override { return inner_->matmul_group(x, outs, n); }
  Status rope(const Tensor& x, const Tensor& pos, const RopeParams& p) override { return inner_->rope(x, pos, p); }
  Status kv_store(const Tensor& k, const Tensor& v, const KvLayer& c, const Tensor& slots) override {
    return inner_->kv_store(k, v, c, slots);
  }
  Status attention(const Tensor& q, const KvLayer& c, const AttnBatch& m, float s, const Tensor& dst) override {
    return inner_->attention(q, c, m, s, dst);
  }
  Status swiglu(const Tensor& g, const Tensor& u, const Tensor& dst) override { return inner_->swiglu(g, u, dst); }
  Status add(const Tensor& a, const Tensor& b, const Tensor& dst) override { return inner_->add(a, b, dst); }
  Status mul(const Tensor& a, const Tensor& b, const Tensor& dst) override { return inner_->mul(a, b, dst); }
  Status scale(const Tensor& x, float s, const Tensor& dst) override { return inner_->scale(x, s, dst); }
  Status softmax(const Tensor& x, const Tensor& dst) override { return inner_->softmax(x, dst); }
  Status argmax(const Tensor& x, const Tensor& dst) override { return inner_->argmax(x, dst); }
  Status argmax_masked(const Tensor& x, const Tensor& m, const Tensor& d) override {
    return inner_->argmax_masked(x, m, d);
  }
  Status copy(const Tensor& src, const Tensor& dst) override { return inner_->copy(src, dst); }

 private:
  std::unique_ptr<Backend> inner_;
};

// Writes a plan for one sequence (table row `row`, whose blocks are `blocks`) feeding `ids` at positions
// [start, start + n), every token an output (argmax for even rows, logits for odd ones).
void write_plan(ModelState& st, int32_t row, const std::vector<int32_t>& blocks, const std::vector<int32_t>& ids,
                int32_t start) {
  StepPlan& P = st.plan();
  const StepCaps& c = st.caps();
  const int32_t n = static_cast<int32_t>(ids.size());
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = start + i;
    P.token[i] = ids[i];
    P.pos[i] = pos;
    P.slot[i] = blocks[pos / c.block_size] * c.block_size + pos % c.block_size;
    P.tok_table[i] = row;
    P.kv_len[i] = pos + 1;
    P.out_rows[i] = i;
    P.out_kind[i] = i % 2 ? OutputKind::kLogits : OutputKind::kArgmax;
  }
  P.seq_row[0] = row;
  P.seq_q_start[0] = 0;
  P.seq_q_len[0] = n;
  P.seq_kv_len[0] = start + n;
  P.n_tok = P.n_bucket = n;
  P.n_out = P.n_out_bucket = n;
  P.n_seq = 1;
  P.max_kv_len = start + n;
  P.max_q_len = n;
  int32_t* tr = P.tables + static_cast<int64_t>(row) * c.max_blocks_per_seq();
  for (size_t b = 0; b < blocks.size(); ++b) tr[b] = blocks[b];
  P.dirty_rows.push_back(row);
}

TEST(ModelStep, ExecuteAllocatesNothing) {
  auto a = std::make_shared<CountingBackend>(2), b = std::make_shared<CountingBackend>(1);
  LoadOptions lo;
  auto probe = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), LoadOptions{});
  ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
  const int64_t n_layer = probe.value()->hparams().n_layer;
  for (int64_t il = 0; il < n_layer; ++il) lo.placement.layers.push_back(il == 0 ? a : b);
  lo.placement.input = a;
  lo.placement.output = b;
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), lo);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  StepCaps caps;
  caps.batch_tokens = 8;
  caps.max_outputs = 8;
  caps.max_seqs = 2;
  caps.n_blocks = 8;
  caps.block_size = 4;
  auto st = m.value()->create_state(caps);
  ASSERT_TRUE(st.is_ok()) << st.status().to_string();
  ModelState& S = *st.value();

  // Warm-up: sequence row 0 over blocks {5, 2}, tokens 0..3 (first use may size per-thread kernel scratch).
  const std::vector<int32_t> first = {11, 22, 33, 44}, second = {55, 66, 77, 88}, other = {7, 9, 13, 17};
  write_plan(S, 0, {5, 2}, first, 0);
  ASSERT_TRUE(S.execute().is_ok());
  ASSERT_TRUE(S.fetch().is_ok());

  // Two more plans of the same bucket (4 tokens, 4 outputs), different tokens, positions, slots and table rows.
  const int64_t allocs_before = a->allocs + b->allocs;
  g_news = 0;
  write_plan(S, 0, {5, 2}, second, 4);  // continues row 0 into its second block
  g_counting = true;
  Status s1 = S.execute();
  g_counting = false;
  auto out1 = S.fetch();  // fetch copies out of device memory: not part of the claim, but it allocates nothing too
  ASSERT_TRUE(s1.is_ok()) << s1.to_string();
  ASSERT_TRUE(out1.is_ok());
  std::vector<float> row1(out1->row(1), out1->row(1) + out1->n_vocab);
  const int32_t am0 = out1->argmax[0];
  write_plan(S, 1, {0, 7}, other, 0);  // another sequence row and blocks
  g_counting = true;
  Status s2 = S.execute();
  g_counting = false;
  ASSERT_TRUE(s2.is_ok()) << s2.to_string();
  EXPECT_EQ(g_news.load(), 0) << "operator new calls inside execute()";
  EXPECT_EQ(a->allocs + b->allocs, allocs_before) << "backend allocations inside execute()";

  // The hand-written plans computed the real thing: the same 8 tokens through the engine (one backend) give the
  // same logits row and argmax for token 5 (position 5) as plan 2's output 1.
  LoadOptions cpu;
  cpu.devices.device = "cpu";  // the same kernels as the counting backends (a GPU machine would pick cuda:0)
  auto ref = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), cpu);
  ASSERT_TRUE(ref.is_ok());
  KvCacheConfig kc;
  kc.n_ctx = 32;
  kc.batch_tokens = 8;
  kc.max_outputs = 8;
  auto e = Engine::create(*ref.value(), kc);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  Batch bt;
  std::vector<int32_t> all = first;
  all.insert(all.end(), second.begin(), second.end());
  for (int i = 0; i < 8; ++i) bt.add(all[i], i, 0, true);
  std::vector<float> lg;
  ASSERT_TRUE(e.value()->forward(bt, &lg).is_ok());
  const int64_t nv = ref.value()->hparams().n_vocab;
  EXPECT_EQ(test::nmse(row1.data(), lg.data() + 5 * nv, nv), 0.0);
  const float* r4 = lg.data() + 4 * nv;
  EXPECT_EQ(am0, static_cast<int32_t>(std::max_element(r4, r4 + nv) - r4));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The padding rules (model/step.h) on the CPU: with buckets forced, a 64-token run at -b 7 executes steps of 8
// tokens (one padded: slot -1, kv_len 0) and 8 output rows (one padded), at -b 3 steps of 4, at -b 1 steps of 1.
// Real rows are computed by the same kernels; the only difference allowed is f32 summation order inside kernels
// that pick their tiling from the row count (NMSE ~1e-13; bound 1e-9 as in ModelBatching). A padded token that
// wrote into the cache or leaked into attention, or a padded output fetched, moves rows by NMSE > 1e-3.
TEST(ModelStep, BucketsAndPaddingChangeNothing) {
  LoadOptions cpu;
  cpu.devices.device = "cpu";  // a host-only placement, where buckets are off unless forced
  auto m = Model::load(test::data_path("models/fixture-llama-q8_0.gguf"), cpu);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const int64_t nv = m.value()->hparams().n_vocab;
  std::vector<int32_t> ids;
  for (int i = 0; i < 64; ++i) ids.push_back((i * 37 + 11) % static_cast<int>(nv));
  for (int nb : {7, 3, 1}) {
    std::vector<float> out[2];
    for (int padded = 0; padded < 2; ++padded) {
      KvCacheConfig kc;
      kc.n_ctx = 64;
      kc.batch_tokens = 8;
      kc.max_outputs = 8;
      auto e = Engine::create(*m.value(), kc);
      ASSERT_TRUE(e.is_ok()) << e.status().to_string();
      e.value()->force_buckets(padded == 1);
      EXPECT_EQ(e.value()->bucket_tokens(nb), padded ? (nb == 7 ? 8 : nb == 3 ? 4 : 1) : nb);
      for (size_t s = 0; s < ids.size(); s += nb) {
        Batch b;
        for (size_t i = s; i < std::min(ids.size(), s + nb); ++i) b.add(ids[i], static_cast<int32_t>(i), 0, true);
        std::vector<float> lg;
        Status st = e.value()->forward(b, &lg);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        out[padded].insert(out[padded].end(), lg.begin(), lg.end());
      }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    double mx = 0;
    for (size_t r = 0; r < ids.size(); ++r)
      mx = std::max(mx, test::nmse(out[1].data() + r * nv, out[0].data() + r * nv, nv));
    EXPECT_LE(mx, 1e-9) << "b=" << nb;
  }
}

}  // namespace
}  // namespace kiln
