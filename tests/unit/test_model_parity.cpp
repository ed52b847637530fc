// Parity with llama.cpp on the fixture models (fixtures README, "How to check parity"):
//   - logits of prompt + greedy ids (64 tokens, teacher forcing; 166 for the MQA fixture) with the whole sequence
//     in one step and at batch sizes 7 and 1: per-row NMSE vs X.logits.bin, F16/BF16 max <= 1e-4; quantized
//     max <= L and mean <= L/2, L = max(2e-3, 4 x llama.cpp's own batched-vs-sequential spread of that file);
//     argmax equal on rows whose reference margin is > 0.25
//   - free-running greedy from the prompt reproduces greedy.txt for free_run_checked_steps ids
// plus kiln-internal consistency: several sequences in one batch == each alone, every KV cache type close to f16,
// layers split across two backend instances == one backend.
// Every backend of the build runs the parity cases (the device is part of the test name); a device the machine
// lacks is not instantiated (a CUDA build without a GPU runs the CPU cases).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "common/engine_test_util.h"
#include "common/test_util.h"
#include "model/model.h"
#include "backend/registry.h"
#include "model/batch.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

// The full matrix (fixtures README). Models also in tests/data always run; the rest need the fixtures.
const char* const kModels[] = {
    "fixture-llama-f16",   "fixture-llama-bf16",  "fixture-llama-q8_0",   "fixture-llama-q4_0",
    "fixture-llama-q4_1",  "fixture-llama-q5_0",  "fixture-llama-q5_1",   "fixture-llama-q2_k",
    "fixture-llama-q3_k_m", "fixture-llama-q4_k_m", "fixture-llama-q5_k_m", "fixture-llama-q6_k",
    "fixture-qwen2-f16",   "fixture-qwen2-q8_0",  "fixture-qwen2-q4_0",   "fixture-qwen2-q4_k_m",
    "fixture-qwen2-q6_k",  "fixture-qwen3-f16",   "fixture-qwen3-q8_0",   "fixture-qwen3-q4_0",
    "fixture-qwen3-q4_k_m", "fixture-qwen3-q6_k",
};
// models-next/ (own manifest and prompt): Gemma 3 (sliding window 16, local/global RoPE bases, GeGLU, post-norms)
// and Qwen3.5 (hybrid: Gated DeltaNet layers with a recurrent state carried between steps, gated attention). The
// 64-token sequence is longer than the window and is one full delta-net chunk; -b 7 and -b 1 carry the recurrent
// and conv state across steps (-b 1 is the one-step recurrence, -b 64 / -b 7 the chunked form).
const char* const kModelsNext[] = {
    "fixture-gemma3-f16", "fixture-gemma3-q8_0", "fixture-gemma3-q4_k_m",
    "fixture-qwen35-f16", "fixture-qwen35-q8_0", "fixture-qwen35-q4_k_m",
};

// models-mqa/ (own manifest and prompt, committed in tests/data so that every build runs it): llama with 8 query
// heads sharing one KV head (head_dim 64, 4 layers), Q4_K_M, a 150-token prompt plus 16 greedy ids. One KV head
// feeding 8 query heads and a prompt longer than the 64-token sequences above take attention paths (head grouping,
// KV tiling over 150 positions) that the GQA 2:1 fixtures do not.
const char* const kModelsMqa[] = {"fixture-mqa-q4_k_m"};

// models-quant/ (own manifest, the shared prompt; committed in tests/data, made by tools/quant_fixture): the llama
// fixture's F16 source quantized by llama-quantize into one file with a type per matrix: layer 0 IQ4_NL (attn_q),
// IQ4_XS (attn_k), Q8_0 (attn_v), MXFP4 (attn_output), TQ1_0 (ffn_gate), TQ2_0 (ffn_up), Q4_0 (ffn_down); layer 1
// the seven i-quant grid types (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S, IQ1_S, IQ1_M in the same roles);
// token_embd IQ3_XXS, output IQ4_XS. Ternary and 1-bit matrices leave little of the F16 model: the fixture tests
// agreement with llama.cpp on the same file.
const char* const kModelsQuant[] = {"fixture-llama-mix"};

// models-moe/ (own manifest and prompt, read from the fixtures dir): qwen3moe, 8 experts, top 2 renormalised, F16,
// Q8_0 and Q4_K_M (the expert stacks Q4_K, one layer's ffn_down_exps Q6_K). A router near-tie makes quantized MoE
// files touchier under batching than dense ones; the limits follow from llama.cpp's own spread as everywhere.
const char* const kModelsMoe[] = {"fixture-qwen3moe-f16", "fixture-qwen3moe-q8_0", "fixture-qwen3moe-q4_k_m"};

// models-gptoss/ (own manifest, the shared prompt; committed in tests/data, made by tools/gptoss_fixture): gpt-oss,
// 2 layers (layer 0 sliding-window 16, layer 1 full), attention sinks, q/k/v/o biases, YaRN RoPE (factor 32),
// 4 experts, top 2 by biased router logit with the softmax over the 2, expert biases, clamped SwiGLU. F16, and
// MXFP4 experts (llama-quantize MXFP4_MOE: every other matrix Q8_0).
const char* const kModelsGptOss[] = {"fixture-gptoss-f16", "fixture-gptoss-mxfp4"};

std::vector<std::string> all_stems() {
  std::vector<std::string> v(std::begin(kModels), std::end(kModels));
  v.insert(v.end(), std::begin(kModelsNext), std::end(kModelsNext));
  v.insert(v.end(), std::begin(kModelsMqa), std::end(kModelsMqa));
  v.insert(v.end(), std::begin(kModelsQuant), std::end(kModelsQuant));
  v.insert(v.end(), std::begin(kModelsMoe), std::end(kModelsMoe));
  v.insert(v.end(), std::begin(kModelsGptOss), std::end(kModelsGptOss));
  return v;
}

// Why `device` cannot run fixture `stem` ("" when it can): the mixture-of-experts fixtures need a backend whose
// moe_ffn runs (supports(Op::kMoeFfn)), gpt-oss also YaRN rope and attention sinks (the CPU and CUDA backends have
// all three).
std::string cannot_run(const std::string& stem, const std::string& device) {
  const bool gptoss = std::find(std::begin(kModelsGptOss), std::end(kModelsGptOss), stem) != std::end(kModelsGptOss);
  if (!gptoss && std::find(std::begin(kModelsMoe), std::end(kModelsMoe), stem) == std::end(kModelsMoe)) return "";
  static std::map<std::string, std::pair<bool, bool>> ops;  // device -> (moe_ffn, YaRN and sinks)
  auto it = ops.find(device);
  if (it == ops.end()) {
    auto be = create_backend(device, BackendOptions{});
    const bool ok = be.is_ok();
    it = ops.emplace(device, std::make_pair(ok && be.value()->supports(Op::kMoeFfn, DType::F16),
                                            ok && be.value()->supports(Op::kRopeYarn, DType::F32) &&
                                                be.value()->supports(Op::kAttentionSinks, DType::F16, DType::F16)))
             .first;
  }
  if (!it->second.first) return "backend " + device + " does not run moe_ffn (mixture-of-experts models) yet";
  if (gptoss && !it->second.second) return "backend " + device + " does not run YaRN rope and attention sinks yet";
  return "";
}

// Rows of a fixture's logits.bin: prompt + greedy ids (known before the files are read: it sizes the test cases).
int n_rows(const std::string& stem) {
  return std::find(std::begin(kModelsMqa), std::end(kModelsMqa), stem) != std::end(kModelsMqa) ? 150 + 16 : 64;
}

using kiln::test::read_ids;

// Where a model's files are: tests/data when committed there, else the fixtures dir ("" when neither); models/,
// models-next/, models-mqa/, models-quant/, models-gptoss/ or models-moe/ (each with its own manifest.json and
// prompt.txt).
std::string model_dir(const std::string& stem) {
  for (const char* sub : {"models", "models-next", "models-mqa", "models-quant", "models-gptoss"})
    if (std::filesystem::exists(test::data_path(std::string(sub) + "/" + stem + ".gguf")))
      return test::data_path(sub);
  const std::string fx = test::fixtures_dir();
  for (const char* sub : {"/models", "/models-next", "/models-mqa", "/models-moe"})
    if (!fx.empty() && std::filesystem::exists(fx + sub + "/" + stem + ".gguf")) return fx + sub;
  return "";
}

struct Fixture {
  std::unique_ptr<Model> model;
  std::vector<int32_t> prompt, greedy;
  std::vector<float> ref;  // [n_rows][n_vocab]
  std::string type;
  double spread = 0;
  int free_run_steps = 0;
  double margin = 0.25;
  // Rows whose reference argmax the exact model contradicts (tests/data/parity_exact_rows.json): not decisive.
  std::vector<int> exact_rows;
  // Rows where llama.cpp's own other paths land above the limit (tests/data/parity_peer_spread.json): row -> the
  // peer's spread on that row.
  std::map<int, double> peer_rows;
};

// The entry of fixture `stem` under "rows" of tests/data/FILE (the per-row parity data below), or null.
nlohmann::json rows_of(const char* file, const std::string& stem) {
  std::ifstream f(test::data_path(file));
  if (!f) return nullptr;
  const nlohmann::json j = nlohmann::json::parse(f);
  return j.at("rows").contains(stem) ? j.at("rows").at(stem) : nlohmann::json();
}

// tests/data/parity_exact_rows.json (written by dev/parity_exact.sh): per fixture, the rows where the model's exact
// function (f64 dot products of the dequantized weights and f32 activations, every other op in f32) gives another
// argmax than llama.cpp's reference although the reference margin is above the decisive margin. There llama.cpp's
// own activation quantization (q8_0 / q8_K blocks) decided the reference; an engine with more exact activations
// may legitimately differ, so these rows are not decisive. Their NMSE is still checked.
std::vector<int> exact_rows(const std::string& stem) {
  const nlohmann::json j = rows_of("parity_exact_rows.json", stem);
  return j.is_null() ? std::vector<int>{} : j.get<std::vector<int>>();
}

// tests/data/parity_peer_spread.json (measured by dev/peer/parity_spread.sh): per fixture, the rows where llama.cpp's
// one-token paths (CPU and GPU) differ from its own batched reference by more than the parity limit: routing near-ties
// of the MoE fixtures, where the manifest's spread (measured on another machine) understates the peer's. The
// fixtures README's rule, limit = 4 x the peer's spread, is applied to such a row with the spread measured there.
std::map<int, double> peer_rows(const std::string& stem) {
  std::map<int, double> out;
  const nlohmann::json j = rows_of("parity_peer_spread.json", stem);
  if (j.is_null()) return out;
  for (const auto& [row, spread] : j.items()) out[std::stoi(row)] = spread.get<double>();
  return out;
}

// The devices of this build present on this machine ("cpu", "cuda:0", ...).
std::vector<std::string> devices() {
  std::vector<std::string> out;
  auto d = list_devices();
  if (d)
    for (const DeviceInfo& x : *d) out.push_back(x.id);
  return out;
}

Fixture* load_fixture(const std::string& stem, const std::string& device = "cpu") {
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  const std::string key = stem + "@" + device;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  const std::string dir = model_dir(stem);
  if (dir.empty()) return nullptr;
  auto fx = std::make_unique<Fixture>();
  LoadOptions lo;
  lo.devices.device = device;
  lo.devices.backend.n_threads = 2;
  auto m = Model::load(dir + "/" + stem + ".gguf", lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m) return nullptr;
  fx->model = std::move(m).value();
  fx->prompt = read_ids(dir + "/prompt.txt");
  fx->greedy = read_ids(dir + "/" + stem + ".greedy.txt");
  const auto bytes = test::read_file(dir + "/" + stem + ".logits.bin");
  fx->ref.resize(bytes.size() / sizeof(float));
  std::memcpy(fx->ref.data(), bytes.data(), fx->ref.size() * sizeof(float));
  std::ifstream mf(dir + "/manifest.json");
  const nlohmann::json j = nlohmann::json::parse(mf);
  const auto& e = j.at("models").at(stem);
  fx->type = e.at("type").get<std::string>();
  fx->spread = e.at("llamacpp_self_spread_max_nmse").get<double>();
  fx->free_run_steps = e.at("free_run_checked_steps").get<int>();
  fx->margin = j.at("decisive_margin").get<double>();
  fx->exact_rows = exact_rows(stem);
  fx->peer_rows = peer_rows(stem);
  return (cache[key] = std::move(fx)).get();
}

using kiln::test::run_all;

// An engine whose steps take up to batch_tokens tokens with an output each (the parity runs want every row's logits).
// t: the K and V cache type; v_type, where given, V's.
std::unique_ptr<Engine> make_engine(Model& m, int64_t n_ctx, int max_seqs = 1, DType t = DType::F16,
                                    int64_t batch_tokens = 64, std::optional<DType> v_type = std::nullopt) {
  KvCacheConfig kc;
  kc.n_ctx = n_ctx;
  kc.max_seqs = max_seqs;
  kc.type_k = t;
  kc.type_v = v_type.value_or(t);
  kc.batch_tokens = batch_tokens;
  kc.max_outputs = batch_tokens;
  auto e = Engine::create(m, kc);
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return e ? std::move(e).value() : nullptr;
}

int argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

struct Case {
  std::string stem;
  int n_batch;
  std::string device;
};

class Parity : public ::testing::TestWithParam<Case> {};

TEST_P(Parity, LogitsMatchLlamaCpp) {
  const Case& c = GetParam();
  if (model_dir(c.stem).empty()) KILN_REQUIRE_FIXTURES();
  if (model_dir(c.stem).empty()) GTEST_SKIP() << "skipped: " << c.stem << " not found in the fixtures";
  if (const std::string why = cannot_run(c.stem, c.device); !why.empty()) GTEST_SKIP() << "skipped: " << why;
  Fixture* fx = load_fixture(c.stem, c.device);
  ASSERT_NE(fx, nullptr);
  Model& m = *fx->model;
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> ids = fx->prompt;
  ids.insert(ids.end(), fx->greedy.begin(), fx->greedy.end());
  const int n = n_rows(c.stem);
  ASSERT_EQ(ids.size(), static_cast<size_t>(n));
  ASSERT_EQ(fx->ref.size(), static_cast<size_t>(n * nv));
  auto engine = make_engine(m, n, 1, DType::F16, n);
  ASSERT_NE(engine, nullptr);
  std::vector<float> got;
  Status st = run_all(*engine, ids, c.n_batch, &got);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(got.size(), fx->ref.size());

  const bool exact_type = fx->type == "f16" || fx->type == "bf16" || fx->type == "f32";
  const double L = exact_type ? 1e-4 : std::max(2e-3, 4 * fx->spread);
  double mx = 0, sum = 0;
  int decisive = 0, agree = 0;
  for (int r = 0; r < n; ++r) {
    const float* ref = fx->ref.data() + r * nv;
    const float* mine = got.data() + r * nv;
    const double e = test::nmse(mine, ref, nv);
    mx = std::max(mx, e);
    sum += e;
    const auto peer = fx->peer_rows.find(r);
    const double Lr = peer == fx->peer_rows.end() ? L : std::max(L, 4 * peer->second);
    if (e > L && Lr > L)
      std::printf("[parity] %s b=%d row %d: NMSE %.2e, within 4 x the peer's own spread on this row (%.1e; "
                  "parity_peer_spread.json)\n", c.stem.c_str(), c.n_batch, r, e, peer->second);
    EXPECT_LE(e, Lr) << c.stem << " b=" << c.n_batch << " row " << r;
    std::vector<float> srt(ref, ref + nv);
    std::partial_sort(srt.begin(), srt.begin() + 2, srt.end(), std::greater<float>());
    const bool exact_differs =
        std::find(fx->exact_rows.begin(), fx->exact_rows.end(), r) != fx->exact_rows.end();
    if (srt[0] - srt[1] > fx->margin && exact_differs)
      std::printf("[parity] %s row %d: not decisive (parity_exact_rows.json); this run %d, reference %d\n",
                  c.stem.c_str(), r, argmax(mine, nv), argmax(ref, nv));
    if (srt[0] - srt[1] > fx->margin && !exact_differs) {
      ++decisive;
      const bool same = argmax(mine, nv) == argmax(ref, nv);
      agree += same;
      EXPECT_TRUE(same) << c.stem << " b=" << c.n_batch << " row " << r << ": argmax " << argmax(mine, nv)
                        << " vs reference " << argmax(ref, nv) << " (margin " << srt[0] - srt[1] << ")";
    }
  }
  const double mean = sum / n;
  if (!exact_type) {
    EXPECT_LE(mean, L / 2) << c.stem << " b=" << c.n_batch;
  }
  std::printf("[parity] %-6s %-22s b=%-2d max_nmse=%.3e mean_nmse=%.3e (limit %.1e) argmax %d/%d\n", c.device.c_str(), c.stem.c_str(),
              c.n_batch, mx, mean, L, agree, decisive);
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (const std::string& d : devices())
    for (const std::string& s : all_stems())
      for (int b : {n_rows(s), 7, 1}) v.push_back({s, b, d});
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.device + "_" + info.param.stem.substr(std::string("fixture-").size()) + "_b" +
                  std::to_string(info.param.n_batch);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(all_cases()), case_name);

class FreeRun : public ::testing::TestWithParam<std::string> {};

TEST_P(FreeRun, GreedyMatchesLlamaCpp) {
  const std::string stem = GetParam();
  if (model_dir(stem).empty()) KILN_REQUIRE_FIXTURES();
  if (model_dir(stem).empty()) GTEST_SKIP() << "skipped: " << stem << " not found in the fixtures";
  Fixture* fx = load_fixture(stem);
  ASSERT_NE(fx, nullptr);
  if (fx->free_run_steps == 0)
    GTEST_SKIP() << "skipped: the manifest checks no free-running steps for " << stem
                 << " (free_run_checked_steps 0: llama.cpp's own greedy run is not robust to 1-ulp differences there)";
  Model& m = *fx->model;
  const int64_t nv = m.hparams().n_vocab;
  const int n = n_rows(stem);
  auto engine = make_engine(m, n, 1, DType::F16, n);
  ASSERT_NE(engine, nullptr);
  Batch b;
  for (size_t i = 0; i < fx->prompt.size(); ++i)
    b.add(fx->prompt[i], static_cast<int32_t>(i), 0, i + 1 == fx->prompt.size());
  std::vector<float> lg;
  std::vector<int32_t> gen;
  for (int step = 0; step < fx->free_run_steps; ++step) {
    Status st = engine->forward(b, &lg);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(lg.size(), static_cast<size_t>(nv));
    const int32_t next = argmax(lg.data(), nv);
    gen.push_back(next);
    EXPECT_EQ(next, fx->greedy[step]) << stem << " free-running step " << step;
    if (next != fx->greedy[step]) break;
    b.clear();
    b.add(next, static_cast<int32_t>(fx->prompt.size() + step), 0, true);
  }
  std::printf("[free-run] %-22s %zu/%d ids match\n", stem.c_str(), gen.size(), fx->free_run_steps);
}

std::string stem_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param.substr(std::string("fixture-").size());
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FreeRun, ::testing::ValuesIn(all_stems()), stem_name);

// Three sequences of different lengths interleaved in every batch give the logits each gives alone. Rows are
// computed independently in every op, so the only difference is f32 summation order inside kernels that pick
// their tiling from the batch size: relative error ~1e-7 per logit, NMSE ~1e-13; 1e-9 leaves room while any
// cross-sequence leak (wrong block table, wrong causal length) shows up as NMSE > 1e-3.
TEST(ModelBatching, SeveralSequencesInOneBatchMatchEachAlone) {
  Fixture* fx = load_fixture("fixture-llama-q8_0");
  ASSERT_NE(fx, nullptr);
  Model& m = *fx->model;
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> all = fx->prompt;
  all.insert(all.end(), fx->greedy.begin(), fx->greedy.end());
  const std::vector<std::vector<int32_t>> seqs = {
      std::vector<int32_t>(all.begin(), all.begin() + 21), std::vector<int32_t>(all.begin() + 5, all.end()),
      std::vector<int32_t>(all.begin() + 30, all.begin() + 43)};
  std::vector<std::vector<float>> solo(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    auto c = make_engine(m, 64);
    ASSERT_TRUE(run_all(*c, seqs[s], 64, &solo[s]).is_ok());
  }
  // Together: each step takes up to 5 tokens of every unfinished sequence (cache block size 16, so blocks of the
  // three sequences interleave in the pool).
  auto c = make_engine(m, 3 * 64, 3);
  std::vector<std::vector<float>> joint(seqs.size());
  std::vector<size_t> done(seqs.size(), 0);
  for (bool more = true; more;) {
    Batch b;
    std::vector<int> owner;
    more = false;
    for (size_t s = 0; s < seqs.size(); ++s)
      for (int k = 0; k < 5 && done[s] < seqs[s].size(); ++k, ++done[s]) {
        b.add(seqs[s][done[s]], static_cast<int32_t>(done[s]), static_cast<int32_t>(s), true);
        owner.push_back(static_cast<int>(s));
      }
    if (b.size() == 0) break;
    more = true;
    std::vector<float> lg;
    Status st = c->forward(b, &lg);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (size_t i = 0; i < owner.size(); ++i)
      joint[owner[i]].insert(joint[owner[i]].end(), lg.begin() + i * nv, lg.begin() + (i + 1) * nv);
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    ASSERT_EQ(joint[s].size(), solo[s].size());
    for (size_t r = 0; r < seqs[s].size(); ++r)
      EXPECT_LE(test::nmse(joint[s].data() + r * nv, solo[s].data() + r * nv, nv), 1e-9) << "seq " << s << " row " << r;
  }
}

// K/V cache types (-ctk / -ctv) vs the f16 cache on the F16 llama fixture (2 layers, 4 query / 2 KV heads of 64):
// every row of prompt + greedy continuation, in steps of 7. A type's rounding perturbs K (the scores) and V (the
// outputs) by its relative RMS error r (bf16 ~8x f16's, q8_0 ~0.3% of a block's largest value, 5 bits ~10x that,
// 4 bits ~20x), so the logits' NMSE grows as r^2 through the two layers (test_backend_ops checks the per-op size of
// it for every type). Each bound is about 2x the largest per-row NMSE measured here (beside it), so a type whose
// rounding got ~40% worse in RMS fails; a layout or scale defect (K read as V, the wrong head or block) moves the
// logits by NMSE ~1e-1 or more. (Also measured, not run here to keep the test short: f32 3.8e-7, i.e. f16's own
// rounding; K f16 with V q8_0 2.2e-5; q5_0 4.1e-3; q4_1 1.4e-2.)
TEST(ModelKvTypes, CacheTypesStayCloseToF16) {
  Fixture* fx = load_fixture("fixture-llama-f16");
  ASSERT_NE(fx, nullptr);
  Model& m = *fx->model;
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> ids = fx->prompt;
  ids.insert(ids.end(), fx->greedy.begin(), fx->greedy.end());
  std::vector<float> a;
  auto c16 = make_engine(m, 64, 1, DType::F16);
  ASSERT_TRUE(run_all(*c16, ids, 7, &a).is_ok());
  const struct {
    DType k, v;
    double bound;
  } cases[] = {  // one of each family (the op tests cover every type), the mixed pairs llama.cpp users pick
      {DType::BF16, DType::BF16, 1.5e-5},    // measured 7.2e-6
      {DType::Q8_0, DType::Q8_0, 1.5e-4},    // 6.2e-5
      {DType::Q8_0, DType::F16, 1e-4},       // 4.5e-5
      {DType::Q5_1, DType::Q5_1, 6e-3},      // 2.9e-3
      {DType::Q4_0, DType::Q4_0, 3e-2},      // 1.5e-2
      {DType::IQ4_NL, DType::IQ4_NL, 3e-2},  // 1.5e-2
      {DType::Q8_0, DType::Q4_0, 1.2e-2},    // 5.4e-3
  };
  for (const auto& c : cases) {
    const std::string what = std::string("-ctk ") + dtype_name(c.k) + " -ctv " + dtype_name(c.v);
    auto e = make_engine(m, 64, 1, c.k, 64, c.v);
    ASSERT_NE(e, nullptr) << what;
    std::vector<float> b;
    Status st = run_all(*e, ids, 7, &b);
    ASSERT_TRUE(st.is_ok()) << what << ": " << st.to_string();
    double mx = 0, sum = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const double x = test::nmse(b.data() + r * nv, a.data() + r * nv, nv);
      mx = std::max(mx, x), sum += x;
    }
    std::printf("[kv-types] %-22s max NMSE vs f16 cache %.3e, mean %.3e (bound %.1e)\n", what.c_str(), mx,
                sum / static_cast<double>(ids.size()), c.bound);
    EXPECT_LE(mx, c.bound) << what;
  }
}

// Every device: an engine with a K/V pair its backend stores is created; any other is refused before anything is
// allocated, with an error naming the flag and what the backend stores (the CPU stores every pair; CUDA f32, f16 or
// q8_0, K and V of one type).
TEST(ModelKvTypes, EachBackendCreatesWhatItStoresAndRefusesTheRest) {
  for (const std::string& dev : devices()) {
    Fixture* fx = load_fixture("fixture-llama-f16", dev);
    ASSERT_NE(fx, nullptr) << dev;
    const Backend& be = *fx->model->placement().layers.at(0);
    for (DType k : kKvCacheTypes)
      for (DType v : {DType::F16, DType::Q8_0, DType::Q4_0, DType::BF16}) {
        KvCacheConfig kc;
        kc.n_ctx = 64;
        kc.type_k = k, kc.type_v = v;
        auto e = Engine::create(*fx->model, kc);
        const std::string what = dev + " -ctk " + dtype_name(k) + " -ctv " + dtype_name(v);
        auto stores = [&](DType a, DType b) {
          return be.supports(Op::kKvStore, a, b) && be.supports(Op::kAttention, a, b);
        };
        if (stores(k, v)) {
          EXPECT_TRUE(e.is_ok()) << what << ": " << e.status().to_string();
          continue;
        }
        ASSERT_FALSE(e.is_ok()) << what;
        EXPECT_EQ(e.status().code(), ErrorCode::kUnsupported) << what;
        const std::string stored = std::string(": backend ") + be.name() + " stores " + stored_cache_types(be);
        const std::string want = !stores(k, k)   ? std::string("-ctk ") + dtype_name(k) + stored + " caches"
                                 : !stores(v, v) ? std::string("-ctv ") + dtype_name(v) + stored + " caches"
                                                 : std::string("-ctk ") + dtype_name(k) + " -ctv " + dtype_name(v) +
                                                       ": backend " + be.name() + " stores K and V in one type";
        EXPECT_NE(e.status().message().find(want), std::string::npos) << what << ": " << e.status().message();
      }
  }
}

// The whole forward pass on the fast backend vs the scalar reference backend (the executable spec). Per op they
// agree to f32 summation order (test_backend_ops), but the matmul rounds activations to the weight's activation
// type (f16, 8-bit blocks): a 1-ulp difference upstream occasionally rounds one activation the other way, and
// these random-weight models amplify such flips. That is the same mechanism as llama.cpp's own batched vs
// one-at-a-time spread, so the bound is the manifest's 4 x llamacpp_self_spread_max_nmse (measured: f16 1.9e-7,
// q8_0 1.2e-4, q4_k_m 2.4e-4, qwen3 q4_0 9.2e-5), far below a real defect (1e-2 and up). For qwen35 this also
// compares the chunked delta rule (fast backend, one 64-token step) with the token-by-token recurrence (reference).
TEST(ModelReference, FastBackendMatchesReferenceBackend) {
  for (const char* stem : {"fixture-llama-f16", "fixture-llama-q8_0", "fixture-llama-q4_k_m", "fixture-qwen3-q4_0",
                           "fixture-gemma3-f16", "fixture-qwen35-f16", "fixture-qwen35-q4_k_m",
                           "fixture-qwen3moe-f16", "fixture-qwen3moe-q8_0", "fixture-qwen3moe-q4_k_m"}) {
    if (model_dir(stem).empty()) {
      std::printf("[fast-vs-ref] %s skipped: fixtures not found\n", stem);
      continue;
    }
    Fixture* fx = load_fixture(stem);
    ASSERT_NE(fx, nullptr);
    LoadOptions lo;
    lo.devices.device = "cpu";
    lo.devices.backend.reference = true;
    auto ref = Model::load(model_dir(stem) + "/" + stem + ".gguf", lo);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    const int64_t nv = fx->model->hparams().n_vocab;
    std::vector<int32_t> ids = fx->prompt;
    ids.insert(ids.end(), fx->greedy.begin(), fx->greedy.end());
    std::vector<float> a, b;
    auto ca = make_engine(*fx->model, 64), cb = make_engine(*ref.value(), 64);
    ASSERT_TRUE(run_all(*ca, ids, 64, &a).is_ok());
    ASSERT_TRUE(run_all(*cb, ids, 64, &b).is_ok());
    double mx = 0;
    for (size_t r = 0; r < ids.size(); ++r) mx = std::max(mx, test::nmse(a.data() + r * nv, b.data() + r * nv, nv));
    std::printf("[fast-vs-ref] %s max NMSE %.3e (limit %.2e)\n", stem, mx, 4 * fx->spread);
    EXPECT_LE(mx, 4 * fx->spread) << stem;
  }
}

// Gated DeltaNet: the chunked prefill (chunks of 64 inside one step of 150 tokens: two full chunks and a partial
// one, the state passed between them) against the one-step recurrence (-b 1: 150 decode steps, the state carried
// across steps) and against -b 7 (chunks of 7, state and conv history carried between steps), on the same 150
// tokens of the qwen35 fixture (longer than one chunk; the llama.cpp fixture rows cover one). Both are f32
// evaluations of the same recurrence in different orders; the bound is the f16 fixture's parity limit (1e-4) and
// the measured spread is ~1e-7 (llama.cpp's own batched vs sequential spread on this file: 6.6e-7), while a state
// not carried or a wrong chunk boundary moves rows by NMSE > 1e-2.
TEST(ModelDeltaNet, ChunkedPrefillMatchesRecurrentDecode) {
  const char* stem = "fixture-qwen35-f16";
  if (model_dir(stem).empty()) KILN_REQUIRE_FIXTURES();
  if (model_dir(stem).empty()) GTEST_SKIP() << "skipped: " << stem << " not found in the fixtures";
  Fixture* fx = load_fixture(stem);
  ASSERT_NE(fx, nullptr);
  Model& m = *fx->model;
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> ids = fx->prompt;
  ids.insert(ids.end(), fx->greedy.begin(), fx->greedy.end());
  while (ids.size() < 150) ids.push_back(static_cast<int32_t>((ids.size() * 37 + 11) % nv));
  auto engine_for = [&](int batch_tokens) {
    KvCacheConfig kc;
    kc.n_ctx = 256;
    kc.batch_tokens = batch_tokens;
    kc.max_outputs = batch_tokens;
    auto e = Engine::create(m, kc);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e ? std::move(e).value() : nullptr;
  };
  std::vector<float> chunked, stepwise, by7;
  auto e150 = engine_for(150), e1 = engine_for(1), e7 = engine_for(7);
  ASSERT_TRUE(e150 && e1 && e7);
  ASSERT_TRUE(run_all(*e150, ids, 150, &chunked).is_ok());
  ASSERT_TRUE(run_all(*e1, ids, 1, &stepwise).is_ok());
  ASSERT_TRUE(run_all(*e7, ids, 7, &by7).is_ok());
  ASSERT_EQ(chunked.size(), ids.size() * nv);
  double mx1 = 0, mx7 = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    mx1 = std::max(mx1, test::nmse(chunked.data() + r * nv, stepwise.data() + r * nv, nv));
    mx7 = std::max(mx7, test::nmse(by7.data() + r * nv, stepwise.data() + r * nv, nv));
  }
  std::printf("[delta-net] 150 tokens: chunked (b=150) vs recurrent (b=1) max NMSE %.3e, b=7 vs b=1 %.3e\n", mx1,
              mx7);
  EXPECT_LE(mx1, 1e-4);
  EXPECT_LE(mx7, 1e-4);
}

// Hybrid models: the recurrent state follows the cache. A sequence truncated to a position > 0 cannot continue
// (its state is past that point); restarting it at position 0 resets the state and gives the first run's logits
// again; a fork copies the state, so the forked sequence continues exactly as the original would.
TEST(ModelDeltaNet, RecurrentStateFollowsTheSequence) {
  const char* stem = "fixture-qwen35-f16";
  if (model_dir(stem).empty()) KILN_REQUIRE_FIXTURES();
  if (model_dir(stem).empty()) GTEST_SKIP() << "skipped: " << stem << " not found in the fixtures";
  Fixture* fx = load_fixture(stem);
  ASSERT_NE(fx, nullptr);
  Model& m = *fx->model;
  const int64_t nv = m.hparams().n_vocab;
  std::vector<int32_t> ids = fx->prompt;
  ids.insert(ids.end(), fx->greedy.begin(), fx->greedy.end());
  KvCacheConfig kc;
  kc.n_ctx = 256;
  kc.max_seqs = 2;
  kc.batch_tokens = 64;
  kc.max_outputs = 64;
  kc.prefix_cache = true;  // turned off by the engine for a hybrid model
  auto e = Engine::create(m, kc);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  Engine& E = *e.value();
  EXPECT_TRUE(E.recurrent());
  EXPECT_FALSE(E.cache().config().prefix_cache);
  std::vector<float> first, again, tail_a, tail_b;
  ASSERT_TRUE(run_all(E, ids, 64, &first).is_ok());
  // Truncated to 40: continuing at 40 is refused, naming the sequence.
  E.cache().truncate(0, 40);
  Batch b;
  b.add(ids[40], 40, 0, true);
  std::vector<float> lg;
  const Status st = E.forward(b, &lg);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("sequence 0"), std::string::npos) << st.to_string();
  // Restarted from 0 (the state is reset): the same logits as the first run.
  E.cache().truncate(0, 0);
  ASSERT_TRUE(run_all(E, ids, 7, &again).is_ok());
  double mx = 0;
  for (size_t r = 0; r < ids.size(); ++r) mx = std::max(mx, test::nmse(again.data() + r * nv, first.data() + r * nv, nv));
  EXPECT_LE(mx, 1e-4) << "restart from position 0";
  // Fork after 40 tokens: sequence 1 continues from the copied state like sequence 0 does.
  E.cache().truncate(0, 0);
  std::vector<int32_t> head(ids.begin(), ids.begin() + 40);
  ASSERT_TRUE(run_all(E, head, 64, &lg).is_ok());
  ASSERT_TRUE(E.fork(0, 1).is_ok());
  for (int32_t seq : {0, 1}) {
    Batch t;
    for (size_t i = 40; i < ids.size(); ++i) t.add(ids[i], static_cast<int32_t>(i), seq, true);
    ASSERT_TRUE(E.forward(t, seq == 0 ? &tail_a : &tail_b).is_ok());
  }
  ASSERT_EQ(tail_a.size(), tail_b.size());
  mx = 0;
  for (size_t r = 0; r < tail_a.size() / nv; ++r) {
    mx = std::max(mx, test::nmse(tail_b.data() + r * nv, tail_a.data() + r * nv, nv));
    mx = std::max(mx, test::nmse(tail_a.data() + r * nv, first.data() + (40 + r) * nv, nv));
  }
  EXPECT_LE(mx, 1e-4) << "forked sequence";
}

// The logits of `other` (the same file as fx's model, placed otherwise) against fx's model: prompt + greedy ids with
// the whole sequence in one step and at batch sizes 7 and 1, every row; exact equality (max NMSE 0).
void expect_same_logits(Fixture* fx, Model& other, const std::string& stem, const std::string& label) {
  const int64_t nv = fx->model->hparams().n_vocab;
  std::vector<int32_t> ids = fx->prompt;
  ids.insert(ids.end(), fx->greedy.begin(), fx->greedy.end());
  const int n = n_rows(stem);
  for (int nb : {n, 7, 1}) {
    std::vector<float> one, two;
    auto e1 = make_engine(*fx->model, n, 1, DType::F16, n), e2 = make_engine(other, n, 1, DType::F16, n);
    EXPECT_TRUE(run_all(*e1, ids, nb, &one).is_ok());
    Status st = run_all(*e2, ids, nb, &two);
    EXPECT_TRUE(st.is_ok()) << label << ": " << st.to_string();
    if (!st.is_ok() || one.size() != two.size() || one.size() != ids.size() * nv) {
      ADD_FAILURE() << stem << " " << label << " b=" << nb << ": " << one.size() << " vs " << two.size() << " logits";
      continue;
    }
    double mx = 0;
    for (size_t r = 0; r < ids.size(); ++r) mx = std::max(mx, test::nmse(two.data() + r * nv, one.data() + r * nv, nv));
    EXPECT_EQ(mx, 0.0) << stem << " " << label << " b=" << nb;
  }
}

// The models a placement check loads: those of tests/data (llama F16 / Q8_0 / Q4_K_M, qwen3, one KV head, the
// per-matrix type mix, gpt-oss) and one of each other architecture from the fixtures. What a split can break (the
// activations crossing, a layer's K/V or recurrent state on the wrong backend, a stale index array) depends on the
// architecture's layers and state, not on the weight type, which the parity tests cover.
bool placement_stem(const std::string& stem) {
  static const char* const kOthers[] = {"fixture-qwen2-q4_k_m", "fixture-gemma3-q4_k_m", "fixture-qwen35-q4_k_m",
                                        "fixture-qwen3moe-q4_k_m"};
  const std::string dir = model_dir(stem), data = test::data_path("");
  return (!dir.empty() && dir.compare(0, data.size(), data) == 0) ||
         std::find(std::begin(kOthers), std::end(kOthers), stem) != std::end(kOthers);
}

// Loads each placement_stem model present with its layers split across two backend instances of `device` (first
// half on the first, the rest and the output on the second) and checks that its logits equal the one-backend
// model's (`ref(stem)`) bit for bit with the whole sequence in one step and at batch sizes 7 and 1. Returns the
// number of models checked.
template <class Ref>
int check_split_matches_one(const std::string& device, Ref ref) {
  int n_models = 0;
  for (const std::string& stem : all_stems()) {
    if (!placement_stem(stem) || model_dir(stem).empty() || !cannot_run(stem, device).empty()) continue;
    Fixture* fx = ref(stem);
    EXPECT_NE(fx, nullptr) << stem;
    if (!fx) continue;
    const int64_t n_layer = fx->model->hparams().n_layer;
    EXPECT_GE(n_layer, 2);
    BackendOptions bo;
    bo.n_threads = 2;
    auto a = create_backend(device, bo);
    bo.n_threads = 1;
    auto b = create_backend(device, bo);
    EXPECT_TRUE(a.is_ok() && b.is_ok());
    if (!a || !b) return n_models;
    LoadOptions lo;
    std::shared_ptr<Backend> first(std::move(a).value()), second(std::move(b).value());
    for (int64_t il = 0; il < n_layer; ++il) lo.placement.layers.push_back(il < n_layer / 2 ? first : second);
    lo.placement.input = first;
    lo.placement.output = second;
    auto split = Model::load(model_dir(stem) + "/" + stem + ".gguf", lo);
    EXPECT_TRUE(split.is_ok()) << split.status().to_string();
    if (!split) continue;
    EXPECT_EQ(split.value()->placement().backends().size(), 2u);
    expect_same_logits(fx, *split.value(), stem, "layers split");
    ++n_models;
  }
  std::printf("[placement] %d fixture models split across two %s backends\n", n_models, device.c_str());
  return n_models;
}

// Layers split across two CPU backend instances (each with its own memory and thread pool): activations cross the
// boundary through copy_between, the KV storage of each layer lives on its layer's backend, the output on the
// second. Both backends run the same kernels on the same rows, so the logits are the same bit for bit; the bound
// 0 is exact equality (a boundary bug, a K/V pool on the wrong backend or a stale index array gives NMSE > 1e-3).
// Checked on every fixture model present, with the whole sequence in one step and at batch sizes 7 and 1.
TEST(ModelPlacement, LayersSplitAcrossTwoBackendsMatchOne) {
  const int n = check_split_matches_one("cpu", [](const std::string& stem) { return load_fixture(stem); });
  EXPECT_GE(n, 5);  // the tests/data subset alone has five
}

// --cpu-moe / --n-cpu-moe / -ot as a CPU-only machine can run them: two CPU backend instances, the second standing
// in for the GPU that runs the layers, the first for the host CPU that holds the expert tensors (and routers) of
// some layers and runs their moe_ffn (Placement::experts; the normed input crosses over, the experts' sum comes back
// and is added on the layer's backend). Each mixture-of-experts fixture present (qwen3moe F16 / Q8_0 / Q4_K_M from
// the fixtures, gpt-oss F16 / MXFP4 from tests/data; two layers each) in three placements:
//   all    every layer on the second, the experts of every layer on the first (--cpu-moe with -ngl all)
//   some   every layer on the second, the experts of layer 0 on the first (--n-cpu-moe 1), layer 1's with it
//   mixed  layer 0 on the first with its experts, layer 1 on the second with its experts on the first (-ngl 1
//          --cpu-moe: the experts join the CPU backend that already holds a layer)
// The experts' op runs the same kernels on the same rows as on one backend, and the sum comes back into zeros
// (0 + o = o) before the one add x + o the op itself makes, so the logits are equal bit for bit (bound 0: an
// expert on the wrong backend, a stale input copy or a missing add moves rows by NMSE > 1e-3). Whole sequence in
// one step and at batch sizes 7 and 1.
TEST(ModelPlacement, ExpertsOnAnotherBackendMatchOne) {
  int n_models = 0;
  for (const std::string& stem : all_stems()) {
    const bool moe = std::find(std::begin(kModelsMoe), std::end(kModelsMoe), stem) != std::end(kModelsMoe) ||
                     std::find(std::begin(kModelsGptOss), std::end(kModelsGptOss), stem) != std::end(kModelsGptOss);
    if (!moe || model_dir(stem).empty()) continue;
    Fixture* fx = load_fixture(stem);
    ASSERT_NE(fx, nullptr) << stem;
    ASSERT_EQ(fx->model->hparams().n_layer, 2) << stem;
    BackendOptions bo;
    bo.n_threads = 2;
    auto a = create_backend("cpu", bo);
    bo.n_threads = 1;
    auto b = create_backend("cpu", bo);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    std::shared_ptr<Backend> host(std::move(a).value()), dev(std::move(b).value());
    struct Layout {
      const char* name;
      std::vector<std::shared_ptr<Backend>> layers, experts;
      std::shared_ptr<Backend> input;
      int apart;
      const char* described;
    } layouts[] = {
        {"all", {dev, dev}, {host, host}, dev, 2, "cpu #0: input + layers 0-1 + output; cpu #1: experts of layers 0-1"},
        {"some", {dev, dev}, {host, nullptr}, host, 1,
         "cpu #0: input + experts of layers 0; cpu #1: layers 0-1 + output"},
        {"mixed", {host, dev}, {nullptr, host}, host, 1,
         "cpu #0: input + experts of layers 1 + layers 0; cpu #1: layers 1 + output"},
    };
    for (const Layout& l : layouts) {
      LoadOptions lo;
      lo.placement.layers = l.layers;
      lo.placement.experts = l.experts;
      lo.placement.input = l.input;
      lo.placement.output = dev;
      auto m = Model::load(model_dir(stem) + "/" + stem + ".gguf", lo);
      ASSERT_TRUE(m.is_ok()) << stem << " " << l.name << ": " << m.status().to_string();
      const Placement& p = m.value()->placement();
      EXPECT_EQ(p.backends().size(), 2u) << l.name;
      EXPECT_EQ(p.n_experts_apart(), l.apart) << l.name;
      EXPECT_EQ(p.describe(), l.described) << l.name;
      expect_same_logits(fx, *m.value(), stem, std::string("experts ") + l.name);
    }
    ++n_models;
  }
  std::printf("[placement] %d mixture-of-experts fixture models with their experts on another backend\n", n_models);
  EXPECT_GE(n_models, 2);  // the gpt-oss pair in tests/data
}

// The layer split of several GPUs (issue 17, --split-mode layer) as one GPU can run it: two CUDA backend instances
// on cuda:0 (each with its own stream, memory, scratch and graphs; a split step runs without graphs), activations
// crossing through copy_between. Same kernels on the same rows as the one-backend model (which replays graphs
// for decode steps: same kernels, same launch parameters), so the logits are equal bit for bit; bound 0.
// Skipped without a GPU.
TEST(ModelPlacement, LayersSplitAcrossTwoCudaBackendsOnOneGpuMatchOne) {
  const std::vector<std::string> dev = devices();
  if (std::find(dev.begin(), dev.end(), "cuda:0") == dev.end()) GTEST_SKIP() << "skipped: no CUDA device (cuda:0)";
  const int n = check_split_matches_one("cuda:0", [](const std::string& stem) { return load_fixture(stem, "cuda:0"); });
  EXPECT_GE(n, 5);
}

}  // namespace
}  // namespace kiln
