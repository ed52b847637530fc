// CUDA backend ops against the CPU reference backend (the scalar executable spec), on awkward shapes: odd token
// counts, row counts that are not multiples of the tiles, head dims 64/80/128/256, GQA ratios 1/4/8, every weight
// type. Skipped (visibly) without a GPU. Thresholds from the numerics of each CUDA path (kernel comments):
//   exact ops (get_rows, kv_store, copy, argmax, elementwise): equal up to 1 ulp of f32 (FMA contraction);
//   matmul via the float GEMV/GEMM (f32 math on exactly converted weights): NMSE <= 1e-8 vs the f64 reference;
//   matmul of quantized weights (GEMV and GEMM both take int8 activations with an f32 scale per 32: relative error
//   ~1/254 per activation, NMSE of a dot product ~1e-5, more where large weight offsets (q5_1's m) amplify it):
//   NMSE <= 1e-3 vs the f64 reference; a wrong block layout gives NMSE ~1.
//   attention (f32 math, q rounded to f16 like the CPU reference): NMSE <= 1e-9 vs the CPU reference.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "common/backend_test_util.h"
#include "quant/reference.h"
#include "util/fp16.h"

#ifdef KILN_HAVE_CUDA
namespace kiln::cuda {
const char* matmul_kernel_for(DType t, int64_t n_in, int64_t n_out, int64_t n_tok);  // matmul_select.cu
void attention_force_decode(int kernel);  // attention.cu: -1 the selector, 0..2 a decode kernel
}  // namespace kiln::cuda
#endif

namespace kiln {
namespace {

using test::random_weights;

#define NEED_GPU() KILN_NEED_GPU()

struct Dev {
  std::unique_ptr<Buffer> buf;
  Tensor t;
};

Dev upload(Backend& be, DType type, const void* host, size_t bytes, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
  Dev d;
  auto b = be.alloc(std::max<size_t>(bytes, 64));
  EXPECT_TRUE(b.is_ok());
  d.buf = std::move(b).value();
  d.t = Tensor::make(type, d.buf->data(), &be, ne0, ne1, ne2);
  if (host) {
    EXPECT_TRUE(be.write(d.t, 0, host, bytes).is_ok());
  }
  return d;
}

template <class T>
std::vector<T> download(Backend& be, const Tensor& t, size_t n) {
  std::vector<T> v(n);
  EXPECT_TRUE(be.read(t, 0, v.data(), n * sizeof(T)).is_ok());
  return v;
}


const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,   DType::Q5_0,
                        DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,   DType::Q4_K,   DType::Q5_K,
                        DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::TQ1_0, DType::TQ2_0,
                        DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M};

TEST(CudaOps, MatmulEveryTypeAndTokenCount) {
  NEED_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t n_in = 512, n_out = 67;
  for (DType t : kTypes) {
    const auto wb = random_weights(t, n_in, n_out, rng);
    std::vector<float> wf(n_in * n_out);
    const size_t rb = dtype_row_bytes(t, n_in).value();
    for (int64_t r = 0; r < n_out; ++r) ASSERT_TRUE(dequantize_row(t, wb.data() + r * rb, wf.data() + r * n_in, n_in).is_ok());
    const int64_t ne[4] = {n_in, n_out, 1, 1};
    auto w = gpu.import_weight(t, ne, wb.data(), wb.size());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    std::vector<float> bias(n_out);
    for (auto& b : bias) b = nd(rng);
    Dev bd = upload(gpu, DType::F32, bias.data(), bias.size() * 4, n_out);
    for (int64_t nt : {1, 2, 3, 8, 13, 16, 17, 64, 100}) {
      std::vector<float> x(n_in * nt);
      for (auto& v : x) v = nd(rng);
      Dev xd = upload(gpu, DType::F32, x.data(), x.size() * 4, n_in, nt);
      Dev yd = upload(gpu, DType::F32, nullptr, n_out * nt * 4, n_out, nt);
      for (int mode = 0; mode < 3; ++mode) {  // matmul+bias, matmul_add (acc preset to 1), matmul_group of 2
        std::vector<float> y0(n_out * nt, 1.0f);
        ASSERT_TRUE(gpu.write(yd.t, 0, y0.data(), y0.size() * 4).is_ok());
        Status st;
        Dev y2 = upload(gpu, DType::F32, nullptr, n_out * nt * 4, n_out, nt);
        if (mode == 0) st = gpu.matmul(*w, xd.t, bd.t, yd.t);
        else if (mode == 1) st = gpu.matmul_add(*w, xd.t, Tensor{}, y2.t, yd.t);
        else {
          const Backend::MatmulOut outs[] = {{*w, bd.t, yd.t}, {*w, Tensor{}, y2.t}};
          st = gpu.matmul_group(xd.t, outs, 2);
        }
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        auto got = download<float>(gpu, yd.t, n_out * nt);
        std::vector<double> ref(n_out * nt);
        for (int64_t k = 0; k < nt; ++k)
          for (int64_t r = 0; r < n_out; ++r) {
            double s = 0;
            for (int64_t i = 0; i < n_in; ++i) s += static_cast<double>(wf[r * n_in + i]) * x[k * n_in + i];
            ref[k * n_out + r] = s + (mode == 1 ? 1.0 : bias[r]);
          }
        const bool q8act = t != DType::F32 && t != DType::F16 && t != DType::BF16;
        // Where the selector (matmul_select.cu) takes dequantize + cuBLAS (gemm_blas.cu) or the GEMM: F16/BF16
        // weights as stored, activations rounded to f16 (relative error <= 2^-11: NMSE of a dot product ~ 2^-22 /
        // 3 ~ 8e-8) or bf16 (2^-8: ~5e-6); the bounds are those of test_backend_cuda_mmq.cpp (quantized weights,
        // also rounded to f16 there, stay far inside 1e-3). The float GEMV (mmvf, passes of 16) keeps f32
        // activations (1e-8).
#ifdef KILN_HAVE_CUDA
        const bool gemv = std::string(cuda::matmul_kernel_for(t, n_in, n_out, nt)) == "mmvf";
#else
        const bool gemv = true;
#endif
        const double lim = q8act ? 1e-3 : !gemv && t == DType::F16 ? 1e-6 : !gemv && t == DType::BF16 ? 6e-5 : 1e-8;
        const double e = test::nmse_d(got, ref);
        EXPECT_LE(e, lim) << dtype_name(t) << " n_tok " << nt << " mode " << mode;
      }
    }
  }
}

// A recorded graph (Backend::graph_*) of a 4-token step, then a 32-token step that grows the activation scratch
// the graph's kernels point into: running the step's key again (replay, or capture anew) still gives the first
// result bit for bit. Without graphs (KILN_CUDA_GRAPHS=0) it checks the eager path the same way.
TEST(CudaOps, GraphStepAfterScratchGrowth) {
  NEED_GPU();
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t n_in = 256, n_out = 67;
  const auto wb = random_weights(DType::Q4_K, n_in, n_out, rng);
  const int64_t ne[4] = {n_in, n_out, 1, 1};
  auto w = gpu.import_weight(DType::Q4_K, ne, wb.data(), wb.size());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  std::vector<float> x4(n_in * 4), x32(n_in * 32);
  for (auto& v : x4) v = nd(rng);
  for (auto& v : x32) v = nd(rng);
  Dev xs = upload(gpu, DType::F32, x4.data(), x4.size() * 4, n_in, 4);
  Dev ys = upload(gpu, DType::F32, nullptr, n_out * 4 * 4, n_out, 4);
  Dev xb = upload(gpu, DType::F32, x32.data(), x32.size() * 4, n_in, 32);
  Dev yb = upload(gpu, DType::F32, nullptr, n_out * 32 * 4, n_out, 32);
  constexpr uint64_t kKey = 0x4b1;
  auto step = [&] {  // as model/state.cpp runs a step: replay, else begin / ops / end
    if (gpu.graph_replay(kKey)) return Status::ok();
    KILN_TRY(gpu.graph_begin(kKey));
    KILN_TRY(gpu.matmul(*w, xs.t, Tensor{}, ys.t));
    return gpu.graph_end(kKey);
  };
  ASSERT_TRUE(step().is_ok());  // eager
  ASSERT_TRUE(step().is_ok());  // captured (and launched)
  const std::vector<float> ref = download<float>(gpu, ys.t, n_out * 4);
  ASSERT_TRUE(gpu.matmul(*w, xb.t, Tensor{}, yb.t).is_ok());  // 32 tokens: the q8_1 scratch grows
  const std::vector<float> poison(n_out * 4, std::nanf(""));
  ASSERT_TRUE(gpu.write(ys.t, 0, poison.data(), poison.size() * 4).is_ok());
  ASSERT_TRUE(step().is_ok());
  const std::vector<float> got = download<float>(gpu, ys.t, n_out * 4);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ref[i]) << "output " << i;
}

TEST(CudaOps, GetRowsEveryType) {
  NEED_GPU();
  std::mt19937 rng(3);
  const int64_t d = 512, rows = 9;
  for (DType t : kTypes) {
    const auto wb = random_weights(t, d, rows, rng);
    const size_t rb = dtype_row_bytes(t, d).value();
    const int64_t ne[4] = {d, rows, 1, 1};
    auto w = gpu.import_weight(t, ne, wb.data(), wb.size());
    ASSERT_TRUE(w.is_ok());
    const std::vector<int32_t> ids = {8, 0, 3, 3, 7};
    Dev id = upload(gpu, DType::I32, ids.data(), ids.size() * 4, static_cast<int64_t>(ids.size()));
    Dev out = upload(gpu, DType::F32, nullptr, d * ids.size() * 4, d, static_cast<int64_t>(ids.size()));
    ASSERT_TRUE(gpu.get_rows(*w, id.t, out.t).is_ok());
    auto got = download<float>(gpu, out.t, d * ids.size());
    std::vector<float> ref(d);
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSERT_TRUE(dequantize_row(t, wb.data() + ids[k] * rb, ref.data(), d).is_ok());
      for (int64_t i = 0; i < d; ++i)
        ASSERT_NEAR(got[k * d + i], ref[i], 1e-6f * std::fabs(ref[i]) + 1e-30f) << dtype_name(t) << " row " << k << " elem " << i;
    }
  }
}

// Attention + kv_store through both backends on the same random K/V (written through kv_store), paged with a
// shuffled block table, decode (split-KV) and prefill (causal) shapes.
// One attention launch on both backends: ctx positions written through kv_store into shuffled 16-position blocks,
// the last n_tok tokens as queries (each its own causal length; token 1 padded when n_tok > 2), the CUDA output
// against the CPU reference's.
struct AttnCase {
  int hd, n_head, n_kv, n_tok, ctx;
  DType kt;
  int window = 0;
  bool sinks = false;       // KvLayer::sinks: one logit per head, some above every score, some below
  bool non_causal = false;  // every token reads all ctx positions (an encoder's kv_len)
};
void check_attention(Backend& cpu, Backend& gpu, const AttnCase& c, std::mt19937& rng, const std::string& tag) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int bs = 16, n_blocks = (c.ctx + bs - 1) / bs + 3;
  const int64_t n_slots = static_cast<int64_t>(n_blocks) * bs, dkv = static_cast<int64_t>(c.n_kv) * c.hd;
  // All ctx positions are written; the last n_tok tokens are the queries at positions ctx-n_tok .. ctx-1.
  std::vector<int32_t> table(n_blocks);
  for (int i = 0; i < n_blocks; ++i) table[i] = i;
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> slots(c.ctx);
  for (int p = 0; p < c.ctx; ++p) slots[p] = table[p / bs] * bs + p % bs;
  std::vector<float> k(dkv * c.ctx), v(dkv * c.ctx), q(static_cast<int64_t>(c.hd) * c.n_head * c.n_tok);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  // Against an f16 cache the CUDA kernels read q as f16 (tensor-core MMA); the CPU keeps q in f32. q is given
  // f16-representable, so both compute the same function and the bound below stays the summation-order one.
  if (c.kt == DType::F16)
    for (auto& x : q) x = fp16_to_f32(f32_to_fp16(x));
  std::vector<int32_t> tok_table(c.n_tok, 0), kv_len(c.n_tok);
  for (int t = 0; t < c.n_tok; ++t) kv_len[t] = c.non_causal ? c.ctx : c.ctx - c.n_tok + t + 1;
  if (c.n_tok > 2) kv_len[1] = 0;  // a padded token: zero row
  // Sinks around the scores (q.k scale ~ N(0, 1)): 4 and 2.5 above most of them, -1 and 0.5 among them.
  std::vector<float> sinks(c.n_head);
  for (int h = 0; h < c.n_head; ++h) sinks[h] = std::array<float, 4>{4.0f, -1.0f, 0.5f, 2.5f}[h % 4];
  std::vector<float> outs[2];
  Backend* bes[2] = {&cpu, &gpu};
  for (int bi = 0; bi < 2; ++bi) {
    Backend& be = *bes[bi];
    const size_t row = dtype_row_bytes(c.kt, dkv).value();
    Dev ck = upload(be, c.kt, nullptr, row * n_slots, dkv, n_slots), cv = upload(be, c.kt, nullptr, row * n_slots, dkv, n_slots);
    Dev kd = upload(be, DType::F32, k.data(), k.size() * 4, dkv, c.ctx), vd = upload(be, DType::F32, v.data(), v.size() * 4, dkv, c.ctx);
    Dev sd = upload(be, DType::I32, slots.data(), slots.size() * 4, c.ctx);
    KvLayer L;
    L.k = ck.t, L.v = cv.t, L.n_head_kv = c.n_kv, L.head_dim_k = c.hd, L.head_dim_v = c.hd, L.block_size = bs;
    L.window = c.window;
    Dev sk = upload(be, DType::F32, sinks.data(), sinks.size() * 4, c.n_head);
    if (c.sinks) L.sinks = sk.t;
    ASSERT_TRUE(be.kv_store(kd.t, vd.t, L, sd.t).is_ok());
    Dev qd = upload(be, DType::F32, q.data(), q.size() * 4, c.hd, c.n_head, c.n_tok);
    Dev od = upload(be, DType::F32, nullptr, q.size() * 4, c.hd, c.n_head, c.n_tok);
    Dev tb = upload(be, DType::I32, table.data(), table.size() * 4, n_blocks, 1);
    Dev tt = upload(be, DType::I32, tok_table.data(), tok_table.size() * 4, c.n_tok);
    Dev kl = upload(be, DType::I32, kv_len.data(), kv_len.size() * 4, c.n_tok);
    AttnBatch m;
    m.block_tables = tb.t, m.tok_table = tt.t, m.kv_len = kl.t;
    m.n_seq = 1, m.max_kv_len = c.ctx, m.max_q_len = c.n_tok;
    Status st = be.attention(qd.t, L, m, 1.0f / std::sqrt(static_cast<float>(c.hd)), od.t);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    outs[bi] = download<float>(be, od.t, q.size());
    if (c.kt == DType::Q8_0 && bi == 1) {  // the q8_0 cache bytes equal the CPU quantizer's
      auto g = download<uint8_t>(be, ck.t, row * n_slots);
      std::vector<uint8_t> ref(row);
      for (int p = 0; p < c.ctx; ++p) {
        ASSERT_TRUE(quantize_row(DType::Q8_0, k.data() + p * dkv, ref.data(), dkv).is_ok());
        ASSERT_EQ(0, std::memcmp(ref.data(), g.data() + slots[p] * row, row)) << "q8_0 k row " << p;
      }
    }
  }
  std::vector<double> ref(outs[0].begin(), outs[0].end());
  EXPECT_LE(test::nmse_d(outs[1], ref), 1e-9) << tag << "hd " << c.hd << " heads " << c.n_head << "/" << c.n_kv << " n_tok "
                                      << c.n_tok << " ctx " << c.ctx << " window " << c.window << " " << dtype_name(c.kt)
                                      << (c.sinks ? " sinks" : "") << (c.non_causal ? " non-causal" : "");
  if (c.n_tok > 2) {
    for (int i = 0; i < c.hd * c.n_head; ++i) ASSERT_EQ(outs[1][c.hd * c.n_head + i], 0.0f);
  }
}

std::unique_ptr<Backend> reference_cpu() {  // the scalar executable spec the CUDA ops are checked against
  CpuBackendOptions co;
  co.reference = true;
  return make_cpu_backend(co);
}

void force_decode(int kernel) {
#ifdef KILN_HAVE_CUDA
  cuda::attention_force_decode(kernel);
#else
  (void)kernel;
#endif
}

TEST(CudaOps, AttentionMatchesCpuReference) {
  NEED_GPU();
  auto cpu = reference_cpu();
  std::mt19937 rng(11);
  const AttnCase cases[] = {{64, 4, 4, 1, 700, DType::F16},     {128, 32, 8, 1, 3000, DType::F16},
                            {128, 8, 2, 7, 300, DType::F16},    {80, 8, 1, 37, 37, DType::F16},
                            {256, 8, 1, 5, 129, DType::F16},    {64, 4, 4, 3, 50, DType::Q8_0},
                            {128, 16, 2, 64, 64, DType::F32},   {96, 4, 4, 16, 1000, DType::Q8_0},
                            {128, 16, 8, 3, 2500, DType::F16, 1000}};
  for (const AttnCase& c : cases) check_attention(*cpu, gpu, c, rng, "");
}

// Every decode kernel of f16 caches (attention.cu: attn_vec_kernel, attn_krow_kernel at 4 and at 1 block per SM),
// forced in turn, over head dims 64/128/256, n_rep 1/2/4/8, split and unsplit lengths, lengths off the 32-position
// tile and the 16-position block, sliding windows, and the split-KV second pass (up to its 128 splits: 4 KV heads
// over 12000 positions).
TEST(CudaOps, DecodeKernelsMatchCpuReference) {
  NEED_GPU();
  auto cpu = reference_cpu();
  std::mt19937 rng(12);
  const AttnCase cases[] = {{64, 4, 4, 1, 700, DType::F16},      {128, 16, 8, 3, 2001, DType::F16},
                            {128, 32, 8, 5, 3000, DType::F16},   {128, 64, 8, 2, 1499, DType::F16},
                            {64, 32, 4, 4, 901, DType::F16},     {256, 8, 4, 2, 600, DType::F16},
                            {128, 32, 8, 1, 20, DType::F16},     {128, 32, 8, 4, 5000, DType::F16, 1024},
                            {64, 8, 4, 3, 777, DType::F16, 100}, {64, 32, 4, 1, 12000, DType::F16}};
  for (int k = 0; k < 3; ++k) {
    force_decode(k);
    for (const AttnCase& c : cases) check_attention(*cpu, gpu, c, rng, "decode kernel " + std::to_string(k) + ": ");
  }
  force_decode(-1);
}

// Attention sinks (gpt-oss) through attention.cu (check_attention passes no sequence metadata, so no step takes the
// tensor-core prefill kernels: those are test_backend_cuda_fattn.cpp's): the decode kernels of f16 caches forced in
// turn (attn_vec_kernel, attn_krow_kernel at 4 and 1 blocks per SM), each unsplit (the sink joins in the kernel: 20
// positions at hd 64, 40 at hd 256) and split (it joins once, in attn_combine: 300 positions in 4 splits, 3000 in
// 46, 12000 in 128 on a 132-SM GPU), with a window; and attn_kernel on f32 / q8_0 / f16 caches, split and not, at
// head dims 80 and 96 that no decode kernel takes.
TEST(CudaOps, AttentionSinksMatchCpuReference) {
  NEED_GPU();
  auto cpu = reference_cpu();
  std::mt19937 rng(13);
  ASSERT_TRUE(gpu.supports(Op::kAttentionSinks, DType::F16, DType::F16));
  AttnCase decode[] = {{64, 4, 4, 1, 20, DType::F16},      {128, 32, 8, 5, 300, DType::F16},
                       {128, 32, 8, 1, 3000, DType::F16},  {64, 32, 4, 1, 12000, DType::F16},
                       {256, 8, 4, 2, 600, DType::F16},    {256, 16, 2, 3, 40, DType::F16},
                       {64, 64, 8, 3, 2001, DType::F16, 128}};
  for (int k = 0; k < 3; ++k) {
    force_decode(k);
    for (AttnCase c : decode) {
      c.sinks = true;
      check_attention(*cpu, gpu, c, rng, "sinks, decode kernel " + std::to_string(k) + ": ");
    }
  }
  force_decode(-1);
  AttnCase other[] = {{128, 16, 2, 64, 64, DType::F32}, {96, 4, 4, 16, 1000, DType::Q8_0}, {64, 8, 2, 1, 5000, DType::F32},
                      {128, 8, 8, 3, 2500, DType::Q8_0, 1000}, {80, 8, 1, 37, 37, DType::F16}};
  for (AttnCase c : other) {
    c.sinks = true;
    check_attention(*cpu, gpu, c, rng, "sinks: ");
  }
}

// Non-causal attention (encoders): every token of a step reads the whole sequence (kv_len = ctx for all) through
// attention.cu: the decode kernels forced in turn (also with sinks; 3000 positions split), and attn_kernel (f32 /
// q8_0 caches, head dim 32). The tensor-core prefill kernels: test_backend_cuda_fattn.cpp.
TEST(CudaOps, NonCausalAttentionMatchesCpuReference) {
  NEED_GPU();
  auto cpu = reference_cpu();
  std::mt19937 rng(14);
  ASSERT_TRUE(gpu.supports(Op::kAttentionNonCausal, DType::F16, DType::F16));
  AttnCase decode[] = {{64, 12, 12, 9, 9, DType::F16}, {128, 8, 2, 15, 40, DType::F16}, {256, 8, 4, 7, 300, DType::F16},
                       {64, 4, 4, 5, 3000, DType::F16}};
  for (int k = 0; k < 3; ++k) {
    force_decode(k);
    for (AttnCase c : decode) {
      c.non_causal = true;
      check_attention(*cpu, gpu, c, rng, "non-causal, decode kernel " + std::to_string(k) + ": ");
      c.sinks = true;
      check_attention(*cpu, gpu, c, rng, "non-causal, decode kernel " + std::to_string(k) + ": ");
    }
  }
  force_decode(-1);
  AttnCase other[] = {{64, 12, 12, 100, 100, DType::F32}, {96, 4, 2, 33, 33, DType::Q8_0}, {32, 4, 4, 20, 20, DType::F16},
                      {64, 8, 8, 48, 300, DType::Q8_0}};
  for (AttnCase c : other) {
    c.non_causal = true;
    check_attention(*cpu, gpu, c, rng, "non-causal: ");
  }
}

// The small ops: rms_norm, rope (both orderings, freq factors, strided heads), swiglu/add/mul/scale, softmax,
// argmax (NaN rule), copy conversions, layer_norm (with weight and bias, without, in place), gelu, each against the
// CPU reference backend on the same inputs.
TEST(CudaOps, SmallOpsMatchCpuReference) {
  NEED_GPU();
  auto cpu_ = reference_cpu();
  Backend& cpu = *cpu_;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int64_t d = 300, n = 7;
  std::vector<float> a(d * n), b(d * n), w(d), bias(d), shifted(d * n);
  for (auto& x : a) x = nd(rng);
  for (auto& x : b) x = nd(rng);
  for (auto& x : w) x = nd(rng);
  for (auto& x : bias) x = nd(rng);
  for (size_t i = 0; i < b.size(); ++i) shifted[i] = b[i] + 3.0f * static_cast<float>(i / d);  // row means 0..18
  a[5] = NAN;            // row 0 has a NaN: argmax must skip it
  for (int64_t i = 0; i < d; ++i) a[d * 2 + i] = NAN;  // row 2 all NaN: argmax 0
  a[d * 3 + 17] = a[d * 3 + 200] = 1e6f;  // a tie: the first index
  auto run = [&](Backend& be, int which) -> std::vector<float> {
    Dev ad = upload(be, DType::F32, a.data(), a.size() * 4, d, n), bd = upload(be, DType::F32, b.data(), b.size() * 4, d, n);
    Dev wd = upload(be, DType::F32, w.data(), w.size() * 4, d);
    Dev od = upload(be, DType::F32, nullptr, a.size() * 4, d, n);
    switch (which) {
      case 0: EXPECT_TRUE(be.rms_norm(bd.t, wd.t, 1e-5f, od.t).is_ok()); break;
      case 1: EXPECT_TRUE(be.swiglu(ad.t, bd.t, od.t).is_ok()); break;
      case 2: EXPECT_TRUE(be.add(bd.t, wd.t, od.t).is_ok()); break;  // broadcast
      case 3: EXPECT_TRUE(be.mul(ad.t, bd.t, od.t).is_ok()); break;
      case 4: EXPECT_TRUE(be.scale(bd.t, 0.37f, od.t).is_ok()); break;
      case 5: EXPECT_TRUE(be.softmax(bd.t, od.t).is_ok()); break;
      case 6: {
        Dev id = upload(be, DType::I32, nullptr, n * 4, n);
        EXPECT_TRUE(be.argmax(ad.t, id.t).is_ok());
        auto ids = download<int32_t>(be, id.t, n);
        return std::vector<float>(ids.begin(), ids.end());
      }
      case 7: {  // f32 -> f16 -> bf16 -> f32
        Dev h = upload(be, DType::F16, nullptr, d * n * 2, d, n), bf = upload(be, DType::BF16, nullptr, d * n * 2, d, n);
        EXPECT_TRUE(be.copy(bd.t, h.t).is_ok());
        EXPECT_TRUE(be.copy(h.t, bf.t).is_ok());
        EXPECT_TRUE(be.copy(bf.t, od.t).is_ok());
        break;
      }
      case 8: case 9: {  // rope on [hd 20, 3 heads, 5 tokens] inside rows of 64 floats per token (strided)
        const int hd = 20, nh = 3, nt = 5;
        std::vector<int32_t> pos = {0, 1, 7, 1000, 65000};
        Dev pd = upload(be, DType::I32, pos.data(), pos.size() * 4, nt);
        Tensor x = Tensor::make(DType::F32, bd.buf->data(), &be, hd, nh, nt);
        x.nb[2] = 64 * sizeof(float);
        RopeParams rp;
        rp.mode = which == 8 ? RopeMode::kNormal : RopeMode::kNeox;
        rp.n_rot = 16;
        rp.freq_base = 500000.f;
        rp.freq_scale = 0.5f;
        std::vector<float> ff = {1, 1, 2, 4, 8, 8, 1.5f, 3};
        Dev fd = upload(be, DType::F32, ff.data(), ff.size() * 4, 8);
        if (which == 9) rp.freq_factors = fd.t;
        EXPECT_TRUE(be.rope(x, pd.t, rp).is_ok());
        return download<float>(be, bd.t, 64 * nt);
      }
      case 10: case 11: case 12: {  // layer_norm: weight and bias; neither; weight only, in place
        Dev sd = upload(be, DType::F32, shifted.data(), shifted.size() * 4, d, n);
        Dev cd = upload(be, DType::F32, bias.data(), bias.size() * 4, d);
        if (which == 12) {
          EXPECT_TRUE(be.layer_norm(sd.t, wd.t, Tensor{}, 1e-5f, sd.t).is_ok());
          return download<float>(be, sd.t, a.size());
        }
        const Status st = which == 10 ? be.layer_norm(sd.t, wd.t, cd.t, 1e-5f, od.t)
                                      : be.layer_norm(sd.t, Tensor{}, Tensor{}, 1e-12f, od.t);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        break;
      }
      case 13: EXPECT_TRUE(be.gelu(bd.t, od.t).is_ok()); break;
    }
    return download<float>(be, od.t, a.size());
  };
  for (int which = 0; which < 14; ++which) {
    auto r = run(cpu, which), g = run(gpu, which);
    ASSERT_EQ(r.size(), g.size());
    for (size_t i = 0; i < r.size(); ++i) {
      if (std::isnan(r[i])) {
        EXPECT_TRUE(std::isnan(g[i])) << "op " << which << " elem " << i;
        continue;
      }
      const float tol = which == 6 ? 0.f : (which == 8 || which == 9 ? 2e-5f : 4e-6f) * std::max(1.f, std::fabs(r[i]));
      ASSERT_NEAR(g[i], r[i], tol) << "op " << which << " elem " << i;
    }
  }
}

// YaRN (gpt-oss's: factor 32 over 4096 positions, base 150000): the fused rope_kv_store (one launch) rotates q and
// k and stores k and v exactly as rope, rope and kv_store do on the same device (the same angle code), for f16 and
// f32 caches; the op-level numerics against ggml's formula are test_backend_ops_next.cpp's RopeYarnMatchesGgmlFormula.
TEST(CudaOps, FusedRopeKvStoreWithYarnEqualsTheDecomposition) {
  NEED_GPU();
  ASSERT_TRUE(gpu.supports(Op::kRopeYarn, DType::F32));
  std::mt19937 rng(15);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int hd = 64, n_head = 8, n_kv = 2, n_slots = 64;
  const std::vector<int32_t> pos = {0, 1, 17, 1000, 4095, 9000}, slots = {5, 63, -1, 0, 17, 40};
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<float> q(static_cast<size_t>(hd) * n_head * n), k(static_cast<size_t>(hd) * n_kv * n), v(k.size());
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  RopeParams p;
  p.mode = RopeMode::kNeox, p.n_rot = hd, p.freq_base = 150000.0f, p.freq_scale = 1.0f / 32;
  p.ext_factor = 1.0f, p.attn_factor = 1.0f, p.beta_fast = 32.0f, p.beta_slow = 1.0f, p.n_ctx_orig = 4096;
  for (DType ct : {DType::F16, DType::F32}) {
    std::vector<uint8_t> out[2][4];  // (fused, decomposed) x (q, k, k cache, v cache)
    for (int fused = 0; fused < 2; ++fused) {
      const size_t row = dtype_row_bytes(ct, hd * n_kv).value();
      Dev qd = upload(gpu, DType::F32, q.data(), q.size() * 4, hd, n_head, n);
      Dev kd = upload(gpu, DType::F32, k.data(), k.size() * 4, hd, n_kv, n);
      Dev vd = upload(gpu, DType::F32, v.data(), v.size() * 4, hd * n_kv, n);
      std::vector<uint8_t> poison(row * n_slots, 0xFF);
      Dev kc = upload(gpu, ct, poison.data(), poison.size(), hd * n_kv, n_slots);
      Dev vc = upload(gpu, ct, poison.data(), poison.size(), hd * n_kv, n_slots);
      Dev pd = upload(gpu, DType::I32, pos.data(), pos.size() * 4, n), sd = upload(gpu, DType::I32, slots.data(), slots.size() * 4, n);
      KvLayer L;
      L.k = kc.t, L.v = vc.t, L.n_head_kv = n_kv, L.head_dim_k = hd, L.head_dim_v = hd, L.block_size = 16;
      if (fused == 0) {
        ASSERT_TRUE(gpu.rope_kv_store(qd.t, kd.t, vd.t, pd.t, p, L, sd.t).is_ok());
      } else {
        ASSERT_TRUE(gpu.rope(qd.t, pd.t, p).is_ok());
        ASSERT_TRUE(gpu.rope(kd.t, pd.t, p).is_ok());
        ASSERT_TRUE(gpu.kv_store(kd.t.reshape(hd * n_kv, n), vd.t, L, sd.t).is_ok());
      }
      out[fused][0] = download<uint8_t>(gpu, qd.t, q.size() * 4);
      out[fused][1] = download<uint8_t>(gpu, kd.t, k.size() * 4);
      out[fused][2] = download<uint8_t>(gpu, kc.t, poison.size());
      out[fused][3] = download<uint8_t>(gpu, vc.t, poison.size());
    }
    const char* names[] = {"q", "k", "k cache", "v cache"};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[0][i], out[1][i]) << dtype_name(ct) << " " << names[i];
    EXPECT_NE(out[0][0], std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(q.data()),
                                              reinterpret_cast<const uint8_t*>(q.data()) + q.size() * 4));
  }
}

}  // namespace
}  // namespace kiln
