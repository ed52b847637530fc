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

const char* const kGptOssPath = "models-gptoss/fixture-gptoss-f16.gguf";

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

// The largest per-row NMSE between two models' logits over ids, fed nb tokens per step (a 64-token context).
double max_row_nmse(Model& a, Model& b, const std::vector<int32_t>& ids, int nb) {
  std::vector<float> la, lb;
  for (Model* m : {&a, &b}) {
    KvCacheConfig kc;
    kc.n_ctx = 64;
    kc.batch_tokens = 16;
    kc.max_outputs = 16;
    auto e = Engine::create(*m, kc);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (!e.is_ok()) return 1e30;
    const Status st = test::run_all(*e.value(), ids, nb, m == &a ? &la : &lb);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return 1e30;
  }
  const int64_t nv = a.hparams().n_vocab;
  EXPECT_EQ(la.size(), ids.size() * nv);
  EXPECT_EQ(lb.size(), la.size());
  if (la.size() != ids.size() * nv || lb.size() != la.size()) return 1e30;
  double mx = 0;
  for (size_t r = 0; r < ids.size(); ++r) mx = std::max(mx, test::nmse(la.data() + r * nv, lb.data() + r * nv, nv));
  return mx;
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
// supports()). host = false: it says its memory is not host memory, as a GPU's (activations then cross to and from
// it through read()/write(), and steps are padded to buckets), while its data still lives on the host.
class NoMoeBackend final : public Backend {
 public:
  explicit NoMoeBackend(Op refused = Op::kMoeFfn, bool host = true)
      : cpu_(make_cpu_backend({1, false})), refused_(refused), host_(host),
        name_(refused == Op::kMoeFfn ? "no-moe" : std::string("no-") + op_name(refused)) {}
  const char* name() const override { return name_.c_str(); }
  bool host_memory() const override { return host_; }
  bool supports(Op op, DType a, DType b) const override { return op != refused_ && cpu_->supports(op, a, b); }
  Status moe_ffn(const MoeFfnArgs& a, const Tensor& acc) override {
    ++moe_calls;
    return cpu_->moe_ffn(a, acc);
  }
  Result<std::unique_ptr<Buffer>> alloc(size_t n) override { return cpu_->alloc(n); }
  Status write(const Tensor& d, size_t o, const void* s, size_t n) override { return cpu_->write(d, o, s, n); }
  Status read(const Tensor& s, size_t o, void* d, size_t n) override { return cpu_->read(s, o, d, n); }
  Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t n) override {
    ++imports;
    if (ne[2] > 1) ++stack_imports;  // an expert stack [.., .., n_expert]
    if (ne[0] == 64 && ne[1] == 4 && ne[2] == 1) ++router_imports;  // the small file's router [n_embd, n_expert]
    auto w = cpu_->import_weight(t, ne, host, n);
    if (w) w->backend = this;  // the weight is this backend's (the model compares backends, e.g. for a tied output)
    return w;
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
  int imports = 0, stack_imports = 0, router_imports = 0, moe_calls = 0;

 private:
  std::unique_ptr<Backend> cpu_;
  Op refused_;
  bool host_;
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

// --cpu-moe as the model layer sees it: the layers on a device backend that does not run moe_ffn (NoMoeBackend
// claiming device memory: the stand-in for a GPU), the experts of both layers on a CPU backend (Placement::experts).
// The file loads (the device would refuse it holding the experts, test above), the device imports no expert stack
// and no router and never runs moe_ffn, and the logits equal the CPU model's bit for bit: the same kernels on the
// same rows, the experts' sum coming back into zeros and added once on the layer's backend (what moe_ffn itself
// adds). Whole sequence in one step, 5 tokens a step and 1.
TEST(ModelMoe, ExpertsOnTheCpuBesideADeviceWithoutMoeFfn) {
  const std::string path = write_moe("apart");
  auto dev = std::make_shared<NoMoeBackend>(Op::kMoeFfn, /*host=*/false);
  std::shared_ptr<Backend> cpu(make_cpu_backend({2, false}));
  LoadOptions apart, one;
  apart.placement.layers = {dev, dev};
  apart.placement.experts = {cpu, cpu};
  apart.placement.input = apart.placement.output = dev;
  one.devices.device = "cpu";
  one.devices.backend.n_threads = 2;
  auto a = Model::load(path, apart), b = Model::load(path, one);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(dev->stack_imports, 0) << "an expert stack was imported on the device";
  EXPECT_EQ(dev->router_imports, 0) << "a router was imported on the device";
  EXPECT_GT(dev->imports, 0);
  EXPECT_EQ(a.value()->placement().describe(), "no-moe #0: input + layers 0-1 + output; cpu #1: experts of layers 0-1");
  const std::vector<int32_t> ids = {997, 331, 970, 154, 404, 666, 49, 74, 840, 548, 96, 374, 596};
  for (int nb : {13, 5, 1}) {
    const double mx = max_row_nmse(*a.value(), *b.value(), ids, nb);
    EXPECT_EQ(mx, 0.0) << "b=" << nb;
  }
  EXPECT_EQ(dev->moe_calls, 0) << "moe_ffn ran on the device";
}

// The expert flags resolved against a file's tensor names (backend/placement.h): which layers' experts go to the
// CPU, and the errors that name the flag.
TEST(ExpertPlacement, FlagsSelectTheLayersOfExpertTensors) {
  auto f = gguf::File::open(test::data_path(kGptOssPath));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::vector<std::string> names;
  for (const gguf::TensorInfo& t : f.value().tensors()) names.push_back(t.name);
  auto layers = [&](int64_t n_cpu_moe, const std::vector<std::string>& ot) -> Result<std::vector<bool>> {
    ExpertRequest r;
    r.n_cpu_moe = n_cpu_moe;
    for (const std::string& v : ot) {
      KILN_ASSIGN_OR_RETURN(std::vector<TensorOverride> o, parse_tensor_overrides(v));
      r.overrides.insert(r.overrides.end(), o.begin(), o.end());
    }
    return resolve_expert_layers(r, names, 2);
  };
  using V = std::vector<bool>;
  EXPECT_EQ(layers(0, {}).value(), (V{false, false}));
  EXPECT_EQ(layers(1, {}).value(), (V{true, false}));                       // --n-cpu-moe 1
  EXPECT_EQ(layers(99, {}).value(), (V{true, true}));                       // more than the model has: all
  EXPECT_EQ(layers(ExpertRequest::kAllLayers, {}).value(), (V{true, true}));  // --cpu-moe
  EXPECT_EQ(layers(0, {"exps=CPU"}).value(), (V{true, true}));
  EXPECT_EQ(layers(0, {"blk\\.1\\.ffn_up_exps=cpu"}).value(), (V{false, true}));  // one stack moves the layer's
  EXPECT_EQ(layers(0, {"blk\\.1\\.ffn_down_exps\\.bias=Cpu"}).value(), (V{false, true}));
  EXPECT_EQ(layers(0, {"blk\\.0\\.ffn_gate_exps=CPU,blk\\.1\\.ffn_gate_exps=CPU"}).value(), (V{true, true}));
  EXPECT_EQ(layers(0, {"blk\\.0\\.ffn_gate_exps=CPU", "blk\\.1\\.ffn_up_exps=CPU"}).value(), (V{true, true}));
  EXPECT_EQ(layers(0, {"blk\\.7\\.ffn_up_exps=CPU"}).value(), (V{false, false}));  // matches nothing
  // A dense file: no layer has experts to move.
  const std::vector<std::string> dense = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight"};
  ExpertRequest all;
  all.n_cpu_moe = ExpertRequest::kAllLayers;
  EXPECT_EQ(resolve_expert_layers(all, dense, 1).value(), (V{false}));

  expect_error(layers(0, {"attn_q=CPU"}).status(), ErrorCode::kUnsupported,
               "-ot: 'attn_q' matches tensor 'blk.0.attn_q.weight': only expert tensors (blk.N.ffn_*_exps) can be "
               "overridden for now");
  expect_error(layers(0, {"blk\\.1\\.ffn_gate=CPU"}).status(), ErrorCode::kUnsupported,
               "matches tensor 'blk.1.ffn_gate_inp.weight': only expert tensors");  // the router is not one
  expect_error(layers(0, {".*=CPU"}).status(), ErrorCode::kUnsupported, "matches tensor 'token_embd.weight'");
  expect_error(layers(-1, {}).status(), ErrorCode::kInvalidArgument, "--n-cpu-moe: must be >= 0 (got -1)");
  expect_error(parse_tensor_overrides("exps=CUDA0").status(), ErrorCode::kUnsupported,
               "-ot: buffer type 'CUDA0' in 'exps=CUDA0': only CPU is supported for now");
  expect_error(parse_tensor_overrides("exps").status(), ErrorCode::kInvalidArgument,
               "-ot: 'exps' is not PATTERN=BUFTYPE");
  expect_error(parse_tensor_overrides("=CPU").status(), ErrorCode::kInvalidArgument, "-ot: '=CPU' is not PATTERN");
  expect_error(parse_tensor_overrides("exps=CPU,").status(), ErrorCode::kInvalidArgument, "-ot: '' is not PATTERN");
  expect_error(parse_tensor_overrides("ffn_(up=CPU").status(), ErrorCode::kInvalidArgument,
               "-ot: 'ffn_(up' is not a regular expression");
  const auto two = parse_tensor_overrides("a=CPU,b=cpu");
  ASSERT_TRUE(two.is_ok());
  ASSERT_EQ(two.value().size(), 2u);
  EXPECT_EQ(two.value()[1].pattern, "b");
  EXPECT_EQ(two.value()[1].buftype, "CPU");
}

// place_experts: only layers on a device get their experts moved, onto the placement's CPU backend when it has one
// (the one -ngl keeps layers on), else a new one; describe() names them.
TEST(ExpertPlacement, ExpertsGoToTheCpuBackendOfThePlacement) {
  auto dev = std::make_shared<NoMoeBackend>(Op::kMoeFfn, /*host=*/false);
  std::shared_ptr<Backend> cpu(make_cpu_backend({1, false}));
  Placement p;
  p.layers = {cpu, dev, dev};
  p.input = cpu;
  p.output = dev;
  ASSERT_TRUE(place_experts({true, true, false}, BackendOptions{}, p).is_ok());
  ASSERT_EQ(p.experts.size(), 3u);
  EXPECT_EQ(p.experts[0], nullptr);  // layer 0 runs on the CPU: its experts stay with it
  EXPECT_EQ(p.experts[1], cpu);      // the placement's CPU backend
  EXPECT_EQ(p.experts[2], nullptr);
  EXPECT_EQ(p.experts_of(2), dev.get());
  EXPECT_EQ(p.n_experts_apart(), 1);
  EXPECT_TRUE(p.check(3).is_ok());
  EXPECT_EQ(p.describe(), "cpu #0: input + experts of layers 1 + layers 0; no-moe #1: layers 1-2 + output");

  Placement q;  // everything on the device: a CPU backend is made for the experts
  q.layers = {dev, dev};
  q.input = q.output = dev;
  ASSERT_TRUE(place_experts({true, true}, BackendOptions{}, q).is_ok());
  ASSERT_EQ(q.experts.size(), 2u);
  ASSERT_NE(q.experts[0], nullptr);
  EXPECT_TRUE(q.experts[0]->host_memory());
  EXPECT_EQ(q.experts[1], q.experts[0]);
  EXPECT_EQ(q.describe(), "no-moe #0: input + layers 0-1 + output; cpu #1: experts of layers 0-1");

  Placement r;  // nothing selected: no experts vector
  r.layers = {dev};
  r.input = r.output = dev;
  ASSERT_TRUE(place_experts({false}, BackendOptions{}, r).is_ok());
  EXPECT_TRUE(r.experts.empty());
  r.experts = {cpu, cpu};
  expect_error(r.check(1), ErrorCode::kInvalidArgument, "placement: experts of 2 layers assigned, the model has 1");
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
  for (int nb : {13, 1}) {
    const double mx = max_row_nmse(*a.value(), *b.value(), ids, nb);
    std::printf("[moe fast-vs-ref] b=%d max NMSE %.3e\n", nb, mx);
    EXPECT_LE(mx, 1e-10) << "b=" << nb;
  }
}

// gpt-oss (model/arch/gptoss.cpp) on the committed fixture (tests/data/models-gptoss; parity with llama.cpp is in
// test_model_parity.cpp): the hyperparameters it derives, bad files, and backends without YaRN or sinks.
const std::string kGptOss = kGptOssPath;

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
