// The backend op contract on every backend of this build (tests/common/backend_test_util.h), apart from numerics
// (test_backend_ops.cpp): supports(op, types) agrees with what the op does for every (op, type) pair — true: the
// op runs, false: kUnsupported —, malformed shapes are kInvalidArgument, unsupported types kUnsupported (never a
// crash), and copy_between moves bytes exactly between backend instances (two CPU instances; the backend under test
// and a CPU; two instances of the backend under test, through host staging where neither side is host memory).
#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/backend_test_util.h"

namespace kiln {
namespace {

using test::DevTensor;
using test::dev_alloc;
using test::dev_f32;
using test::dev_i32;
using test::dev_read_bytes;
using test::dev_upload;
using test::randn;

class BackendContract : public test::BackendOpsTest {};

// Every type id the traits table knows.
std::vector<DType> all_types() {
  std::vector<DType> v;
  for (uint32_t id = 0; id < kDTypeIdLimit; ++id)
    if (dtype_is_valid(id)) v.push_back(static_cast<DType>(id));
  return v;
}

// Random bytes of a [ne0, ne1] tensor of any type (the values do not matter here, only the status).
DevTensor random_tensor(Backend& be, DType t, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
  const size_t bytes = static_cast<size_t>(dtype_row_bytes(t, ne0).value()) * static_cast<size_t>(ne1 * ne2);
  std::vector<uint8_t> b(bytes);
  std::mt19937 rng(static_cast<uint32_t>(t) + 1);
  for (auto& x : b) x = static_cast<uint8_t>(rng() & 0x3F);  // small bytes: f16 scales stay finite
  return dev_upload(be, t, b, ne0, ne1, ne2);
}

// Runs op `op` with type t as its main operand and b as its second (see Op: kv_store / attention take K type t and
// V type b) on well-formed shapes; the status.
Status run_with_type(Backend& be, Op op, DType t, DType b = DType::F32) {
  const int64_t d = 256;  // a multiple of every block size
  const int64_t n = 3;
  switch (op) {
    case Op::kGetRows: {
      const DevTensor w = random_tensor(be, t, d, 4), ids = dev_i32(be, {3, 0, 2}), out = dev_alloc(be, DType::F32, d, n);
      return be.get_rows(w.t, ids.t, out.t);
    }
    case Op::kMatmul: {
      const DevTensor w = random_tensor(be, t, d, 5), x = dev_f32(be, randn(d * n, 1), d, n), out = dev_alloc(be, DType::F32, 5, n);
      return be.matmul(w.t, x.t, Tensor{}, out.t);
    }
    case Op::kKvStore:
    case Op::kAttention: {
      KvLayer l;
      const DevTensor kc = random_tensor(be, t, d, 8), vc = random_tensor(be, b, d, 8);
      l.k = kc.t, l.v = vc.t, l.n_head_kv = 1, l.head_dim_k = static_cast<int32_t>(d), l.head_dim_v = static_cast<int32_t>(d),
      l.block_size = 4;
      if (op == Op::kKvStore) {
        const DevTensor k = dev_f32(be, randn(d * 2, 2), d, 2), v = dev_f32(be, randn(d * 2, 3), d, 2), s = dev_i32(be, {5, -1});
        return be.kv_store(k.t, v.t, l, s.t);
      }
      const DevTensor q = dev_f32(be, randn(d * 2, 4), d, 2, 1), out = dev_alloc(be, DType::F32, d, 2, 1);
      const DevTensor bt = dev_upload(be, DType::I32, std::vector<int32_t>{1, 0}, 2, 1), tt = dev_i32(be, {0}),
                      kl = dev_i32(be, {6}), z = dev_i32(be, {0}), one = dev_i32(be, {1});
      AttnBatch m;
      m.block_tables = bt.t, m.tok_table = tt.t, m.kv_len = kl.t, m.seq_row = z.t, m.seq_q_start = z.t,
      m.seq_q_len = one.t, m.seq_kv_len = kl.t, m.n_seq = 1, m.max_kv_len = 8, m.max_q_len = 1;
      return be.attention(q.t, l, m, 0.1f, out.t);
    }
    case Op::kCopy: {
      const DevTensor s = random_tensor(be, t, d, n), o = dev_alloc(be, b, d, n);
      return be.copy(s.t, o.t);
    }
    case Op::kArgmax: {
      const DevTensor x = random_tensor(be, t, d, n), out = dev_alloc(be, DType::I32, n);
      return be.argmax(x.t, out.t);
    }
    case Op::kArgmaxMasked: {
      const DevTensor x = random_tensor(be, t, d, n), out = dev_alloc(be, DType::I32, n);
      const DevTensor m = dev_upload(be, DType::I64, std::vector<uint64_t>(static_cast<size_t>((d + 63) / 64 * n), 5),
                                     (d + 63) / 64, n);
      return be.argmax_masked(x.t, m.t, out.t);
    }
    case Op::kRope: {
      const DevTensor x = random_tensor(be, t, d, 2, n), pos = dev_i32(be, {0, 1, 2});
      RopeParams p;
      p.n_rot = 64;
      return be.rope(x.t, pos.t, p);
    }
    default: break;
  }
  // The elementwise ops: x (and the first operand) of type t, the rest f32.
  const DevTensor x = random_tensor(be, t, d, n), y = dev_f32(be, randn(d * n, 5), d, n), out = dev_alloc(be, DType::F32, d, n);
  switch (op) {
    case Op::kRmsNorm: return be.rms_norm(x.t, Tensor{}, 1e-5f, out.t);
    case Op::kSwiglu: return be.swiglu(x.t, y.t, out.t);
    case Op::kAdd: return be.add(x.t, y.t, out.t);
    case Op::kMul: return be.mul(x.t, y.t, out.t);
    case Op::kScale: return be.scale(x.t, 2.0f, out.t);
    case Op::kSoftmax: return be.softmax(x.t, out.t);
    case Op::kLayerNorm: return be.layer_norm(x.t, Tensor{}, Tensor{}, 1e-5f, out.t);
    case Op::kGelu: return be.gelu(x.t, out.t);
    default: return make_error(ErrorCode::kInternal, "test: op %s not covered", op_name(op));
  }
}

TEST_P(BackendContract, SupportsAgreesWithTheOpForEveryType) {
  const Op ops[] = {Op::kGetRows, Op::kRmsNorm, Op::kMatmul, Op::kRope,    Op::kSwiglu,
                    Op::kAdd,     Op::kMul,     Op::kScale,  Op::kSoftmax, Op::kArgmax, Op::kArgmaxMasked, Op::kLayerNorm, Op::kGelu};
  size_t n_supported = 0;
  for (Op op : ops)
    for (DType t : all_types()) {
      const bool sup = be().supports(op, t);
      const Status st = run_with_type(be(), op, t);
      if (sup) {
        ++n_supported;
        EXPECT_TRUE(st.is_ok()) << op_name(op) << " " << dtype_name(t) << ": supports() says yes, the op says "
                                << st.to_string();
      } else {
        EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << op_name(op) << " " << dtype_name(t)
                                                      << ": supports() says no, the op says " << st.to_string();
      }
    }
  // copy: every pair of the float types, a block type and an index type
  const DType cts[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::I32};
  for (DType a : cts)
    for (DType b : cts) {
      const bool sup = be().supports(Op::kCopy, a, b);
      const Status st = run_with_type(be(), Op::kCopy, a, b);
      if (sup)
        EXPECT_TRUE(st.is_ok()) << "copy " << dtype_name(a) << " -> " << dtype_name(b) << ": " << st.to_string();
      else
        EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << "copy " << dtype_name(a) << " -> " << dtype_name(b) << ": "
                                                      << st.to_string();
    }
  // kv_store / attention: K type a, V type b. Every type for both, every pair of the cache types, and each cache
  // type beside a type that is none.
  std::vector<std::pair<DType, DType>> kv;
  for (DType t : all_types()) kv.emplace_back(t, t);
  for (DType a : kKvCacheTypes) {
    for (DType b : kKvCacheTypes)
      if (a != b) kv.emplace_back(a, b);
    kv.emplace_back(a, DType::Q4_K), kv.emplace_back(DType::I32, a);
  }
  for (Op op : {Op::kKvStore, Op::kAttention})
    for (const auto& [a, b] : kv) {
      const bool sup = be().supports(op, a, b);
      const Status st = run_with_type(be(), op, a, b);
      const std::string what = std::string(op_name(op)) + " k " + dtype_name(a) + " v " + dtype_name(b);
      if (sup) {
        EXPECT_TRUE(is_kv_cache_type(a) && is_kv_cache_type(b)) << what << ": not a cache type of the contract";
        EXPECT_TRUE(st.is_ok()) << what << ": supports() says yes, the op says " << st.to_string();
      } else {
        EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << what << ": supports() says no, the op says " << st.to_string();
      }
    }
  // What the engine needs from any backend.
  for (DType t : {DType::F32, DType::F16, DType::Q8_0}) {
    EXPECT_TRUE(be().supports(Op::kKvStore, t, t)) << dtype_name(t);
    EXPECT_TRUE(be().supports(Op::kAttention, t, t)) << dtype_name(t);
  }
  // The CPU stores every cache type, K and V independently.
  if (is_cpu()) {
    for (DType a : kKvCacheTypes)
      for (DType b : kKvCacheTypes) {
        EXPECT_TRUE(be().supports(Op::kKvStore, a, b)) << dtype_name(a) << " " << dtype_name(b);
        EXPECT_TRUE(be().supports(Op::kAttention, a, b)) << dtype_name(a) << " " << dtype_name(b);
      }
  }
  EXPECT_TRUE(be().supports(Op::kCopy, DType::F32, DType::F16));
  EXPECT_GT(n_supported, 30u);
}

TEST_P(BackendContract, BadShapesAreInvalidArgument) {
  Backend& b = be();
  auto expect_invalid = [](const Status& st, const char* what) {
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << what << ": " << st.to_string();
  };
  const DevTensor x64 = dev_f32(b, randn(64 * 2, 1), 64, 2), y64 = dev_f32(b, randn(64 * 2, 2), 64, 2);
  const DevTensor out64 = dev_alloc(b, DType::F32, 64, 2), out63 = dev_alloc(b, DType::F32, 63, 2),
                  out3 = dev_alloc(b, DType::F32, 64, 3);
  // get_rows: ids count vs dst rows; dst row width vs weight row
  {
    const DevTensor w = dev_f32(b, randn(64 * 9, 3), 64, 9), two = dev_i32(b, {0, 1});
    expect_invalid(b.get_rows(w.t, two.t, out3.t), "get_rows: 2 ids, 3 dst rows");
    expect_invalid(b.get_rows(w.t, two.t, out63.t), "get_rows: dst row 63, weight row 64");
  }
  // rms_norm: x vs dst, weight length
  {
    const DevTensor w63 = dev_f32(b, randn(63, 4), 63);
    expect_invalid(b.rms_norm(x64.t, Tensor{}, 1e-5f, out3.t), "rms_norm: x [64,2] dst [64,3]");
    expect_invalid(b.rms_norm(x64.t, w63.t, 1e-5f, out64.t), "rms_norm: w [63]");
  }
  // matmul: n_in, dst shape, aliasing, bias
  {
    const DevTensor w = dev_f32(b, randn(32 * 4, 5), 32, 4), w64 = dev_f32(b, randn(64 * 4, 6), 64, 4);
    const DevTensor o4 = dev_alloc(b, DType::F32, 4, 2), o5 = dev_alloc(b, DType::F32, 5, 2), b3 = dev_f32(b, randn(3, 7), 3);
    expect_invalid(b.matmul(w.t, x64.t, Tensor{}, o4.t), "matmul: w n_in 32, x rows of 64");
    expect_invalid(b.matmul(w64.t, x64.t, Tensor{}, o5.t), "matmul: dst [5,2] for 4 outputs");
    expect_invalid(b.matmul(w64.t, x64.t, b3.t, o4.t), "matmul: bias [3] for 4 outputs");
    const DevTensor sq = dev_f32(b, randn(64 * 64, 8), 64, 64), xs = dev_f32(b, randn(64 * 64, 9), 64, 64);
    expect_invalid(b.matmul(sq.t, xs.t, Tensor{}, xs.t), "matmul: dst aliases x");
  }
  // rope: n_rot odd / > head_dim / 0, pos count, freq_factors too short
  {
    const DevTensor x = dev_f32(b, randn(64 * 2 * 2, 10), 64, 2, 2), pos = dev_i32(b, {0, 1}), pos3 = dev_i32(b, {0, 1, 2});
    const DevTensor ff = dev_f32(b, randn(8, 11), 8);
    for (int n_rot : {65, 66, 63, 0}) {
      RopeParams p;
      p.n_rot = n_rot;
      expect_invalid(b.rope(x.t, pos.t, p), ("rope: n_rot " + std::to_string(n_rot) + " with head_dim 64").c_str());
    }
    RopeParams p;
    p.n_rot = 64;
    expect_invalid(b.rope(x.t, pos3.t, p), "rope: 3 positions for 2 tokens");
    p.freq_factors = ff.t;
    expect_invalid(b.rope(x.t, pos.t, p), "rope: 8 freq factors for n_rot 64");
  }
  // kv_store / attention
  {
    KvLayer l;
    const DevTensor kc = dev_alloc(b, DType::F16, 64, 32), vc = dev_alloc(b, DType::F16, 64, 32);
    l.k = kc.t, l.v = vc.t, l.n_head_kv = 1, l.head_dim_k = 64, l.head_dim_v = 64, l.block_size = 16;
    const DevTensor k = dev_f32(b, randn(64, 12), 64), k48 = dev_f32(b, randn(48, 13), 48), s1 = dev_i32(b, {0}),
                    s2 = dev_i32(b, {0, 1});
    expect_invalid(b.kv_store(k48.t, k.t, l, s1.t), "kv_store: k row 48 for a 64-wide cache");
    expect_invalid(b.kv_store(k.t, k.t, l, s2.t), "kv_store: 2 slots for 1 token");
    const DevTensor bt = dev_upload(b, DType::I32, std::vector<int32_t>{0, 1}, 2, 1), tt = dev_i32(b, {0}),
                    kl = dev_i32(b, {20}), z = dev_i32(b, {0}), one = dev_i32(b, {1});
    AttnBatch m;
    m.block_tables = bt.t, m.tok_table = tt.t, m.kv_len = kl.t, m.seq_row = z.t, m.seq_q_start = z.t,
    m.seq_q_len = one.t, m.seq_kv_len = kl.t, m.n_seq = 1, m.max_kv_len = 32, m.max_q_len = 1;
    const DevTensor q3 = dev_f32(b, randn(64 * 3, 14), 64, 3, 1), o3 = dev_alloc(b, DType::F32, 64, 3, 1);
    KvLayer l2 = l;
    l2.n_head_kv = 2, l2.head_dim_k = l2.head_dim_v = 32;  // same 64-wide rows, 2 kv heads of 32
    const DevTensor q32 = dev_f32(b, randn(32 * 3, 15), 32, 3, 1), o32 = dev_alloc(b, DType::F32, 32, 3, 1);
    expect_invalid(b.attention(q32.t, l2, m, 1.0f, o32.t), "attention: 3 heads over 2 kv heads");
    const DevTensor q48 = dev_f32(b, randn(48 * 3, 16), 48, 3, 1);
    expect_invalid(b.attention(q48.t, l, m, 1.0f, o3.t), "attention: q head dim 48, cache 64");
    const DevTensor o2 = dev_alloc(b, DType::F32, 64, 2, 1);
    expect_invalid(b.attention(q3.t, l, m, 1.0f, o2.t), "attention: dst of 2 heads for 3");
    const DevTensor tt2 = dev_i32(b, {0, 0});
    AttnBatch m2 = m;
    m2.tok_table = tt2.t;
    expect_invalid(b.attention(q3.t, l, m2, 1.0f, o3.t), "attention: tok_table of 2 for 1 token");
  }
  // elementwise: shapes that neither match nor broadcast
  {
    const DevTensor y7 = dev_f32(b, randn(7, 17), 7), x8 = dev_f32(b, randn(8, 18), 8), y3 = dev_f32(b, randn(64 * 3, 19), 64, 3);
    expect_invalid(b.add(x8.t, y7.t, x8.t), "add: [8] + [7]");
    expect_invalid(b.mul(x64.t, y3.t, out64.t), "mul: [64,2] * [64,3]");
    expect_invalid(b.swiglu(x64.t, y3.t, out64.t), "swiglu: gate [64,2] up [64,3]");
    expect_invalid(b.scale(x64.t, 1.0f, out3.t), "scale: dst [64,3]");
    expect_invalid(b.softmax(x64.t, out63.t), "softmax: dst [63,2]");
    const DevTensor i3 = dev_alloc(b, DType::I32, 3);
    expect_invalid(b.argmax(x64.t, i3.t), "argmax: 3 outputs for 2 rows");
    const DevTensor h3 = dev_alloc(b, DType::F16, 64, 3);
    expect_invalid(b.copy(x64.t, h3.t), "copy: [64,2] -> [64,3]");
  }
  (void)y64;
}

TEST_P(BackendContract, UnsupportedTypesAreUnsupported) {
  Backend& b = be();
  const DevTensor x = dev_f32(b, randn(64, 1), 64), y = dev_alloc(b, DType::F32, 4);
  const DevTensor wi = random_tensor(b, DType::I32, 64, 4);
  EXPECT_EQ(b.matmul(wi.t, x.t, Tensor{}, y.t).code(), ErrorCode::kUnsupported) << "matmul of an i32 weight";
  KvLayer l;
  const DevTensor kc = random_tensor(b, DType::Q4_K, 256, 8), vc = random_tensor(b, DType::F16, 256, 8);
  l.k = kc.t, l.v = vc.t, l.n_head_kv = 1, l.head_dim_k = 256, l.head_dim_v = 256, l.block_size = 4;
  const DevTensor x256 = dev_f32(b, randn(256, 1), 256), s = dev_i32(b, {0});
  const Status st = b.kv_store(x256.t, x256.t, l, s.t);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << "kv_store into a q4_K cache";
  EXPECT_NE(st.message().find(std::string("kv_store: cache types k q4_K / v f16: backend ") + b.name() + " stores " +
                              stored_cache_types(b) + " caches"), std::string::npos) << st.message();
  // Heads that are not whole blocks of their type: 2 heads of 48 values in a q8_0 row of 96 (3 blocks of 32).
  const DevTensor k48 = random_tensor(b, DType::F16, 96, 8), v48 = random_tensor(b, DType::Q8_0, 96, 8);
  KvLayer l48;
  l48.k = k48.t, l48.v = v48.t, l48.n_head_kv = 2, l48.head_dim_k = 48, l48.head_dim_v = 48, l48.block_size = 4;
  const DevTensor x48 = dev_f32(b, randn(96, 1), 96);
  if (b.supports(Op::kKvStore, DType::F16, DType::Q8_0)) {
    const Status hs = b.kv_store(x48.t, x48.t, l48, s.t);
    EXPECT_EQ(hs.code(), ErrorCode::kUnsupported) << "a 48-value head of q8_0";
    EXPECT_NE(hs.message().find("head dims 48 (k f16) / 48 (v q8_0) are not whole blocks"), std::string::npos)
        << hs.message();
  }
  const DevTensor q = random_tensor(b, DType::Q8_0, 64), o = dev_alloc(b, DType::F32, 64);
  EXPECT_EQ(b.copy(q.t, o.t).code(), ErrorCode::kUnsupported) << "copy q8_0 -> f32";
  const DevTensor h = random_tensor(b, DType::F16, 64), ho = dev_alloc(b, DType::F32, 64);
  EXPECT_EQ(b.rms_norm(h.t, Tensor{}, 1e-5f, ho.t).code(), ErrorCode::kUnsupported) << "rms_norm of f16";
}

// ---- copy_between -----------------------------------------------------------------------------------------------

void expect_copy_between(Backend& from, Backend& to, DType t, const std::string& what, bool with_bounce) {
  const int64_t d = t == DType::Q4_K ? 256 : 96, n = 5;
  const std::vector<uint8_t> bytes = test::quantize_rows(t, randn(static_cast<size_t>(d * n), 90), d);
  const DevTensor src = dev_upload(from, t, bytes, d, n), dst = dev_alloc(to, t, d, n);
  std::vector<uint8_t> bounce(with_bounce ? bytes.size() : 0);
  const Status st = copy_between(src.t, dst.t, with_bounce ? bounce.data() : nullptr, bounce.size());
  ASSERT_TRUE(st.is_ok()) << what << ": " << st.to_string();
  EXPECT_EQ(dev_read_bytes(to, dst), bytes) << what << " " << dtype_name(t);
}

TEST(BackendCopyBetween, TwoCpuInstances) {
  auto a = test::create_test_backend("cpu"), b = test::create_test_backend("cpu");
  ASSERT_TRUE(a && b);
  for (DType t : {DType::F32, DType::F16, DType::Q4_K}) {
    expect_copy_between(**a, **b, t, "cpu -> another cpu", false);
    expect_copy_between(**b, **a, t, "cpu <- another cpu", false);
    expect_copy_between(**a, **a, t, "cpu -> itself (copy)", false);
  }
  // Different types or shapes across backends: unsupported (conversion is copy()'s, on one backend).
  const DevTensor s = dev_f32(**a, randn(64, 1), 64), d16 = dev_alloc(**b, DType::F16, 64), d32 = dev_alloc(**b, DType::F32, 32, 2);
  EXPECT_EQ(copy_between(s.t, d16.t, nullptr, 0).code(), ErrorCode::kUnsupported);
  const DevTensor w = dev_f32(**a, randn(64 * 2, 2), 64, 2), d2 = dev_alloc(**b, DType::F32, 64, 2, 1, 16);
  EXPECT_EQ(copy_between(w.t, d2.t, nullptr, 0).code(), ErrorCode::kUnsupported) << "strided destination";
  (void)d32;
}

TEST_P(BackendContract, CopyBetweenThisBackendAndOthers) {
  auto cpu = test::create_test_backend("cpu");
  ASSERT_TRUE(cpu) << cpu.status().to_string();
  auto other = test::create_test_backend(GetParam());  // a second instance of the backend under test
  ASSERT_TRUE(other) << other.status().to_string();
  for (DType t : {DType::F32, DType::BF16, DType::Q8_0}) {
    expect_copy_between(be(), **cpu, t, GetParam() + " -> cpu", false);
    expect_copy_between(**cpu, be(), t, "cpu -> " + GetParam(), false);
    expect_copy_between(be(), **other, t, GetParam() + " -> another " + GetParam(), true);
  }
  if (!be().host_memory()) {  // device to device without staging: an error naming the need, not a crash
    const DevTensor s = dev_f32(be(), randn(64, 3), 64), d = dev_alloc(**other, DType::F32, 64);
    EXPECT_EQ(copy_between(s.t, d.t, nullptr, 0).code(), ErrorCode::kInvalidArgument);
  }
}

TEST(BackendRegistry, EveryFactoryIsUnderTest) {
  const std::vector<std::string> ids = test::backend_ids();
  for (const BackendFactory* f : backend_factories()) {
    bool found = false;
    for (const std::string& id : ids) found = found || id.rfind(f->kind, 0) == 0;
    EXPECT_TRUE(found) << "factory " << f->kind << " has no test instance";
  }
  EXPECT_NE(std::find(ids.begin(), ids.end(), "cpu"), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), test::kCpuRefId), ids.end());
  auto devs = list_devices();
  if (!devs) GTEST_SKIP() << "skipped: the device listing failed: " << devs.status().to_string();
  for (const DeviceInfo& d : *devs) EXPECT_NE(std::find(ids.begin(), ids.end(), d.id), ids.end()) << d.id;
}

KILN_INSTANTIATE_BACKENDS(BackendContract);

}  // namespace
}  // namespace kiln
