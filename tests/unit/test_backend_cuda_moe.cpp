// moe_ffn's device-grouped path on CUDA (backend/cuda/cuda_moe.cu: prefill-sized steps, n_tok > 32, expert types
// on mmq): the slots grouped by expert on the device (moe.cu moe_group) and one grouped mmq launch per product
// (launch.h MatmulGroup). Skipped (visibly) without a GPU.
// Check: the op's output against its decomposition on the same GPU with every matmul forced onto mmq (the kernel
// family whose 64 x 64 tile the grouped launches run): per expert, its slots' tokens in increasing order through
// matmul on the expert's plane (+ the expert's bias), swiglu, matmul down (+ bias), then the weighted sum on the host
// in slot order with the double-precision routing weights. mmq's arithmetic per output does not depend on the
// tile, the token count or the K split beyond f32 summation order (mmq.cuh), and the weights differ from the op's
// f32 ones by ~1e-7 relative: NMSE <= 1e-10 (F16 / BF16 experts 1e-8: at the check), while a row given to the wrong
// expert, a tile's rows shifted or a missing tile moves the output by NMSE > 1e-3. The cases cover experts with no
// rows, experts with more rows than one 64-row tile (several tiles), 8..128 experts, k 1..8, biases, and the tile
// sections' capacity (every slot of a step on one expert). Routing: the test data keep a relative probability gap of 1e-3 between every token's
// k-th and (k+1)-th expert, so the device picks the experts the double-precision routing picks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/backend_test_util.h"
#include "common/moe_test_util.h"

#ifdef KILN_HAVE_CUDA
namespace kiln::cuda {
void matmul_set_override(const char* name);  // matmul_select.cu: force a kernel where it runs ("" = the rule)
}  // namespace kiln::cuda
namespace {
struct ForceMatmul {
  explicit ForceMatmul(const char* name) { kiln::cuda::matmul_set_override(name); }
  ~ForceMatmul() { kiln::cuda::matmul_set_override(""); }
};
}  // namespace
#else
namespace {
struct ForceMatmul {
  explicit ForceMatmul(const char*) {}
};
}  // namespace
#endif

namespace kiln {
namespace {

using test::DevTensor;
using test::dev_f32;
using test::dev_read;
using test::nmse_d;
using test::randn;

struct Case {
  int64_t d, n_ff, n_expert, n_tok;
  int k;
  bool norm, bias;
  float skew;  // > 0: a router bias of skew on expert 0 (with k = 1 every slot goes to it)
};

std::string name(const Case& c, DType gt, DType dt) {
  return "moe_ffn (device-grouped) d=" + std::to_string(c.d) + " ff=" + std::to_string(c.n_ff) + " experts=" +
         std::to_string(c.n_expert) + " n_tok=" + std::to_string(c.n_tok) + " k=" + std::to_string(c.k) +
         (c.norm ? " norm" : "") + (c.bias ? " bias" : "") + (c.skew > 0 ? " skewed" : "") + " gate/up " +
         dtype_name(gt) + " down " + dtype_name(dt);
}

TEST(CudaMoe, DeviceGroupedPathEqualsMmqPerExpert) {
  KILN_NEED_GPU();
  const struct { DType gate_up, down; } types[] = {{DType::Q4_K, DType::Q6_K}, {DType::Q8_0, DType::Q8_0},
                                                   {DType::Q4_0, DType::Q5_K}, {DType::MXFP4, DType::MXFP4},
                                                   {DType::F16, DType::F16}};
  const Case cases[] = {
      {256, 256, 8, 33, 2, true, false, 0.0f},     // the smallest grouped step; ~8 rows per expert
      {256, 512, 4, 150, 2, false, true, 0.0f},    // ~75 rows per expert: two tiles each; biases
      {256, 256, 128, 70, 8, true, false, 0.0f},   // many experts, most with 2..8 rows, some with none
      {256, 256, 32, 97, 1, false, false, 40.0f},  // k = 1, every slot on expert 0: 97 rows in 2 tiles
  };
  uint32_t seed = 900;
  for (const auto& ty : types) {
    std::mt19937 rng(++seed);
    for (const Case& c : cases) {
      const std::string what = name(c, ty.gate_up, ty.down);
      const std::vector<float> x = randn(static_cast<size_t>(c.d * c.n_tok), ++seed);
      std::vector<float> rbias(static_cast<size_t>(c.n_expert), 0.0f);
      rbias[0] = c.skew;
      // Router rows (logits of standard deviation ~3), redrawn until no token routes within the gap of a tie
      // (with 128 experts and k = 8 about one draw in five has such a token).
      std::vector<float> router;
      test::MoeRouting r;
      r.min_gap = 0;
      for (int draw = 0; draw < 20 && !(r.min_gap > 1e-3); ++draw) {
        router = randn(static_cast<size_t>(c.n_expert * c.d), ++seed, 3.0f / std::sqrt(static_cast<float>(c.d)));
        r = test::moe_route(c.d, c.n_expert, c.n_tok, c.k, c.norm, router, x, &rbias);
      }
      ASSERT_GT(r.min_gap, 1e-3) << what << ": 20 router draws all route too close to a tie";
      if (c.skew > 0) {
        int on0 = 0;
        for (int s : r.sel) on0 += s == 0;
        ASSERT_EQ(on0, static_cast<int>(c.n_tok)) << what << ": the skewed router must send every slot to expert 0";
      }
      const std::vector<float> acc0 = randn(static_cast<size_t>(c.d * c.n_tok), ++seed, 0.5f);
      const DevTensor G = test::upload_experts(gpu, ty.gate_up, c.d, c.n_ff, c.n_expert, rng);
      const DevTensor U = test::upload_experts(gpu, ty.gate_up, c.d, c.n_ff, c.n_expert, rng);
      const DevTensor D = test::upload_experts(gpu, ty.down, c.n_ff, c.d, c.n_expert, rng);
      DevTensor GB, UB, DB;
      if (c.bias) {
        GB = dev_f32(gpu, randn(static_cast<size_t>(c.n_ff * c.n_expert), ++seed), c.n_ff, c.n_expert);
        UB = dev_f32(gpu, randn(static_cast<size_t>(c.n_ff * c.n_expert), ++seed), c.n_ff, c.n_expert);
        DB = dev_f32(gpu, randn(static_cast<size_t>(c.d * c.n_expert), ++seed), c.d, c.n_expert);
      }
      const DevTensor R = dev_f32(gpu, router, c.d, c.n_expert), X = dev_f32(gpu, x, c.d, c.n_tok);
      const DevTensor RB = dev_f32(gpu, rbias, c.n_expert);
      const DevTensor A = dev_f32(gpu, acc0, c.d, c.n_tok);
      Backend::MoeFfnArgs a;
      a.x = X.t, a.router = R.t, a.gate = G.t, a.up = U.t, a.down = D.t, a.k = c.k, a.norm_topk = c.norm;
      a.router_bias = RB.t;
      if (c.bias) a.gate_bias = GB.t, a.up_bias = UB.t, a.down_bias = DB.t;
      KILN_ASSERT_OK(gpu.moe_ffn(a, A.t));
      const std::vector<float> got = dev_read<float>(gpu, A);

      std::vector<float> y;
      {
        ForceMatmul mmq("mmq");
        KILN_ASSERT_OK(test::moe_decompose(gpu, a, x, r, &y));
      }
      const std::vector<double> want = test::moe_combine(acc0, y, r, c.n_tok, c.k, c.d);
      // F16 / BF16 experts: h enters the down product rounded to the weight type, and gate / up's f32 sums may be
      // ordered differently in the grouped tile and in the per-expert launch (its K split follows the row count),
      // so an element of h may round one f16 ulp (2^-11 relative) apart: measured 1.4e-10 .. 7.3e-10 on the H100;
      // 1e-8 keeps five orders of magnitude below a misrouted row.
      const bool float_experts = !dtype_traits(ty.gate_up).is_quantized || !dtype_traits(ty.down).is_quantized;
      EXPECT_LE(nmse_d(got, want), float_experts ? 1e-8 : 1e-10) << what << " vs mmq per expert";
    }
  }
}

}  // namespace
}  // namespace kiln
