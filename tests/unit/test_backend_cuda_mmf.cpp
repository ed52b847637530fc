// The weight-streaming f16 GEMM (backend/cuda/mmf.cuh), forced through the backend's matmul entries on shapes around
// its geometry: token counts around its 8 / 16 / 32 / 64-token tiles and past them (several token tiles), row counts
// that are not 16-row tiles, K of one super-block, of one split and of several splits (n_in 256 .. 14336: S 1 .. 14),
// bias, accumulate (matmul_add), strided x and y, three products in one launch (matmul_group), and more rows than the
// split workspace holds at once (the launcher's row chunks); each with the wgmma kernels allowed and not (on a 9.0
// device both families run). Skipped (visibly) without a GPU.
// Checks: (a) the numerics model — x rounded to f16, the weights as mmf forms them (test::mmf_weights_q4k), sums in
// double: NMSE <= 1e-10 (the tensor core's f32 accumulation and the split partials' f32 sum only); (b) the exact
// product on the reference dequantizer's weights and f32 x: NMSE <= 1e-5 (f16 rounding of x and of the weights,
// ~2^-22 relative^2); (c) bits: a group equals its products run alone, and a launch repeats its bits.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "common/backend_test_util.h"

#ifdef KILN_HAVE_CUDA
namespace kiln::cuda {
void matmul_set_override(const char* name);  // matmul_select.cu: force a kernel where it runs ("" = the rule)
void mmf_set_wgmma(bool allowed);            // mmf.cu: whether 9.0 devices take the wgmma kernels
}  // namespace kiln::cuda
#endif

namespace kiln {
namespace {

using test::DevTensor;
using test::dev_alloc;
using test::dev_f32;
using test::dev_read;
using test::dev_upload;

// mmf forced; wg false: the mma.sync kernels also where the wgmma ones would run (compute capability 9.0), so
// both families are checked on that device (elsewhere both settings run the mma.sync kernels).
struct ForceMmf {
#ifdef KILN_HAVE_CUDA
  explicit ForceMmf(bool wg) {
    cuda::matmul_set_override("mmf");
    cuda::mmf_set_wgmma(wg);
  }
  ~ForceMmf() {
    cuda::matmul_set_override("");
    cuda::mmf_set_wgmma(true);
  }
#else
  explicit ForceMmf(bool) {}
#endif
};

struct Case {
  DType t;
  int64_t n_in, n_out, n_tok;
  std::vector<uint8_t> w;
  std::vector<float> x, bias;
};
Case make_case(int64_t n_in, int64_t n_out, int64_t n_tok, bool bias, uint32_t seed, DType t = DType::Q4_K) {
  Case c{t, n_in, n_out, n_tok, {}, {}, {}};
  std::mt19937 rng(seed);
  c.w = test::random_weights(t, n_in, n_out, rng);
  c.x = test::randn(static_cast<size_t>(n_in * n_tok), seed + 1, 1.5f);
  if (bias) c.bias = test::randn(static_cast<size_t>(n_out), seed + 2);
  return c;
}

// (a) and (b) over the rows `rows` (all when empty) of y [n_tok][n_out] (+ acc0, the accumulator before a
// matmul_add).
void check(const Case& c, const std::vector<float>& y, const std::string& what, const std::vector<int64_t>& rows = {},
           const std::vector<float>* acc0 = nullptr) {
  const size_t rb = dtype_row_bytes(c.t, c.n_in).value();
  std::vector<int64_t> rs = rows;
  if (rs.empty())
    for (int64_t o = 0; o < c.n_out; ++o) rs.push_back(o);
  std::vector<float> deq(static_cast<size_t>(c.n_in)), got;
  std::vector<double> model, exact;
  for (int64_t o : rs) {
    const std::vector<double> wm = test::mmf_weights(c.t, c.w.data() + o * rb, c.n_in);
    KILN_ASSERT_OK(dequantize_row(c.t, c.w.data() + o * rb, deq.data(), c.n_in));
    for (int64_t t = 0; t < c.n_tok; ++t) {
      double m = 0, e = 0;
      for (int64_t i = 0; i < c.n_in; ++i) {
        const float xi = c.x[t * c.n_in + i];
        m += wm[i] * static_cast<double>(fp16_to_f32(f32_to_fp16(xi)));
        e += static_cast<double>(deq[i]) * xi;
      }
      const double add = (c.bias.empty() ? 0.0 : c.bias[o]) + (acc0 ? (*acc0)[t * c.n_out + o] : 0.0);
      model.push_back(m + add);
      exact.push_back(e + add);
      got.push_back(y[t * c.n_out + o]);
    }
  }
  EXPECT_LE(test::nmse_d(got, model), 1e-10) << what << " (vs the mmf numerics model)";
  EXPECT_LE(test::nmse_d(got, exact), 1e-5) << what << " (vs exact math)";
}

TEST(CudaMmf, MatchesModelOnAwkwardShapes) {
  KILN_NEED_GPU();
  for (const bool wg : {true, false}) {
    ForceMmf force(wg);
    struct Shape {
      DType t;
      int64_t n_in, n_out;
    };
    // Q6_K: rows of 2048-multiples only (16-byte aligned rows: mmf_usable)
    for (const Shape sh : {Shape{DType::Q4_K, 256, 40}, Shape{DType::Q4_K, 768, 200}, Shape{DType::Q4_K, 4096, 1000},
                           Shape{DType::Q4_K, 14336, 72}, Shape{DType::Q6_K, 2048, 40}, Shape{DType::Q6_K, 4096, 1000},
                           Shape{DType::Q6_K, 14336, 72}})
      for (int64_t n_tok : {1, 3, 8, 9, 16, 17, 33, 64, 65, 130}) {
        if (sh.n_in == 14336 && n_tok > 64) continue;  // host time
        const bool bias = n_tok % 2 == 1, pad = n_tok == 17 || n_tok == 33;
        const Case c = make_case(sh.n_in, sh.n_out, n_tok, bias, static_cast<uint32_t>(sh.n_in + 7 * n_tok), sh.t);
        const DevTensor wt = dev_upload(gpu, c.t, c.w, c.n_in, c.n_out);
        const DevTensor xt = dev_f32(gpu, c.x, c.n_in, n_tok, 1, pad ? 48 : 0);
        const DevTensor bt = bias ? dev_f32(gpu, c.bias, c.n_out) : DevTensor{};
        const DevTensor out = dev_alloc(gpu, DType::F32, c.n_out, n_tok, 1, pad ? 32 : 0);
        KILN_ASSERT_OK(gpu.matmul(wt.t, xt.t, bias ? bt.t : Tensor{}, out.t));
        std::ostringstream what;
        what << "mmf wg=" << wg << " " << dtype_name(sh.t) << " " << sh.n_out << "x" << sh.n_in << " n_tok=" << n_tok
             << " bias=" << bias << " pad=" << pad;
        check(c, dev_read<float>(gpu, out), what.str());
        if (pad) {  // the bytes between y rows stay poison
          const std::vector<uint8_t> raw = test::dev_read_whole(gpu, out);
          size_t touched = 0;
          for (int64_t r = 0; r < n_tok; ++r)
            for (size_t b = out.t.row_bytes(); b < out.t.nb[1]; ++b) touched += raw[r * out.t.nb[1] + b] != 0xFF;
          EXPECT_EQ(touched, 0u) << what.str() << ": bytes between y rows were written";
        }
      }
  }
}

TEST(CudaMmf, AccumulatesAndRepeatsItsBits) {
  KILN_NEED_GPU();
  for (const bool wg : {true, false})
  for (DType t : {DType::Q4_K, DType::Q6_K})
  for (int64_t n_tok : {5, 40}) {
    ForceMmf force(wg);
    const Case c = make_case(4096, 300, n_tok, true, 91 + static_cast<uint32_t>(n_tok), t);
    const std::vector<float> acc0 = test::randn(static_cast<size_t>(c.n_out * n_tok), 93);
    const DevTensor wt = dev_upload(gpu, c.t, c.w, c.n_in, c.n_out);
    const DevTensor xt = dev_f32(gpu, c.x, c.n_in, n_tok);
    const DevTensor bt = dev_f32(gpu, c.bias, c.n_out);
    std::vector<std::vector<float>> runs;
    for (int r = 0; r < 3; ++r) {
      const DevTensor acc = dev_f32(gpu, acc0, c.n_out, n_tok);
      const DevTensor tmp = dev_alloc(gpu, DType::F32, c.n_out, n_tok);
      KILN_ASSERT_OK(gpu.matmul_add(wt.t, xt.t, bt.t, tmp.t, acc.t));
      runs.push_back(dev_read<float>(gpu, acc));
    }
    const std::string what = "mmf matmul_add wg=" + std::to_string(wg) + " " + dtype_name(t);
    check(c, runs[0], what + " n_tok=" + std::to_string(n_tok), {}, &acc0);
    for (int r = 1; r < 3; ++r)
      EXPECT_EQ(std::memcmp(runs[r].data(), runs[0].data(), runs[0].size() * 4), 0)
          << "n_tok=" << n_tok << ": launch " << r << " gave other bits than launch 0";
  }
}

TEST(CudaMmf, GroupEqualsItsProductsBitForBit) {
  KILN_NEED_GPU();
  for (const bool wg : {true, false})
  for (int64_t n_tok : {4, 24, 64}) {
    ForceMmf force(wg);
    const int64_t n_in = 4096, n_outs[3] = {512, 1000, 40};
    std::vector<Case> cs;
    std::vector<DevTensor> wts, bts, outs, refs;
    std::vector<Backend::MatmulOut> mo;
    const std::vector<float> x = test::randn(static_cast<size_t>(n_in * n_tok), 17);
    const DevTensor xt = dev_f32(gpu, x, n_in, n_tok);
    for (int i = 0; i < 3; ++i) {
      cs.push_back(make_case(n_in, n_outs[i], n_tok, i == 1, 50 + static_cast<uint32_t>(i)));
      cs.back().x = x;
      wts.push_back(dev_upload(gpu, cs.back().t, cs.back().w, n_in, n_outs[i]));
      bts.push_back(i == 1 ? dev_f32(gpu, cs.back().bias, n_outs[i]) : DevTensor{});
      outs.push_back(dev_alloc(gpu, DType::F32, n_outs[i], n_tok));
      refs.push_back(dev_alloc(gpu, DType::F32, n_outs[i], n_tok));
    }
    for (int i = 0; i < 3; ++i) mo.push_back({wts[i].t, i == 1 ? bts[i].t : Tensor{}, outs[i].t});
    KILN_ASSERT_OK(gpu.matmul_group(xt.t, mo.data(), 3));
    for (int i = 0; i < 3; ++i) {
      KILN_ASSERT_OK(gpu.matmul(wts[i].t, xt.t, i == 1 ? bts[i].t : Tensor{}, refs[i].t));
      const std::vector<float> g = dev_read<float>(gpu, outs[i]), r = dev_read<float>(gpu, refs[i]);
      EXPECT_EQ(std::memcmp(g.data(), r.data(), g.size() * 4), 0)
          << "wg=" << wg << " n_tok=" << n_tok << " product " << i;
      check(cs[i], g,
            "mmf group wg=" + std::to_string(wg) + " n_tok=" + std::to_string(n_tok) + " product " + std::to_string(i),
            {0, 1, 15, 16, n_outs[i] - 1});
    }
  }
}

// 64 tokens of 40000 rows x 4096 (S 4): 2500 tiles' partials exceed the 32 MiB workspace, so the launcher runs the
// rows in chunks; rows checked on a stride across every chunk boundary region.
TEST(CudaMmf, MoreRowsThanTheWorkspaceHolds) {
  KILN_NEED_GPU();
  for (const bool wg : {true, false}) {
    ForceMmf force(wg);
    const Case c = make_case(4096, 40000, 64, true, 123);
    const DevTensor wt = dev_upload(gpu, c.t, c.w, c.n_in, c.n_out);
    const DevTensor xt = dev_f32(gpu, c.x, c.n_in, c.n_tok);
    const DevTensor bt = dev_f32(gpu, c.bias, c.n_out);
    const DevTensor out = dev_alloc(gpu, DType::F32, c.n_out, c.n_tok);
    KILN_ASSERT_OK(gpu.matmul(wt.t, xt.t, bt.t, out.t));
    std::vector<int64_t> rows;
    for (int64_t o = 0; o < c.n_out; o += 997) rows.push_back(o);
    for (int64_t o : {int64_t{32767}, int64_t{32768}, int64_t{39999}}) rows.push_back(o);
    check(c, dev_read<float>(gpu, out), std::string("mmf 40000 rows wg=") + std::to_string(wg), rows);
  }
}

}  // namespace
}  // namespace kiln
