// qwen3moe loading and running without the fixtures: a small file written here (f32 weights, the committed llama
// fixture's tokenizer; 2 layers, n_embd 64, 2 heads of 32 sharing 1 KV head, 4 experts of width 32, 2 per token).
//   - hyperparameters and the expert-width default; bad files (missing keys, k > n_expert, wrong or missing expert
//     tensors) fail with errors naming the key or the tensor;
//   - a backend whose supports() says no to moe_ffn refuses the file at load, before importing any weight, naming
//     the tensor, the backend and the op (what the CUDA backend does until it runs the op);
//   - the fast CPU backend and the scalar reference give the same logits (f32 weights: no activation is quantized,
//     so they differ by f32 summation order only; NMSE <= 1e-10, while one token routed to another expert moves its
//     row by NMSE > 1e-3), whole sequence in one step and one token at a time.
// Parity with llama.cpp on the qwen3moe fixtures is in test_model_parity.cpp (models-moe).
#include <cstdio>
#include <deque>
#include <functional>
#include <random>

#include "common/engine_test_util.h"
#include "common/test_util.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

using EditKv = std::function<void(gguf::Writer&)>;
using EditTensor = std::function<bool(std::string&, std::vector<int64_t>&)>;

// Writes the small qwen3moe file without the metadata key qwen3moe.<omit>, with edit_kv applied to its metadata and
// its tensors filtered / reshaped by edit_tensor (false drops one; a changed shape keeps the data of the original
// size); returns the path.
std::string write_moe(const std::string& name, const EditKv& edit_kv = nullptr, const EditTensor& edit_tensor = nullptr,
                      const std::string& omit = "") {
  static gguf::File vocab = gguf::File::open(test::data_path("models/fixture-llama-f16.gguf")).value();
  const int64_t e = 64, hd = 32, nh = 2, nkv = 1, x = 4, f = 32, nv = 1000;
  gguf::Writer w;
  for (const auto& kv : vocab.kvs())
    if (kv.key.rfind("tokenizer.", 0) == 0) w.set(kv.key, kv.value);
  const std::string a = "qwen3moe.";
  w.set("general.architecture", std::string("qwen3moe"));
  for (const auto& [k, v] : std::vector<std::pair<std::string, int64_t>>{
           {"context_length", 256}, {"embedding_length", e}, {"block_count", 2}, {"feed_forward_length", 2 * f},
           {"attention.head_count", nh}, {"attention.head_count_kv", nkv}, {"attention.key_length", hd},
           {"attention.value_length", hd}, {"expert_count", x}, {"expert_used_count", 2},
           {"expert_feed_forward_length", f}})
    if (k != omit) w.set(a + k, static_cast<uint32_t>(v));
  w.set(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.set(a + "rope.freq_base", 1e6f);
  if (edit_kv) edit_kv(w);

  std::deque<std::vector<float>> data;  // borrowed by the writer until write() returns
  std::mt19937 rng(7);
  auto add = [&](std::string tn, std::vector<int64_t> ne, float sigma, float center = 0.0f) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::normal_distribution<float> dist(center, sigma);
    data.emplace_back(static_cast<size_t>(n));
    for (float& v : data.back()) v = dist(rng);
    if (edit_tensor && !edit_tensor(tn, ne)) return;
    EXPECT_TRUE(w.add_tensor(tn, DType::F32, ne, data.back().data()).is_ok()) << tn;
  };
  const float s = 1.0f / 8;  // 1 / sqrt(n_embd)
  add("token_embd.weight", {e, nv}, 1.0f);
  add("output_norm.weight", {e}, 0.1f, 1.0f);
  add("output.weight", {e, nv}, 3 * s);
  for (int il = 0; il < 2; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    add(b + "attn_norm.weight", {e}, 0.1f, 1.0f);
    add(b + "attn_q.weight", {e, nh * hd}, 1.5f * s);
    add(b + "attn_k.weight", {e, nkv * hd}, 1.5f * s);
    add(b + "attn_v.weight", {e, nkv * hd}, s);
    add(b + "attn_output.weight", {nh * hd, e}, 0.7f * s);
    add(b + "attn_q_norm.weight", {hd}, 0.1f, 1.0f);
    add(b + "attn_k_norm.weight", {hd}, 0.1f, 1.0f);
    add(b + "ffn_norm.weight", {e}, 0.1f, 1.0f);
    add(b + "ffn_gate_inp.weight", {e, x}, 8 * s);
    add(b + "ffn_gate_exps.weight", {e, f, x}, s);
    add(b + "ffn_up_exps.weight", {e, f, x}, s);
    add(b + "ffn_down_exps.weight", {f, e, x}, 0.9f / std::sqrt(static_cast<float>(f)));
  }
  const std::string path = test::temp_dir() + "kiln-moe-" + name + ".gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

Status load_status(const std::string& path, const LoadOptions& lo = LoadOptions{}) {
  auto m = Model::load(path, lo);
  return m.is_ok() ? Status::ok() : m.status();
}

void expect_error(const Status& st, ErrorCode code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << "wanted '" << needle << "' in: " << st.to_string();
}

TEST(ModelMoe, HParamsAndTheExpertWidthDefault) {
  auto m = Model::load(write_moe("ok"), LoadOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const HParams& hp = m.value()->hparams();
  EXPECT_EQ(hp.arch, "qwen3moe");
  EXPECT_EQ(hp.n_expert, 4);
  EXPECT_EQ(hp.n_expert_used, 2);
  EXPECT_EQ(hp.n_ff_exp, 32);
  EXPECT_EQ(hp.rope_type, RopeType::kNeox);
  EXPECT_FALSE(hp.tied_embeddings);
  // Without expert_feed_forward_length: feed_forward_length / expert_used_count (64 / 2), as llama.cpp.
  auto d = Model::load(write_moe("nowidth", nullptr, nullptr, "expert_feed_forward_length"), LoadOptions{});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(d.value()->hparams().n_ff_exp, 32);
}

TEST(ModelMoe, BadFilesNameTheKeyOrTensor) {
  expect_error(load_status(write_moe("nocount", nullptr, nullptr, "expert_count")), ErrorCode::kNotFound,
               "missing metadata key 'qwen3moe.expert_count'");
  expect_error(load_status(write_moe("noused", nullptr, nullptr, "expert_used_count")), ErrorCode::kNotFound,
               "missing metadata key 'qwen3moe.expert_used_count'");
  expect_error(load_status(write_moe("count0", [](gguf::Writer& w) { w.set("qwen3moe.expert_count", uint32_t{0}); })),
               ErrorCode::kInvalidFile, "qwen3moe.expert_count is 0");
  expect_error(load_status(write_moe("used5", [](gguf::Writer& w) { w.set("qwen3moe.expert_used_count", uint32_t{5}); })),
               ErrorCode::kInvalidFile, "qwen3moe.expert_used_count is 5: must be in [1, qwen3moe.expert_count = 4]");
  expect_error(load_status(write_moe("count3", [](gguf::Writer& w) { w.set("qwen3moe.expert_count", uint32_t{3}); })),
               ErrorCode::kInvalidFile, "tensor 'blk.0.ffn_gate_inp.weight' has shape");
  expect_error(load_status(write_moe("noinp", nullptr, [](std::string& n, std::vector<int64_t>&) {
                 return n != "blk.1.ffn_gate_inp.weight";
               })),
               ErrorCode::kNotFound, "tensor 'blk.1.ffn_gate_inp.weight' is missing (architecture qwen3moe needs it)");
  expect_error(load_status(write_moe("downshape", nullptr, [](std::string& n, std::vector<int64_t>& ne) {
                 if (n == "blk.0.ffn_down_exps.weight") ne = {64, 32, 4};  // gate's shape: transposed planes
                 return true;
               })),
               ErrorCode::kInvalidFile, "tensor 'blk.0.ffn_down_exps.weight' has shape [64, 32, 4");
  expect_error(load_status(write_moe("noexps", nullptr, [](std::string& n, std::vector<int64_t>&) {
                 return n.find("_exps.") == std::string::npos;
               })),
               ErrorCode::kNotFound, "tensor 'blk.0.ffn_gate_exps.weight' is missing");
}

// Forwards everything to a CPU backend except one op (default moe_ffn), which it does not run (and says so in
// supports()).
class NoMoeBackend final : public Backend {
 public:
  explicit NoMoeBackend(Op refused = Op::kMoeFfn)
      : cpu_(make_cpu_backend({1, false})), refused_(refused),
        name_(refused == Op::kMoeFfn ? "no-moe" : std::string("no-") + op_name(refused)) {}
  const char* name() const override { return name_.c_str(); }
  bool host_memory() const override { return true; }
  bool supports(Op op, DType a, DType b) const override { return op != refused_ && cpu_->supports(op, a, b); }
  Status moe_ffn(const MoeFfnArgs& a, const Tensor& acc) override { return cpu_->moe_ffn(a, acc); }
  Result<std::unique_ptr<Buffer>> alloc(size_t n) override { return cpu_->alloc(n); }
  Status write(const Tensor& d, size_t o, const void* s, size_t n) override { return cpu_->write(d, o, s, n); }
  Status read(const Tensor& s, size_t o, void* d, size_t n) override { return cpu_->read(s, o, d, n); }
  Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t n) override {
    ++imports;
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
  int imports = 0;

 private:
  std::unique_ptr<Backend> cpu_;
  Op refused_;
  std::string name_;
};

TEST(ModelMoe, ABackendWithoutMoeFfnRefusesTheFileBeforeImporting) {
  auto be = std::make_shared<NoMoeBackend>();
  LoadOptions lo;
  lo.placement.layers = {be, be};
  lo.placement.input = lo.placement.output = be;
  const Status st = load_status(write_moe("nomoe"), lo);
  expect_error(st, ErrorCode::kUnsupported,
               "tensor 'blk.0.ffn_gate_exps.weight' is a mixture-of-experts stack: backend no-moe does not run the "
               "moe_ffn op");
  EXPECT_EQ(be->imports, 0) << "weights were imported before the check";
}

TEST(ModelMoe, FastCpuMatchesTheReference) {
  const std::string path = write_moe("run");
  LoadOptions fast, ref;
  fast.devices.device = ref.devices.device = "cpu";
  fast.devices.backend.n_threads = 2;
  ref.devices.backend.reference = true;
  auto a = Model::load(path, fast), b = Model::load(path, ref);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string() << " / " << b.status().to_string();
  const std::vector<int32_t> ids = {997, 331, 970, 154, 404, 666, 49, 74, 840, 548, 96, 374, 596};
  const int64_t nv = a.value()->hparams().n_vocab;
  for (int nb : {13, 1}) {
    std::vector<float> la, lb;
    for (auto* m : {&a, &b}) {
      KvCacheConfig kc;
      kc.n_ctx = 64;
      kc.batch_tokens = 16;
      kc.max_outputs = 16;
      auto e = Engine::create(*m->value(), kc);
      ASSERT_TRUE(e.is_ok()) << e.status().to_string();
      const Status st = test::run_all(*e.value(), ids, nb, m == &a ? &la : &lb);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    ASSERT_EQ(la.size(), ids.size() * nv);
    ASSERT_EQ(lb.size(), la.size());
    double mx = 0;
    for (size_t r = 0; r < ids.size(); ++r) mx = std::max(mx, test::nmse(la.data() + r * nv, lb.data() + r * nv, nv));
    std::printf("[moe fast-vs-ref] b=%d max NMSE %.3e\n", nb, mx);
    EXPECT_LE(mx, 1e-10) << "b=" << nb;
  }
}

// gpt-oss (model/arch/gptoss.cpp) on the committed fixture (tests/data/models-gptoss; parity with llama.cpp is in
// test_model_parity.cpp): the hyperparameters it derives, bad files, and backends without YaRN or sinks.
const std::string kGptOss = "models-gptoss/fixture-gptoss-f16.gguf";

// The fixture rewritten with edit_kv applied to its metadata and without the tensors drop() names.
std::string write_gptoss(const std::string& name, const EditKv& edit_kv,
                         const std::function<bool(const std::string&)>& drop = nullptr) {
  static gguf::File src = gguf::File::open(test::data_path(kGptOss)).value();
  gguf::Writer w;
  for (const auto& kv : src.kvs()) w.set(kv.key, kv.value);
  if (edit_kv) edit_kv(w);
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (drop && drop(t.name)) continue;
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok()) << t.name;
  }
  const std::string path = test::temp_dir() + "kiln-gptoss-" + name + ".gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

TEST(ModelGptOss, HParamsOfTheFixture) {
  auto m = Model::load(test::data_path(kGptOss), LoadOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const HParams& hp = m.value()->hparams();
  EXPECT_EQ(hp.arch, "gpt-oss");
  EXPECT_EQ(hp.n_expert, 4);
  EXPECT_EQ(hp.n_expert_used, 2);
  EXPECT_EQ(hp.n_ff_exp, 64);
  EXPECT_EQ(hp.sliding_window, 16);
  EXPECT_EQ(hp.layer_swa, (std::vector<uint8_t>{1, 0}));  // even layers local
  EXPECT_EQ(hp.rope_freq_base_swa, hp.rope_freq_base);
  EXPECT_TRUE(hp.attn_sinks);
  EXPECT_FLOAT_EQ(hp.attn_scale, 0.125f);  // 1 / sqrt(n_rot 64)
  // YaRN factor 32 from 4096 positions: llama.cpp's attn_factor is 1 above factor 1 (the op applies 1 + 0.1 ln 32).
  EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.0f / 32);
  EXPECT_EQ(hp.rope_ext_factor, 1.0f);
  EXPECT_EQ(hp.rope_attn_factor, 1.0f);
  EXPECT_EQ(hp.n_ctx_orig_yarn, 4096);
  EXPECT_FALSE(hp.tied_embeddings);
}

TEST(ModelGptOss, BadFilesNameTheKeyOrTensor) {
  expect_error(load_status(write_gptoss("nowindow", [](gguf::Writer& w) { w.remove("gpt-oss.attention.sliding_window"); })),
               ErrorCode::kNotFound, "gpt-oss.attention.sliding_window");
  expect_error(load_status(write_gptoss("logmul", [](gguf::Writer& w) {
                 w.set("gpt-oss.rope.scaling.yarn_log_multiplier", 0.1f);
               })),
               ErrorCode::kUnsupported, "gpt-oss.rope.scaling.yarn_log_multiplier 0.1 is not supported");
  expect_error(load_status(write_gptoss("longrope", [](gguf::Writer& w) {
                 w.set("gpt-oss.rope.scaling.type", std::string("longrope"));
               })),
               ErrorCode::kUnsupported, "'longrope' is not supported (none, linear, llama3, yarn)");
  expect_error(load_status(write_gptoss("nosinks", nullptr, [](const std::string& n) {
                 return n == "blk.1.attn_sinks.weight";
               })),
               ErrorCode::kNotFound, "tensor 'blk.1.attn_sinks.weight' is missing (architecture gpt-oss needs it)");
  expect_error(load_status(write_gptoss("nopostnorm", nullptr, [](const std::string& n) {
                 return n == "blk.0.post_attention_norm.weight";
               })),
               ErrorCode::kNotFound, "tensor 'blk.0.post_attention_norm.weight' is missing");
  expect_error(load_status(write_gptoss("noexpbias", nullptr, [](const std::string& n) {
                 return n == "blk.0.ffn_up_exps.bias";
               })),
               ErrorCode::kNotFound, "tensor 'blk.0.ffn_up_exps.bias' is missing");
}

// A backend without YaRN rope or without attention sinks (the CUDA backend until it runs them) refuses the model
// when its state is made, naming the feature, instead of running plain RoPE or sink-less softmax.
TEST(ModelGptOss, ABackendWithoutYarnOrSinksRefusesIt) {
  for (const auto& [op, needle] : {std::make_pair(Op::kRopeYarn, "uses YaRN RoPE scaling, which backend no-rope_yarn"),
                                   std::make_pair(Op::kAttentionSinks,
                                                  "layer 0 of gpt-oss uses attention sinks, which backend "
                                                  "no-attention_sinks does not run")}) {
    auto be = std::make_shared<NoMoeBackend>(op);
    LoadOptions lo;
    lo.placement.layers = {be, be};
    lo.placement.input = lo.placement.output = be;
    auto m = Model::load(test::data_path(kGptOss), lo);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    KvCacheConfig kc;
    kc.n_ctx = 64;
    auto e = Engine::create(*m.value(), kc);
    ASSERT_FALSE(e.is_ok()) << op_name(op);
    expect_error(e.status(), ErrorCode::kUnsupported, needle);
  }
}

}  // namespace
}  // namespace kiln
