// Embeddings through the engine loop (runtime/embedding.h): every pooling against the final-norm hidden states the
// generation path gives on an identity-head model (common/embed_models.h); a long input in chunks; one input alone
// and in a batch of 8; a generation request sharing the steps; the rank head (cls.output.weight, and the
// Qwen3-Reranker "yes"/"no" rows) against softmax of the reference logits; refusals; normalization and the rerank
// prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/embed_models.h"
#include "common/engine_util.h"
#include "runtime/embedding.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

EngineConfig embed_config(std::optional<Pooling> p, int32_t max_seqs = 1, int32_t batch = 512) {
  EngineConfig c;
  c.n_ctx = 1024;
  c.max_seqs = max_seqs;
  c.batch_tokens = batch;
  c.prefix_cache = false;
  c.embeddings = true;
  c.pooling = p;
  return c;
}

struct Embedded {
  std::vector<float> v;
  Status error;
  int64_t n_prompt = 0;
};

std::vector<Embedded> embed_all(Scheduler& s, const std::vector<std::vector<int32_t>>& inputs) {
  std::vector<std::shared_ptr<RequestHandle>> hs;
  std::vector<Embedded> out(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    GenRequest r;
    r.embed = true;
    r.prompt = inputs[i];
    auto h = s.submit(std::move(r));
    if (!h) out[i].error = h.status();
    hs.push_back(h ? *h : nullptr);
  }
  s.start();  // a scheduler made with EngineConfig::start off runs from here, with every input queued
  for (size_t i = 0; i < hs.size(); ++i) {
    if (!hs[i]) continue;
    hs[i]->wait_all();
    out[i].v = hs[i]->take_embedding();
    out[i].error = hs[i]->error();
    out[i].n_prompt = hs[i]->timings().n_prompt;
  }
  return out;
}

std::vector<int32_t> fixture_prompt() { return test::read_ids(test::data_path("models/prompt.txt")); }

const std::string& llama_model() {
  static const std::string p = test::make_embed_model("embed-llama.gguf", {});
  return p;
}

TEST(Embeddings, EveryPoolingIsTheHiddenStatesOfTheGenerationPath) {
  auto m = test::load_cpu_model(llama_model());
  ASSERT_TRUE(m);
  const std::vector<int32_t> ids = fixture_prompt();
  const auto h = test::reference_hidden(*m, ids);
  const size_t n = ids.size(), d = h[0].size();
  for (Pooling p : {Pooling::kNone, Pooling::kMean, Pooling::kCls, Pooling::kLast}) {
    SCOPED_TRACE(pooling_name(p));
    auto s = test::make_scheduler(llama_model(), embed_config(p));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->embedding().n_out, static_cast<int64_t>(d));
    auto r = embed_all(*s, {ids});
    ASSERT_TRUE(r[0].error.is_ok()) << r[0].error.to_string();
    EXPECT_EQ(r[0].n_prompt, static_cast<int64_t>(n));
    std::vector<float> want;
    if (p == Pooling::kNone)
      for (const auto& row : h) want.insert(want.end(), row.begin(), row.end());
    if (p == Pooling::kCls) want = h[0];
    if (p == Pooling::kLast) want = h[n - 1];
    if (p == Pooling::kMean) {
      std::vector<double> sum(d, 0.0);
      for (const auto& row : h)
        for (size_t i = 0; i < d; ++i) sum[i] += row[i];
      for (double x : sum) want.push_back(static_cast<float>(x / static_cast<double>(n)));
    }
    ASSERT_EQ(r[0].v.size(), want.size());
    // The same tokens in one batch take the same arithmetic: equal up to the last bits.
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(r[0].v[i], want[i], 1e-6 * (1 + std::fabs(want[i]))) << i;
  }
}

TEST(Embeddings, ALongInputInChunksMatchesOneBatch) {
  auto m = test::load_cpu_model(llama_model());
  ASSERT_TRUE(m);
  const std::vector<int32_t> ids = fixture_prompt();
  const auto h = test::reference_hidden(*m, ids);
  std::vector<float> mean(h[0].size(), 0.0f);
  for (size_t i = 0; i < mean.size(); ++i) {
    double s = 0;
    for (const auto& row : h) s += row[i];
    mean[i] = static_cast<float>(s / static_cast<double>(h.size()));
  }
  // 32 tokens in steps of 7: five steps, the rows pooled as they come; the last token's row comes in the last one.
  for (Pooling p : {Pooling::kMean, Pooling::kLast, Pooling::kCls}) {
    SCOPED_TRACE(pooling_name(p));
    auto s = test::make_scheduler(llama_model(), embed_config(p, 1, 7));
    ASSERT_TRUE(s);
    auto r = embed_all(*s, {ids});
    ASSERT_TRUE(r[0].error.is_ok()) << r[0].error.to_string();
    const std::vector<float>& want = p == Pooling::kMean ? mean : p == Pooling::kLast ? h.back() : h[0];
    EXPECT_LT(test::cosine_distance(r[0].v, want), 1e-9);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(r[0].v[i], want[i], 1e-4) << i;
  }
}

TEST(Embeddings, OneInputAloneAndInABatchOfEight) {
  auto s1 = test::make_scheduler(llama_model(), embed_config(Pooling::kMean, 1));
  EngineConfig c8 = embed_config(Pooling::kMean, 8);
  c8.start = false;
  auto s8 = test::make_scheduler(llama_model(), c8);
  ASSERT_TRUE(s1 && s8);
  const std::vector<int32_t> all = fixture_prompt();
  std::vector<std::vector<int32_t>> inputs;
  for (size_t i = 0; i < 8; ++i) inputs.emplace_back(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(5 + 3 * i));
  std::vector<StepInfo> steps;
  s8->set_step_observer([&](const StepInfo& st) { steps.push_back(st); });
  auto batched = embed_all(*s8, inputs);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].n_seqs, 8);  // all eight in one forward pass
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto alone = embed_all(*s1, {inputs[i]});
    ASSERT_TRUE(alone[0].error.is_ok() && batched[i].error.is_ok());
    EXPECT_LT(test::cosine_distance(alone[0].v, batched[i].v), 1e-5) << "input " << i;
  }
}

TEST(Embeddings, GenerationSharesTheStepsUnchanged) {
  // The fixture itself (its real output head, whose greedy margins are decisive).
  const std::string path = test::data_path("models/fixture-llama-f16.gguf");
  const std::vector<int32_t> ids = fixture_prompt();
  auto alone = test::make_scheduler(path, embed_config(Pooling::kMean, 2));
  ASSERT_TRUE(alone);
  const test::Generated want = test::generate(*alone, test::greedy_request(ids, 8));
  const auto want_embd = embed_all(*alone, {ids});
  // Both at once: the generation's prompt and the embedding input run in the same hidden steps.
  EngineConfig cfg = embed_config(Pooling::kMean, 2);
  cfg.start = false;
  auto s = test::make_scheduler(path, cfg);
  std::vector<StepInfo> steps;
  s->set_step_observer([&](const StepInfo& st) { steps.push_back(st); });
  GenRequest e;
  e.embed = true;
  e.prompt = ids;
  auto he = s->submit(e);
  auto hg = s->submit(test::greedy_request(ids, 8));
  ASSERT_TRUE(he && hg);
  s->start();
  std::vector<int32_t> got;
  for (const TokenEvent& ev : (*hg)->wait_all())
    if (ev.id >= 0) got.push_back(ev.id);
  (*he)->wait_all();
  EXPECT_EQ(got, want.ids);
  EXPECT_LT(test::cosine_distance((*he)->take_embedding(), want_embd[0].v), 1e-6);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].n_seqs, 2);  // the first step ran both prompts
}

// softmax over two logits: the probability of the first.
double p_first(double a, double b) { return 1.0 / (1.0 + std::exp(b - a)); }

TEST(Embeddings, RankScoresFromTheClassificationHead) {
  test::EmbedModelSpec spec;
  spec.src = "models/fixture-qwen3-q4_0.gguf";
  spec.pooling = 4;
  spec.cls_out = 2;
  const std::string path = test::make_embed_model("rank-qwen3.gguf", spec);
  auto m = test::load_cpu_model(path);
  ASSERT_TRUE(m);
  const std::vector<int32_t> ids = fixture_prompt();
  const auto h = test::reference_hidden(*m, ids);
  const int64_t d = m->hparams().n_embd;
  const std::vector<float> w = test::cls_rows(d, 2, false);
  double z[2] = {0, 0};
  for (int c = 0; c < 2; ++c)
    for (int64_t i = 0; i < d; ++i) z[c] += double(w[static_cast<size_t>(c * d + i)]) * h.back()[static_cast<size_t>(i)];
  auto s = test::make_scheduler(path, embed_config(std::nullopt));  // the file's pooling: rank
  ASSERT_TRUE(s);
  EXPECT_EQ(s->embedding().pooling, Pooling::kRank);
  EXPECT_EQ(s->embedding().n_out, 2);
  auto r = embed_all(*s, {ids});
  ASSERT_TRUE(r[0].error.is_ok()) << r[0].error.to_string();
  ASSERT_EQ(r[0].v.size(), 2u);
  EXPECT_NEAR(r[0].v[0], p_first(z[0], z[1]), 1e-5);  // qwen3: softmax over the head (the last token's state)
  EXPECT_NEAR(r[0].v[0] + r[0].v[1], 1.0, 1e-6);
}

TEST(Embeddings, RankWithoutAHeadUsesTheYesNoLogitsOfQwen3) {
  test::EmbedModelSpec spec;
  spec.src = "models/fixture-qwen3-q4_0.gguf";
  spec.yes_no = true;
  const std::string path = test::make_embed_model("yesno-qwen3.gguf", spec);
  auto m = test::load_cpu_model(path);
  ASSERT_TRUE(m);
  const std::vector<int32_t> ids = fixture_prompt();
  std::vector<std::vector<float>> logits;
  test::reference_hidden(*m, ids, &logits);
  auto s = test::make_scheduler(path, embed_config(Pooling::kRank));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->embedding().labels, (std::vector<std::string>{"yes", "no"}));
  auto r = embed_all(*s, {ids});
  ASSERT_TRUE(r[0].error.is_ok()) << r[0].error.to_string();
  // The generation path's own logits of "yes" (990) and "no" (991) after the last token.
  EXPECT_NEAR(r[0].v[0], p_first(logits.back()[990], logits.back()[991]), 1e-5);
  // Without those tokens and without cls.output.weight there is no head: --pooling rank is refused at creation.
  auto plain = test::load_cpu_model(test::data_path("models/fixture-qwen3-q4_0.gguf"));
  auto no = Scheduler::create(std::move(plain), embed_config(Pooling::kRank));
  ASSERT_FALSE(no.is_ok());
  EXPECT_NE(no.status().message().find("classification head"), std::string::npos) << no.status().to_string();
}

TEST(Embeddings, Refusals) {
  // Embeddings off: an embedding request is refused; generation off: a generation request is.
  EngineConfig off = embed_config(Pooling::kMean);
  off.embeddings = false;
  auto s = test::make_scheduler(llama_model(), off);
  GenRequest e;
  e.embed = true;
  e.prompt = {1, 2, 3};
  auto h = s->submit(e);
  ASSERT_FALSE(h.is_ok());
  EXPECT_NE(h.status().message().find("embeddings are off"), std::string::npos);
  EngineConfig nogen = embed_config(Pooling::kMean);
  nogen.generation = false;
  auto t = test::make_scheduler(llama_model(), nogen);
  auto g = t->submit(test::greedy_request({1, 2, 3}, 2));
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().message().rfind("model: this is an embedding model", 0), 0u) << g.status().to_string();
  // An input may fill the whole context (nothing is generated), not more.
  EngineConfig small = embed_config(Pooling::kMean);
  small.n_ctx = 16;
  auto u = test::make_scheduler(llama_model(), small);
  std::vector<int32_t> full(16, 5), over(17, 5);
  EXPECT_TRUE(embed_all(*u, {full})[0].error.is_ok());
  EXPECT_FALSE(embed_all(*u, {over})[0].error.is_ok());
  EXPECT_FALSE(embed_all(*u, {{}})[0].error.is_ok());
}

TEST(Embeddings, Normalize) {
  std::vector<float> v = {3, -4, 0};
  auto n2 = v;
  normalize(n2, 2);
  EXPECT_FLOAT_EQ(n2[0], 0.6f);
  EXPECT_FLOAT_EQ(n2[1], -0.8f);
  auto n1 = v;
  normalize(n1, 1);
  EXPECT_FLOAT_EQ(n1[0], 3.0f / 7);
  auto n0 = v;
  normalize(n0, 0);
  EXPECT_FLOAT_EQ(n0[1], -32760.0f);
  EXPECT_FLOAT_EQ(n0[0], 3 * 32760.0f / 4);
  auto n3 = v;
  normalize(n3, 3);
  EXPECT_NEAR(n3[0], 3 / std::cbrt(27.0 + 64.0), 1e-6);
  auto none = v;
  normalize(none, -1);
  EXPECT_EQ(none, v);
  std::vector<float> zero = {0, 0};
  normalize(zero, 2);
  EXPECT_EQ(zero, (std::vector<float>{0, 0}));
  EXPECT_TRUE(check_normalize(64, "x").is_ok());
  EXPECT_FALSE(check_normalize(-2, "--embd-normalize").is_ok());
  EXPECT_NE(check_normalize(65, "--embd-normalize").message().find("--embd-normalize"), std::string::npos);
  EXPECT_EQ(parse_pooling("last", "p").value(), Pooling::kLast);
  EXPECT_FALSE(parse_pooling("max", "--pooling").is_ok());
}

TEST(Embeddings, RerankPrompt) {
  auto m = test::load_cpu_model(test::data_path("models/fixture-llama-f16.gguf"));
  ASSERT_TRUE(m);
  const Tokenizer& tok = m->tokenizer();
  // Placeholders are filled once, left to right: a query that spells "{document}" stays text.
  EXPECT_EQ(rerank_prompt(tok, "Q={query} D={document}", "{document}", "x"),
            tok.encode("Q={document} D=x", false, true));
  // No template: [BOS] query [EOS] document [EOS] as the vocabulary's flags say (this one adds BOS only).
  std::vector<int32_t> want;
  if (tok.add_bos()) want.push_back(tok.bos());
  for (int32_t t : tok.encode("what", false, false)) want.push_back(t);
  for (int32_t t : tok.encode("that", false, false)) want.push_back(t);
  EXPECT_FALSE(tok.add_eos());
  EXPECT_EQ(rerank_prompt(tok, "", "what", "that"), want);
}

}  // namespace
}  // namespace kiln
