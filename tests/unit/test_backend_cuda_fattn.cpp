// The CUDA tensor-core flash-attention prefill kernels (src/backend/cuda/fattn_mma.cu and, on 9.0 devices, each
// variant of sm90a/fattn_wgmma.cu), reached through
// Backend::attention on cuda:0 with an f16 cache, head dims 64/128/256 and steps of max_q_len >= kFattnMinQ (16),
// against an f64 host oracle; the split-KV kernel (attention.cu) on the same tokens; sliding windows with the slots
// outside every window poisoned; attention sinks and non-causal (encoder) steps on every kernel. Skipped (visibly)
// without a GPU. (On an sm_75 device the selector routes these steps to attention.cu: the tests then check that
// kernel on the same shapes.)
//
// Oracle and thresholds. The kernel's numerics (fattn_mma.cu header): q rounded to f16, K/V the f16 cache values,
// Q.K in f32 over exact f16 products, scores scaled in f32, exp2 in f32, each probability p_j rounded to f16 for
// P.V (relative error <= 2^-11), the row sum over the unrounded p, f32 accumulation. The oracle computes in double
// on q rounded to f16 and the f16 K/V, so what remains is the rounding of P (plus f32 roundings ~ (hd + L) u):
//   per element |err| <= 2^-10 sum_j p_j |v_j| + 1e-6 (2x the P rounding bound, covering exp2's 2 ulp and the f32
//   accumulation), and NMSE: relative errors uniform in +-2^-11 on random V give NMSE ~ 2^-22 / 3 = 8e-8, so
//   NMSE <= 1e-6. A wrong K (col-major B) or V (row-major B) lane map, a wrong P -> A repack or a mask that is off by
//   one position gives NMSE ~1e-1..1 on the first, smallest case.
// Rows of kv_len 0 (padded tokens inside and outside every sequence) must be exactly zero; outputs are poisoned
// (NaN) first, so unwritten rows fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "common/backend_test_util.h"
#include "util/fp16.h"

namespace kiln {
namespace {

using test::DevTensor;
using test::dev_alloc;
using test::dev_f32;
using test::dev_i32;
using test::dev_read;
using test::dev_upload;
using test::randn;

#define NEED_GPU() KILN_NEED_GPU()

float r16(float x) { return fp16_to_f32(f32_to_fp16(x)); }

}  // namespace
#ifdef KILN_HAVE_CUDA
namespace cuda {
void fattn_set_wgmma(bool allowed);  // fattn_mma.cu: whether 9.0 devices take the wgmma kernel (head dims 64 / 128 / 256)
void fattn_force_wg_variant(int index);  // which of its variants (fattn_mma.cuh kFaWgVariants; -1: the table's)
}  // namespace cuda
#endif
namespace {

// Every GPU case runs on each prefill kernel: the four wgmma variants where the device has them (9.0, head dims
// 64 / 128 / 256: 1 or 2 warpgroups per CTA, with or without the software pipeline; the warp-specialized one at
// 64 / 128), then the mma.sync kernel
// (fattn_set_wgmma(false)). Elsewhere every pass runs mma.sync.
constexpr int kKernels[] = {0, 1, 2, 3, 4, -1};  // variant index; -1: mma.sync
std::string g_kernel;
struct KernelChoice {
  explicit KernelChoice(int k) {
#ifdef KILN_HAVE_CUDA
    cuda::fattn_set_wgmma(k >= 0);
    cuda::fattn_force_wg_variant(k);
#endif
    static const char* const kName[] = {"[wg1 if 9.0] ", "[wg1 pipe if 9.0] ", "[wg2 if 9.0] ", "[wg2 pipe if 9.0] ",
                                        "[ws if 9.0, hd <= 128] "};
    g_kernel = k >= 0 ? kName[k] : "[mma.sync] ";
  }
  ~KernelChoice() {
#ifdef KILN_HAVE_CUDA
    cuda::fattn_set_wgmma(true);
    cuda::fattn_force_wg_variant(-1);
#endif
    g_kernel.clear();
  }
};

struct SeqSpec {
  int q_len;  // tokens in this step
  int depth;  // positions already in the cache before the step (chunked prefill at depth)
};

struct Case {
  int hd, n_head, n_kv, bs, window;
  std::vector<SeqSpec> seqs;
  bool padded_entry = false;  // a sequence entry of q_len 0 at the end
  int pad_tokens = 0;         // tokens outside every sequence (kv_len 0), inserted after the first sequence
  uint32_t seed = 1;
  size_t q_row_pad = 0;       // bytes after every q head row (strided heads, as a view into a wider projection)
  bool q_f16 = true;          // the backend rounds q to f16 before q.k (the GPU kernels; the CPU keeps q f32)
  bool sinks = false;         // KvLayer::sinks: sink_of(h) joins head h's softmax
  bool non_causal = false;    // every token reads its whole sequence (an encoder's kv_len), not its causal prefix
};

// Head h's sink logit: around the scores (q.k scale ~ N(0, 4) here): some above every score of a row, some among
// them, some below.
float sink_of(int h) { return std::array<float, 5>{7.0f, -3.0f, 1.0f, 4.0f, 0.0f}[h % 5]; }

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << "hd " << c.hd << " heads " << c.n_head << "/" << c.n_kv << " bs " << c.bs << " window " << c.window
     << " seqs";
  for (const SeqSpec& s : c.seqs) os << " " << s.q_len << "@" << s.depth;
  if (c.sinks) os << " sinks";
  if (c.non_causal) os << " non-causal";
  return os.str();
}

struct Result_ {
  std::vector<float> got;
  std::vector<double> want, bound;
  std::vector<int> kvl;  // kv_len per token of the batch
  std::vector<float> got_decode;  // the same tokens, one sequence entry each (attention.cu), when asked
};

// Stores every sequence's positions [store_from, depth + q_len) (store_from: the earliest window start of the step
// when poison_outside, else 0: the slots before stay NaN), then runs one attention step over the q tokens.
Result_ run_case(Backend& be, const Case& c, bool poison_outside, bool also_decode) {
  const int n_seq = static_cast<int>(c.seqs.size());
  const int rep = c.n_head / c.n_kv, dk = c.n_kv * c.hd;
  std::vector<int> total(n_seq), blocks(n_seq);
  int n_blocks = 2, max_blocks = 1;
  for (int s = 0; s < n_seq; ++s) {
    total[s] = c.seqs[s].depth + c.seqs[s].q_len;
    blocks[s] = (total[s] + c.bs - 1) / c.bs;
    n_blocks += blocks[s];
    max_blocks = std::max(max_blocks, blocks[s]);
  }
  const int n_tables = n_seq + 1;  // the last row: the padded entry / padded tokens (all -1)
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(c.seed));
  std::vector<int32_t> tables(static_cast<size_t>(n_tables) * max_blocks, -1);
  int next = 0;
  for (int s = 0; s < n_seq; ++s)
    for (int b = 0; b < blocks[s]; ++b) tables[s * max_blocks + b] = perm[next++];
  auto slot_of = [&](int s, int p) { return tables[s * max_blocks + p / c.bs] * c.bs + p % c.bs; };
  auto lo_of = [&](int L) { return c.window > 0 && L > c.window ? L - c.window : 0; };

  // K/V of every position (host f32 and the f16 values the cache holds).
  std::vector<std::vector<float>> K(n_seq), V(n_seq);
  std::vector<int32_t> slots;
  std::vector<float> kst, vst;
  for (int s = 0; s < n_seq; ++s) {
    K[s] = randn(static_cast<size_t>(total[s]) * dk, c.seed * 31 + s);
    V[s] = randn(static_cast<size_t>(total[s]) * dk, c.seed * 37 + s);
    const int from = poison_outside ? lo_of(c.seqs[s].depth + 1) : 0;
    for (int p = from; p < total[s]; ++p) {
      slots.push_back(slot_of(s, p));
      kst.insert(kst.end(), K[s].begin() + static_cast<size_t>(p) * dk, K[s].begin() + static_cast<size_t>(p + 1) * dk);
      vst.insert(vst.end(), V[s].begin() + static_cast<size_t>(p) * dk, V[s].begin() + static_cast<size_t>(p + 1) * dk);
    }
    for (float& x : K[s]) x = r16(x);
    for (float& x : V[s]) x = r16(x);
  }
  const int64_t n_slots = static_cast<int64_t>(n_blocks) * c.bs;
  DevTensor kc = dev_alloc(be, DType::F16, dk, n_slots), vc = dev_alloc(be, DType::F16, dk, n_slots);  // NaN
  KvLayer l;
  l.k = kc.t, l.v = vc.t, l.n_head_kv = c.n_kv, l.head_dim_k = c.hd, l.head_dim_v = c.hd, l.block_size = c.bs;
  l.window = c.window;
  std::vector<float> sinks(c.n_head);
  for (int h = 0; h < c.n_head; ++h) sinks[h] = sink_of(h);
  const DevTensor sk = dev_f32(be, sinks, c.n_head);
  if (c.sinks) l.sinks = sk.t;
  {
    const int64_t n_st = static_cast<int64_t>(slots.size());
    const DevTensor kt = dev_f32(be, kst, dk, n_st), vt = dev_f32(be, vst, dk, n_st), st = dev_i32(be, slots);
    const Status ks = be.kv_store(kt.t, vt.t, l, st.t);
    EXPECT_TRUE(ks.is_ok()) << ks.to_string();
  }

  // The batch: each sequence's q_len tokens (positions depth..depth+q_len-1), pad tokens after the first.
  std::vector<std::pair<int, int>> toks;  // (seq, pos) or (-1, -1)
  std::vector<int32_t> seq_row, seq_q_start, seq_q_len, seq_kv_len;
  for (int s = 0; s < n_seq; ++s) {
    seq_row.push_back(s), seq_q_start.push_back(static_cast<int32_t>(toks.size()));
    for (int i = 0; i < c.seqs[s].q_len; ++i) toks.emplace_back(s, c.seqs[s].depth + i);
    seq_q_len.push_back(c.seqs[s].q_len), seq_kv_len.push_back(total[s]);
    if (s == 0)
      for (int i = 0; i < c.pad_tokens; ++i) toks.emplace_back(-1, -1);
  }
  if (c.padded_entry)
    seq_row.push_back(n_seq), seq_q_start.push_back(static_cast<int32_t>(toks.size())), seq_q_len.push_back(0),
        seq_kv_len.push_back(0);
  const int64_t n = static_cast<int64_t>(toks.size());
  std::vector<int32_t> tok_table, kv_len;
  for (const auto& [s, p] : toks)
    tok_table.push_back(s < 0 ? n_seq : s), kv_len.push_back(s < 0 ? 0 : c.non_causal ? total[s] : p + 1);
  const std::vector<float> qv = randn(static_cast<size_t>(c.hd) * c.n_head * n, c.seed * 41, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  const DevTensor bt = dev_upload(be, DType::I32, tables, max_blocks, n_tables);
  const DevTensor qt = dev_f32(be, qv, c.hd, c.n_head, n, c.q_row_pad);
  const DevTensor tt = dev_i32(be, tok_table), kl = dev_i32(be, kv_len), sr = dev_i32(be, seq_row),
                  sqs = dev_i32(be, seq_q_start), sql = dev_i32(be, seq_q_len), skl = dev_i32(be, seq_kv_len);
  const DevTensor reset = dev_i32(be, std::vector<int32_t>(seq_row.size(), 0));
  Result_ r;
  r.kvl = kv_len;
  {
    const DevTensor out = dev_alloc(be, DType::F32, c.hd, c.n_head, n);  // NaN
    AttnBatch m;
    m.block_tables = bt.t, m.tok_table = tt.t, m.kv_len = kl.t;
    m.seq_row = sr.t, m.seq_q_start = sqs.t, m.seq_q_len = sql.t, m.seq_kv_len = skl.t, m.seq_reset = reset.t;
    m.n_seq = static_cast<int32_t>(seq_row.size());
    m.max_kv_len = std::max(1, *std::max_element(kv_len.begin(), kv_len.end()));
    m.max_q_len = *std::max_element(seq_q_len.begin(), seq_q_len.end());
    const Status st = be.attention(qt.t, l, m, scale, out.t);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    r.got = dev_read<float>(be, out);
  }
  if (also_decode) {  // the same tokens, each its own sequence entry of q_len 1: max_q_len 1 -> attention.cu
    std::vector<int32_t> d_row, d_start, d_len, d_kv;
    for (int64_t t = 0; t < n; ++t)
      d_row.push_back(tok_table[t]), d_start.push_back(static_cast<int32_t>(t)), d_len.push_back(1),
          d_kv.push_back(kv_len[t]);
    const DevTensor a = dev_i32(be, d_row), b = dev_i32(be, d_start), cc = dev_i32(be, d_len), d = dev_i32(be, d_kv),
                    z = dev_i32(be, std::vector<int32_t>(d_row.size(), 0));
    const DevTensor out = dev_alloc(be, DType::F32, c.hd, c.n_head, n);
    AttnBatch m;
    m.block_tables = bt.t, m.tok_table = tt.t, m.kv_len = kl.t;
    m.seq_row = a.t, m.seq_q_start = b.t, m.seq_q_len = cc.t, m.seq_kv_len = d.t, m.seq_reset = z.t;
    m.n_seq = static_cast<int32_t>(n);
    m.max_kv_len = (std::max(1, *std::max_element(kv_len.begin(), kv_len.end())) + 63) / 64 * 64;  // a bucket
    m.max_q_len = 1;
    const Status st = be.attention(qt.t, l, m, scale, out.t);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    r.got_decode = dev_read<float>(be, out);
  }

  // Oracle (double) on q as the backend rounds it and the f16 cache values.
  r.want.assign(r.got.size(), 0.0);
  r.bound.assign(r.got.size(), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const auto [s, p] = toks[t];
    if (s < 0) continue;
    const int L = kv_len[t], lo = lo_of(L);
    for (int h = 0; h < c.n_head; ++h) {
      const int g = h / rep;
      std::vector<double> qh(c.hd);
      for (int i = 0; i < c.hd; ++i) {
        const float q = qv[(t * c.n_head + h) * c.hd + i];
        qh[i] = c.q_f16 ? r16(q) : q;
      }
      std::vector<double> sc(L - lo);
      double mx = c.sinks ? sinks[h] : -INFINITY;
      for (int j = lo; j < L; ++j) {
        const float* kr = K[s].data() + static_cast<size_t>(j) * dk + g * c.hd;
        double d = 0;
        for (int i = 0; i < c.hd; ++i) d += qh[i] * kr[i];
        sc[j - lo] = d * scale;
        mx = std::max(mx, sc[j - lo]);
      }
      double sum = c.sinks ? std::exp(sinks[h] - mx) : 0.0;  // the sink: in the denominator, no value
      for (double& x : sc) sum += (x = std::exp(x - mx));
      double* o = r.want.data() + (t * c.n_head + h) * c.hd;
      double* ob = r.bound.data() + (t * c.n_head + h) * c.hd;
      for (int j = lo; j < L; ++j) {
        const float* vr = V[s].data() + static_cast<size_t>(j) * dk + g * c.hd;
        const double w = sc[j - lo] / sum;
        for (int i = 0; i < c.hd; ++i) o[i] += w * vr[i], ob[i] += std::ldexp(1.0, -10) * w * std::fabs(vr[i]);
      }
      for (int i = 0; i < c.hd; ++i) ob[i] += 1e-6;
    }
  }
  return r;
}

// The checks every case gets: no NaN, zero rows for kv_len 0, the per-element bound, NMSE <= 1e-6.
void check(const Case& c, const Result_& r, const std::string& what_case) {
  const std::string what = g_kernel + what_case;
  const size_t row = static_cast<size_t>(c.hd) * c.n_head;
  size_t bad = 0, nan = 0, nonzero_pad = 0;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < r.got.size(); ++i) {
    const int L = r.kvl[i / row];
    if (std::isnan(r.got[i])) {
      ++nan;
      continue;
    }
    if (L == 0) {
      nonzero_pad += r.got[i] != 0.0f;
      continue;
    }
    const double e = std::fabs(r.got[i] - r.want[i]) / r.bound[i];
    if (e > 1.0) ++bad;
    if (e > worst) worst = e, worst_i = i;
  }
  EXPECT_EQ(nan, 0u) << what << ": NaN outputs (unwritten rows, or a position outside the window was read)";
  EXPECT_EQ(nonzero_pad, 0u) << what << ": rows of kv_len 0 must be zero";
  EXPECT_EQ(bad, 0u) << what << ": elements over the bound; worst " << worst << "x at " << worst_i << " (token "
                     << worst_i / row << ", head " << worst_i % row / c.hd << ", dim " << worst_i % c.hd << "): got "
                     << r.got[worst_i] << " want " << r.want[worst_i];
  EXPECT_LE(test::nmse_d(r.got, r.want), 1e-6) << what << " (NMSE)";
}

// First and smallest: one head, one sequence of 16 query rows over 16..64 positions (one KV tile), block 16. A
// wrong K or V operand layout (ldmatrix with / without .trans swapped, B fragments in the wrong order), a wrong P
// repack or a broken row reduction shows up here as NMSE ~0.1-1, before any paging / GQA / masking question.
TEST(CudaFattn, LaneMapsOnTheSmallestShape) {
  NEED_GPU();
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    for (int depth : {0, 16, 48}) {
      Case c{64, 1, 1, 16, 0, {{16, depth}}};
      c.seed = 3 + depth;
      const Result_ r = run_case(gpu, c, false, false);
      check(c, r, "lane maps " + name_of(c));
    }
  }
}

// Awkward shapes: query and KV lengths off the tiles (1, 15, 17, 63, 65, 130, 300), depth > 0 (chunked prefill
// appended to a cache), several sequences with a padded entry and padded tokens outside every sequence, every
// head dim, GQA 1/4/8, window 0 and 40, block sizes 16 and 7 (a KV tile spans several blocks, not aligned).
TEST(CudaFattn, AwkwardShapesMatchTheOracle) {
  NEED_GPU();
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    uint32_t seed = 100;
    for (int hd : {64, 128, 256})
      for (int rep : {1, 4, 8})
        for (int bs : {16, 7})
          for (int window : {0, 40}) {
            const int n_kv = rep == 8 ? 1 : 2;
            Case c{hd, rep * n_kv, n_kv, bs, window, {{17, 0}, {65, 0}, {130, 170}, {15, 48}, {1, 14}, {63, 2}}};
            c.padded_entry = true;
            c.pad_tokens = 2;
            c.seed = seed++;
            const Result_ r = run_case(gpu, c, false, false);
            check(c, r, name_of(c));
          }
  }
}

// Geometries off the common path: GQA 3 (64 / 3 = 21 tokens per CTA, one dead row per CTA), 16 (4 tokens per CTA)
// and 96 (more heads per KV head than CTA rows: two head chunks, the second half full), with q heads strided
// (16 bytes of padding after each head row) and one sequence entirely of one token.
TEST(CudaFattn, UnusualGqaGeometriesAndStridedQ) {
  NEED_GPU();
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    struct G { int hd, n_head, n_kv; };
    for (const G& g : {G{128, 6, 2}, G{64, 16, 1}, G{64, 96, 1}, G{256, 12, 4}}) {
      Case c{g.hd, g.n_head, g.n_kv, 16, 0, {{40, 0}, {1, 20}, {23, 9}}};
      c.padded_entry = true, c.pad_tokens = 1, c.seed = 300 + g.n_head, c.q_row_pad = 16;
      check(c, run_case(gpu, c, false, false), "geometry " + name_of(c));
    }
  }
}

// One long prompt (300 tokens, several query tiles and KV tiles) and the same at depth 300 (600 positions).
TEST(CudaFattn, LongPromptAndChunkedPrefillAtDepth) {
  NEED_GPU();
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    for (int hd : {128, 256})
      for (int depth : {0, 300}) {
        Case c{hd, 8, 2, 16, 0, {{300, depth}}};
        c.seed = 7 + depth + hd;
        const Result_ r = run_case(gpu, c, false, false);
        check(c, r, "long " + name_of(c));
      }
  }
}

// Prefill (fattn_mma) and decode (attention.cu's split-KV kernel, every token its own entry of q_len 1) on the same
// tokens agree: both within the oracle's bound, and with each other to NMSE 1e-6 (attention.cu keeps P in f32).
TEST(CudaFattn, PrefillAndDecodeKernelsAgree) {
  NEED_GPU();
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    for (int hd : {64, 128, 256})
      for (int window : {0, 33}) {
        Case c{hd, 8, 2, 16, window, {{65, 0}, {40, 100}}};
        c.seed = 50 + hd + window;
        c.pad_tokens = 1;
        const Result_ r = run_case(gpu, c, false, true);
        check(c, r, "prefill " + name_of(c));
        Result_ d = r;
        d.got = r.got_decode;
        check(c, d, "decode " + name_of(c));
        std::vector<double> ref(r.got.begin(), r.got.end());
        EXPECT_LE(test::nmse_d(r.got_decode, ref), 1e-6) << g_kernel << "decode vs prefill " << name_of(c);
      }
  }
}

// Sliding window, skipped not masked: only positions from each sequence's earliest window start on are stored;
// every slot before is NaN (the dev_alloc poison), so a kernel that reads (loads) one instead of skipping returns
// NaN somewhere. Window 24 < the lengths, also with a tile of positions wholly before every window.
TEST(CudaFattn, WindowSkipsPositionsOutsideIt) {
  NEED_GPU();
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    for (int hd : {64, 128, 256})
      for (int bs : {16, 7}) {
        Case c{hd, 4, 1, bs, 24, {{70, 150}, {33, 0}, {20, 40}}};
        c.seed = 77 + hd + bs;
        c.padded_entry = true;
        const Result_ r = run_case(gpu, c, true, true);
        check(c, r, "window prefill " + name_of(c));
        Result_ d = r;
        d.got = r.got_decode;
        check(c, d, "window decode " + name_of(c));
      }
  }
}

// Attention sinks (gpt-oss: f16 cache, head dim 64, GQA 8, sliding-window layers) on every prefill kernel: each row's
// sink joins once, at the output (fa_store), after the last KV tile. Several query and KV tiles, a padded entry and
// padded tokens (still zero rows), windows 0 and 40, every head dim, GQA 1 / 8 / 3 (dead rows); the same tokens
// through attention.cu's split-KV decode (each token its own entry: the sink joins in the kernel or, split, in
// attn_combine) must agree. The oracle puts the sink in the max and the denominator.
TEST(CudaFattn, SinksOnEveryPrefillKernelAndTheDecode) {
  NEED_GPU();
  ASSERT_TRUE(gpu.supports(Op::kAttentionSinks, DType::F16, DType::F16));
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    uint32_t seed = 500;
    for (int hd : {64, 128, 256})
      for (int rep : {1, 8, 3})
        for (int window : {0, 40}) {
          Case c{hd, rep * 2, 2, 16, window, {{70, 0}, {17, 100}, {1, 5}, {130, 300}}};
          c.sinks = true, c.padded_entry = true, c.pad_tokens = 2, c.seed = seed++;
          const Result_ r = run_case(gpu, c, false, true);
          check(c, r, "sinks prefill " + name_of(c));
          Result_ d = r;
          d.got = r.got_decode;
          check(c, d, "sinks decode " + name_of(c));
          std::vector<double> ref(r.got.begin(), r.got.end());
          EXPECT_LE(test::nmse_d(r.got_decode, ref), 1e-6) << g_kernel << "decode vs prefill " << name_of(c);
        }
  }
}

// Non-causal prefill (encoders: bert, nomic-bert; head dim 64, no GQA): every token of a sequence reads all of it,
// so a query tile's rows see positions past their own and the last KV tile of a row is partly masked for none of
// them. Several sequences side by side (each sees only itself), lengths off the tiles (7, 16, 64, 100, 257), a
// sequence at depth (its cached prefix too), padded tokens, every head dim and GQA 1 / 4; also with sinks; and the
// decode kernels on the same tokens.
TEST(CudaFattn, NonCausalPrefillReadsTheWholeSequence) {
  NEED_GPU();
  ASSERT_TRUE(gpu.supports(Op::kAttentionNonCausal, DType::F16, DType::F16));
  for (const int kern : kKernels) {
    const KernelChoice kc(kern);
    uint32_t seed = 700;
    for (int hd : {64, 128, 256})
      for (int rep : {1, 4})
        for (bool sinks : {false, true}) {
          Case c{hd, rep * 4, 4, 16, 0, {{100, 0}, {7, 0}, {257, 0}, {16, 0}, {64, 30}}};
          c.non_causal = true, c.sinks = sinks, c.pad_tokens = 3, c.padded_entry = true, c.seed = seed++;
          const Result_ r = run_case(gpu, c, false, true);
          check(c, r, "non-causal prefill " + name_of(c));
          Result_ d = r;
          d.got = r.got_decode;
          check(c, d, "non-causal decode " + name_of(c));
        }
  }
}

// The harness itself (oracle, bound, poison, padding) on the CPU reference backend, which runs everywhere: its f16
// attention keeps q and P in f32 (the oracle takes q unrounded for it), so it must pass the same checks (this is
// what makes a GPU failure a kernel bug, not a test bug).
TEST(CudaFattn, HarnessHoldsOnTheCpuReference) {
  auto cpu_ = create_backend("cpu", BackendOptions{1, true});
  ASSERT_TRUE(cpu_.is_ok()) << cpu_.status().to_string();
  Backend& cpu = *cpu_.value();
  for (int hd : {64, 256}) {
    Case c{hd, 8, 2, 7, 0, {{17, 0}, {1, 14}, {40, 30}}};
    c.padded_entry = true, c.pad_tokens = 2, c.seed = 9 + hd, c.q_f16 = false;
    check(c, run_case(cpu, c, false, false), "cpu-ref " + name_of(c));
  }
  if (cpu.supports(Op::kAttentionWindow, DType::F16, DType::F16)) {
    Case c{64, 4, 1, 16, 24, {{70, 150}, {33, 0}}};
    c.padded_entry = true, c.seed = 5, c.q_f16 = false;
    check(c, run_case(cpu, c, true, false), "cpu-ref window " + name_of(c));
  }
  if (cpu.supports(Op::kAttentionSinks, DType::F16, DType::F16) && cpu.supports(Op::kAttentionNonCausal, DType::F16)) {
    Case c{64, 6, 2, 16, 40, {{70, 0}, {17, 100}}};
    c.sinks = true, c.pad_tokens = 1, c.seed = 6, c.q_f16 = false;
    check(c, run_case(cpu, c, false, false), "cpu-ref sinks " + name_of(c));
    Case e{64, 4, 4, 16, 0, {{100, 0}, {7, 0}, {64, 30}}};
    e.non_causal = true, e.sinks = true, e.padded_entry = true, e.seed = 7, e.q_f16 = false;
    check(e, run_case(cpu, e, false, false), "cpu-ref non-causal " + name_of(e));
  }
}

// supports(): the window is honoured for every cache type CUDA stores (K and V of one type: f16, f32, q8_0), and
// the other cache types and mixed pairs are refused.
TEST(CudaFattn, SupportsTheWindowForEveryCacheType) {
  NEED_GPU();
  for (DType t : {DType::F16, DType::F32, DType::Q8_0}) {
    EXPECT_TRUE(gpu.supports(Op::kAttentionWindow, t, t)) << dtype_name(t);
    EXPECT_TRUE(gpu.supports(Op::kKvStore, t, t) && gpu.supports(Op::kAttention, t, t)) << dtype_name(t);
  }
  for (DType t : {DType::BF16, DType::Q4_0, DType::Q4_1, DType::IQ4_NL, DType::Q5_0, DType::Q5_1})
    EXPECT_FALSE(gpu.supports(Op::kKvStore, t, t) || gpu.supports(Op::kAttention, t, t)) << dtype_name(t);
  EXPECT_FALSE(gpu.supports(Op::kKvStore, DType::Q8_0, DType::F16));
  EXPECT_FALSE(gpu.supports(Op::kAttention, DType::F16, DType::Q8_0));
  EXPECT_EQ(stored_cache_types(gpu), "f32, f16 or q8_0");
}

}  // namespace
}  // namespace kiln
