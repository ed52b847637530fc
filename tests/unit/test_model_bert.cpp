// The encoder architectures (model/arch/bert.cpp: bert and nomic-bert) on the CPU (and on a GPU where the machine
// has one), against a float64 forward written here from the formulas of that file: small random-weight models with a
// WordPiece vocabulary, made with the GGUF writer. Every pooling of the embeddings; several inputs in one step see only themselves (bidirectional attention
// within a sequence, never across); the fused and split q/k/v layouts agree; the rank head of a BERT cross-encoder
// (cls.weight + tanh, cls.output.weight) over the [CLS] state; and what an encoder refuses (logits, generation, an
// input longer than a step or than its learned positions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "common/embed_models.h"
#include "common/engine_util.h"
#include "runtime/embedding.h"
#include "runtime/scheduler.h"
#include "util/fp16.h"

namespace kiln {
namespace {

constexpr int64_t E = 32, H = 4, D = 8, F = 64, NL = 2, CTX = 48, TYPES = 2;

std::vector<std::string> vocab() {
  std::vector<std::string> v = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?"};
  for (const char* w : {"the", "cat", "sat", "on", "mat", "dog", "ran", "a", "is", "and", "what", "color", "sky",
                        "blue", "grass", "green"})
    v.push_back(w);
  for (char c = 'a'; c <= 'z'; ++c) v.push_back(std::string(1, c)), v.push_back(std::string("##") + c);
  return v;
}

// The weights of one test encoder, as the reference reads them: W[r * n_in + i] = row r (output r).
struct Enc {
  bool nomic = false;
  std::vector<float> tok, pos, types, tn_w, tn_b;
  struct Layer {
    std::vector<float> wq, wk, wv, bq, bk, bv, wo, bo, an_w, an_b, up, b_up, gate, down, b_down, ln_w, ln_b;
  };
  std::vector<Layer> L;
  std::vector<float> dense, dense_b, out;  // rank head: cls.weight [E][E], cls.bias, cls.output.weight [2][E]
};

std::vector<float> rnd(uint64_t& s, size_t n, float a) {
  std::vector<float> v(n);
  for (float& x : v) x = test::pseudo_random(s, a);
  return v;
}

// Writes the model; fused: one attn_qkv tensor per layer; head: cls.weight, cls.bias and cls.output.weight.
Enc make_encoder(const std::string& path, bool nomic, int pooling, bool fused, bool head) {
  Enc m;
  m.nomic = nomic;
  uint64_t s = nomic ? 7 : 3;
  const std::vector<std::string> voc = vocab();
  const size_t V = voc.size();
  m.tok = rnd(s, V * E, 1.0f);
  if (!nomic) m.pos = rnd(s, CTX * E, 0.5f);
  m.types = rnd(s, TYPES * E, 0.5f);
  m.tn_w = rnd(s, E, 0.3f);
  for (float& x : m.tn_w) x += 1.0f;
  m.tn_b = rnd(s, E, 0.1f);
  const float a = 0.3f;
  for (int l = 0; l < NL; ++l) {
    Enc::Layer y;
    y.wq = rnd(s, E * E, a), y.wk = rnd(s, E * E, a), y.wv = rnd(s, E * E, a), y.wo = rnd(s, E * E, a);
    y.bq = rnd(s, E, 0.1f), y.bk = rnd(s, E, 0.1f), y.bv = rnd(s, E, 0.1f), y.bo = rnd(s, E, 0.1f);
    if (nomic) y.bq.assign(E, 0), y.bk.assign(E, 0), y.bv.assign(E, 0), y.bo.assign(E, 0);
    y.an_w = rnd(s, E, 0.2f), y.an_b = rnd(s, E, 0.1f), y.ln_w = rnd(s, E, 0.2f), y.ln_b = rnd(s, E, 0.1f);
    for (float& x : y.an_w) x += 1.0f;
    for (float& x : y.ln_w) x += 1.0f;
    y.up = rnd(s, F * E, a), y.down = rnd(s, E * F, a), y.b_up = rnd(s, F, 0.1f), y.b_down = rnd(s, E, 0.1f);
    if (nomic) y.gate = rnd(s, F * E, a), y.b_up.assign(F, 0), y.b_down.assign(E, 0);
    m.L.push_back(std::move(y));
  }
  if (head) m.dense = rnd(s, E * E, a), m.dense_b = rnd(s, E, 0.1f), m.out = rnd(s, 2 * E, 0.5f);

  gguf::Writer w;
  const std::string arch = nomic ? "nomic-bert" : "bert", k = arch + ".";
  w.set("general.architecture", arch);
  w.set(k + "context_length", static_cast<uint32_t>(CTX));
  w.set(k + "embedding_length", static_cast<uint32_t>(E));
  w.set(k + "feed_forward_length", static_cast<uint32_t>(F));
  w.set(k + "block_count", static_cast<uint32_t>(NL));
  w.set(k + "attention.head_count", static_cast<uint32_t>(H));
  w.set(k + "attention.layer_norm_epsilon", 1e-12f);
  w.set(k + "attention.causal", false);
  if (nomic) w.set(k + "rope.freq_base", 1000.0f);
  if (pooling >= 0) w.set(k + "pooling_type", static_cast<uint32_t>(pooling));
  w.set("tokenizer.ggml.model", "bert");
  gguf::Array toks;
  toks.type = gguf::ValueType::STRING;
  for (const std::string& t : voc) toks.items.push_back(t);
  w.set("tokenizer.ggml.tokens", toks);
  w.set("tokenizer.ggml.token_type_count", static_cast<uint32_t>(TYPES));
  w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(2));
  w.set("tokenizer.ggml.seperator_token_id", static_cast<uint32_t>(3));
  w.set("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(1));
  w.set("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(0));
  auto add = [&](const std::string& name, const std::vector<float>& d, std::vector<int64_t> ne) {
    EXPECT_TRUE(w.add_tensor(name, DType::F32, std::move(ne), d.data()).is_ok()) << name;
  };
  add("token_embd.weight", m.tok, {E, static_cast<int64_t>(V)});
  if (!nomic) add("position_embd.weight", m.pos, {E, CTX});
  add("token_types.weight", m.types, {E, TYPES});
  add("token_embd_norm.weight", m.tn_w, {E});
  add("token_embd_norm.bias", m.tn_b, {E});
  static std::vector<std::vector<float>> keep;  // fused copies, alive until write()
  for (int l = 0; l < NL; ++l) {
    const Enc::Layer& y = m.L[static_cast<size_t>(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    if (fused) {
      std::vector<float> qkv = y.wq, bias = y.bq;
      qkv.insert(qkv.end(), y.wk.begin(), y.wk.end());
      qkv.insert(qkv.end(), y.wv.begin(), y.wv.end());
      bias.insert(bias.end(), y.bk.begin(), y.bk.end());
      bias.insert(bias.end(), y.bv.begin(), y.bv.end());
      keep.push_back(std::move(qkv));
      add(b + "attn_qkv.weight", keep.back(), {E, 3 * E});
      keep.push_back(std::move(bias));
      if (!nomic) add(b + "attn_qkv.bias", keep.back(), {3 * E});
    } else {
      add(b + "attn_q.weight", y.wq, {E, E});
      add(b + "attn_k.weight", y.wk, {E, E});
      add(b + "attn_v.weight", y.wv, {E, E});
      if (!nomic) add(b + "attn_q.bias", y.bq, {E}), add(b + "attn_k.bias", y.bk, {E}), add(b + "attn_v.bias", y.bv, {E});
    }
    add(b + "attn_output.weight", y.wo, {E, E});
    if (!nomic) add(b + "attn_output.bias", y.bo, {E});
    add(b + "attn_output_norm.weight", y.an_w, {E});
    add(b + "attn_output_norm.bias", y.an_b, {E});
    add(b + "ffn_up.weight", y.up, {E, F});
    add(b + "ffn_down.weight", y.down, {F, E});
    if (nomic) add(b + "ffn_gate.weight", y.gate, {E, F});
    if (!nomic) add(b + "ffn_up.bias", y.b_up, {F}), add(b + "ffn_down.bias", y.b_down, {E});
    add(b + "layer_output_norm.weight", y.ln_w, {E});
    add(b + "layer_output_norm.bias", y.ln_b, {E});
  }
  if (head) add("cls.weight", m.dense, {E, E}), add("cls.bias", m.dense_b, {E}), add("cls.output.weight", m.out, {E, 2});
  EXPECT_TRUE(w.write(path).is_ok());
  return m;
}

using Vec = std::vector<double>;

Vec matvec(const std::vector<float>& W, const std::vector<float>& b, const Vec& x, size_t n_out) {
  Vec y(n_out);
  for (size_t r = 0; r < n_out; ++r) {
    double a = b.empty() ? 0 : b[r];
    for (size_t i = 0; i < x.size(); ++i) a += double(W[r * x.size() + i]) * x[i];
    y[r] = a;
  }
  return y;
}

Vec layer_norm(const Vec& x, const std::vector<float>& w, const std::vector<float>& b) {
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= double(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= double(x.size());
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + 1e-12) * w[i] + b[i];
  return y;
}

double f16_round(double x) { return fp16_to_f32(f32_to_fp16(static_cast<float>(x))); }

// NeoX rotation of one head's vector at position p: pairs (i, i + D/2), theta = p * base^(-2i/D).
void rope_neox(double* v, int p) {
  for (int i = 0; i < D / 2; ++i) {
    const double th = p * std::pow(1000.0, -2.0 * i / D), c = std::cos(th), s = std::sin(th);
    const double a = v[i], b = v[i + D / 2];
    v[i] = a * c - b * s;
    v[i + D / 2] = a * s + b * c;
  }
}

// The encoder's output for one sequence, in float64 (K and V rounded to f16, as the cache stores them; q too with
// q_f16, as the CUDA attention kernels read it against an f16 cache).
std::vector<Vec> reference(const Enc& m, const std::vector<int32_t>& ids, bool q_f16 = false) {
  const size_t n = ids.size();
  std::vector<Vec> x(n, Vec(E));
  for (size_t t = 0; t < n; ++t) {
    for (int i = 0; i < E; ++i)
      x[t][i] = double(m.tok[size_t(ids[t]) * E + i]) + m.types[i] + (m.nomic ? 0.0 : m.pos[t * E + i]);
    x[t] = layer_norm(x[t], m.tn_w, m.tn_b);
  }
  for (const Enc::Layer& y : m.L) {
    std::vector<Vec> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      q[t] = matvec(y.wq, y.bq, x[t], E), k[t] = matvec(y.wk, y.bk, x[t], E), v[t] = matvec(y.wv, y.bv, x[t], E);
      if (m.nomic)
        for (int h = 0; h < H; ++h) rope_neox(&q[t][h * D], int(t)), rope_neox(&k[t][h * D], int(t));
      for (int i = 0; i < E; ++i) k[t][i] = f16_round(k[t][i]), v[t][i] = f16_round(v[t][i]);
      if (q_f16)
        for (int i = 0; i < E; ++i) q[t][i] = f16_round(q[t][i]);
    }
    std::vector<Vec> nx(n);
    for (size_t t = 0; t < n; ++t) {
      Vec attn(E, 0.0);
      for (int h = 0; h < H; ++h) {
        Vec sc(n);
        double mx = -1e300;
        for (size_t j = 0; j < n; ++j) {  // every position of the sequence: bidirectional
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][h * D + i] * k[j][h * D + i];
          sc[j] = d / std::sqrt(double(D));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (double& s : sc) z += (s = std::exp(s - mx));
        for (size_t j = 0; j < n; ++j)
          for (int i = 0; i < D; ++i) attn[h * D + i] += sc[j] / z * v[j][h * D + i];
      }
      Vec o = matvec(y.wo, y.bo, attn, E);
      for (int i = 0; i < E; ++i) o[i] += x[t][i];
      const Vec a = layer_norm(o, y.an_w, y.an_b);
      Vec u = matvec(y.up, y.b_up, a, F);
      if (m.nomic) {
        const Vec g = matvec(y.gate, {}, a, F);
        for (int i = 0; i < F; ++i) u[i] *= g[i] / (1 + std::exp(-g[i]));
      } else {
        for (double& z2 : u) z2 = 0.5 * z2 * (1 + std::tanh(0.7978845608028654 * z2 * (1 + 0.044715 * z2 * z2)));
      }
      Vec d = matvec(y.down, y.b_down, u, E);
      for (int i = 0; i < E; ++i) d[i] += a[i];
      nx[t] = layer_norm(d, y.ln_w, y.ln_b);
    }
    x = std::move(nx);
  }
  return x;
}

EngineConfig embed_config(std::optional<Pooling> p, int32_t max_seqs = 4, int32_t batch = 512) {
  EngineConfig c;
  c.n_ctx = 256;
  c.max_seqs = max_seqs;
  c.batch_tokens = batch;
  c.prefix_cache = false;
  c.embeddings = true;
  c.pooling = p;
  return c;
}

// Submits every input, then starts the engine thread (when it is not running yet) and waits for the results.
std::vector<std::vector<float>> embed(Scheduler& s, const std::vector<std::vector<int32_t>>& in, Status* err) {
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& ids : in) {
    GenRequest r;
    r.embed = true;
    r.prompt = ids;
    auto h = s.submit(std::move(r));
    if (!h) {
      *err = h.status();
      return {};
    }
    hs.push_back(*h);
  }
  s.start();
  std::vector<std::vector<float>> out;
  for (auto& h : hs) {
    h->wait_all();
    if (!h->error().is_ok()) *err = h->error();
    out.push_back(h->take_embedding());
  }
  return out;
}

void expect_close(const std::vector<float>& got, const Vec& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
}

const char* kTexts[] = {"the cat sat on the mat.", "what color is the sky?", "grass is green", "a dog ran"};

class Encoders : public ::testing::TestWithParam<bool> {};  // nomic-bert?

TEST_P(Encoders, EveryPoolingAgainstTheFloat64Forward) {
  const bool nomic = GetParam();
  const std::string path = test::temp_dir() + (nomic ? "nomic.gguf" : "bert.gguf");
  const Enc m = make_encoder(path, nomic, 1, /*fused=*/nomic, false);
  auto model = test::load_cpu_model(path);
  ASSERT_TRUE(model);
  std::vector<std::vector<int32_t>> in;
  for (const char* t : kTexts) in.push_back(embedding_tokens(model->tokenizer(), t));
  EXPECT_EQ(in[0].front(), 2);  // [CLS] ... [SEP]
  EXPECT_EQ(in[0].back(), 3);
  for (Pooling p : {Pooling::kNone, Pooling::kMean, Pooling::kCls, Pooling::kLast}) {
    SCOPED_TRACE(pooling_name(p));
    EngineConfig cfg = embed_config(p);
    cfg.start = false;  // every input queued before the first step
    auto s = test::make_scheduler(path, cfg);
    ASSERT_TRUE(s);
    std::vector<StepInfo> steps;
    s->set_step_observer([&](const StepInfo& st) { steps.push_back(st); });
    Status err;
    const auto got = embed(*s, in, &err);
    ASSERT_TRUE(err.is_ok()) << err.to_string();
    ASSERT_EQ(steps.size(), 1u);  // the four inputs side by side in one step, each seeing only itself
    EXPECT_EQ(steps[0].n_seqs, 4);
    for (size_t i = 0; i < in.size(); ++i) {
      const std::vector<Vec> h = reference(m, in[i]);
      Vec want;
      if (p == Pooling::kNone)
        for (const Vec& r : h) want.insert(want.end(), r.begin(), r.end());
      if (p == Pooling::kCls) want = h.front();
      if (p == Pooling::kLast) want = h.back();
      if (p == Pooling::kMean) {
        want.assign(E, 0.0);
        for (const Vec& r : h)
          for (int k = 0; k < E; ++k) want[k] += r[k] / double(h.size());
      }
      expect_close(got[i], want, 1e-5);
    }
  }
}

// The same encoders on the first GPU (skipped without one): the four inputs in one step (bidirectional attention
// within each sequence, the layer norms, gelu or the gated FFN, nomic's RoPE), every token's state against the
// float64 forward with q rounded to f16 as the CUDA attention reads it. Every other op of these encoders is f32 on
// CUDA (F32 weights take the f32 GEMV / GEMM), so what remains is f32 rounding (~1e-6, as on the CPU) plus the rare
// q element whose f32 and f64 values round to different f16 neighbours (one f16 ulp of one element moves a score
// by <= 2^-11 |q_i k_i| / sqrt(D) ~ 1e-4): the bound is 1e-3, while causal attention or a step that lets one
// sequence see another is off by more than 0.1.
TEST_P(Encoders, OnCudaAgainstTheFloat64Forward) {
  const auto devs = list_devices();
  if (!devs || std::none_of(devs->begin(), devs->end(), [](const DeviceInfo& d) { return d.id == "cuda:0"; }))
    GTEST_SKIP() << "skipped: no CUDA device (cuda:0) here";
  const bool nomic = GetParam();
  const std::string path = test::temp_dir() + (nomic ? "nomic-cuda.gguf" : "bert-cuda.gguf");
  const Enc m = make_encoder(path, nomic, 0, /*fused=*/nomic, false);
  LoadOptions lo;
  lo.devices.device = "cuda:0";
  auto model = Model::load(path, lo);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  std::vector<std::vector<int32_t>> in;
  for (const char* t : kTexts) in.push_back(embedding_tokens((*model)->tokenizer(), t));
  EngineConfig cfg = embed_config(Pooling::kNone);
  cfg.start = false;
  auto sr = Scheduler::create(std::move(model).value(), cfg);
  ASSERT_TRUE(sr.is_ok()) << sr.status().to_string();
  auto s = std::move(sr).value();
  std::vector<StepInfo> steps;
  s->set_step_observer([&](const StepInfo& st) { steps.push_back(st); });
  Status err;
  const auto got = embed(*s, in, &err);
  ASSERT_TRUE(err.is_ok()) << err.to_string();
  ASSERT_EQ(steps.size(), 1u);
  for (size_t i = 0; i < in.size(); ++i) {
    Vec want;
    for (const Vec& r : reference(m, in[i], /*q_f16=*/true)) want.insert(want.end(), r.begin(), r.end());
    expect_close(got[i], want, 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(BertAndNomic, Encoders, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? std::string("nomic_bert") : std::string("bert"); });

TEST(Bert, FusedAndSplitQkvAgreeAndTheFilePoolingIsUsed) {
  const std::string a = test::temp_dir() + "split.gguf", b = test::temp_dir() + "fused.gguf";
  make_encoder(a, false, 2, false, false);
  make_encoder(b, false, 2, true, false);
  auto sa = test::make_scheduler(a, embed_config(std::nullopt));
  auto sb = test::make_scheduler(b, embed_config(std::nullopt));
  ASSERT_TRUE(sa && sb);
  EXPECT_EQ(sa->embedding().pooling, Pooling::kCls);
  const std::vector<int32_t> ids = embedding_tokens(sa->tokenizer(), kTexts[0]);
  Status err;
  const auto va = embed(*sa, {ids}, &err), vb = embed(*sb, {ids}, &err);
  ASSERT_TRUE(err.is_ok()) << err.to_string();
  ASSERT_EQ(va[0].size(), static_cast<size_t>(E));
  for (int i = 0; i < E; ++i) EXPECT_NEAR(va[0][i], vb[0][i], 1e-6);
}

TEST(Bert, CrossEncoderHeadOverTheClsState) {
  const std::string path = test::temp_dir() + "rerank.gguf";
  const Enc m = make_encoder(path, false, 4, false, true);
  auto s = test::make_scheduler(path, embed_config(std::nullopt));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->embedding().pooling, Pooling::kRank);
  EXPECT_EQ(s->embedding().n_out, 2);
  EXPECT_EQ(s->embedding().rerank_template, "");  // the pair format: [CLS] query [SEP] document
  const std::vector<int32_t> ids = rerank_prompt(s->tokenizer(), "", "what color is the sky?", "the sky is blue");
  EXPECT_EQ(ids.front(), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 3), 1);
  Status err;
  const auto got = embed(*s, {ids}, &err);
  ASSERT_TRUE(err.is_ok()) << err.to_string();
  const Vec cls = reference(m, ids).front();
  Vec h = matvec(m.dense, m.dense_b, cls, E);
  for (double& x : h) x = std::tanh(x);
  expect_close(got[0], matvec(m.out, {}, h, 2), 1e-5);  // raw scores: no softmax outside qwen3
}

TEST(Bert, WhatAnEncoderRefuses) {
  const std::string path = test::temp_dir() + "refuse.gguf";
  make_encoder(path, false, 1, false, false);
  auto s = test::make_scheduler(path, embed_config(std::nullopt, 2, 16));
  ASSERT_TRUE(s);
  // Generation: no output projection.
  auto g = s->submit(test::greedy_request({2, 10, 3}, 4));
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("encoder"), std::string::npos) << g.status().to_string();
  // An input runs whole in one step: not longer than -b; and not past the learned positions (the context is capped
  // there).
  Status err;
  embed(*s, {std::vector<int32_t>(17, 9)}, &err);
  EXPECT_NE(err.message().find("-b"), std::string::npos) << err.to_string();
  EXPECT_EQ(s->max_seq_ctx(), CTX);
  auto big = test::make_scheduler(path, embed_config(std::nullopt, 2, 512));
  err = Status::ok();
  embed(*big, {std::vector<int32_t>(CTX + 1, 9)}, &err);
  EXPECT_FALSE(err.is_ok());
  err = Status::ok();
  EXPECT_EQ(embed(*big, {std::vector<int32_t>(CTX, 9)}, &err)[0].size(), static_cast<size_t>(E)) << err.to_string();
  // The engine itself: no logits, no continuing a sequence.
  auto m = test::load_cpu_model(path);
  KvCacheConfig kc;
  kc.n_ctx = 128;
  kc.max_seqs = 1;
  kc.batch_tokens = 64;
  kc.hidden = true;
  auto e = Engine::create(*m, kc);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  Batch b;
  b.add(2, 0, 0, true);
  auto r = (*e)->step(b.tokens, std::vector<OutputKind>{OutputKind::kLogits}, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not logits"), std::string::npos) << r.status().to_string();
  b.clear();
  b.add(2, 0, 0, false);
  ASSERT_TRUE((*e)->step(b.tokens, {}, true).is_ok());
  b.clear();
  b.add(3, 1, 0, false);
  r = (*e)->step(b.tokens, {}, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("runs whole in one step"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace kiln
