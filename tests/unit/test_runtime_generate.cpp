// Generation through the engine loop (runtime/scheduler.h) with one sequence, as `kiln run` drives it, on the
// fixture models: free-running greedy reproduces llama.cpp's ids at every step budget (prompt chunk size),
// chunked prefill equals one-shot prefill, stop rules (max_new_tokens, EOG, full context, stop strings), bad input
// is an error, a chat turn reuses the cached conversation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"

namespace kiln {
namespace {

struct Fixture {
  std::string name, dir, type;
  int checked_steps = 0;
  double self_spread = 0;
};

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path);
  std::vector<int32_t> ids;
  std::string item;
  while (std::getline(f, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

std::vector<Fixture> fixtures_in(const std::string& dir) {
  std::ifstream f(dir + "/manifest.json");
  if (!f) return {};
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<Fixture> out;
  for (auto& [name, m] : j["models"].items()) {
    std::ifstream probe(dir + "/" + name + ".gguf");
    if (!probe) continue;  // the committed subset lists every model but holds a few
    out.push_back({name, dir, m["type"].get<std::string>(), m["free_run_checked_steps"].get<int>(),
                   m["llamacpp_self_spread_max_nmse"].get<double>()});
  }
  return out;
}

std::vector<Fixture> committed() { return fixtures_in(test::data_path("models")); }

using test::generate;
using test::Generated;
using test::greedy_request;
using test::make_scheduler;
using test::one_sequence;

std::vector<int32_t> prompt() { return read_ids(test::data_path("models/prompt.txt")); }
std::string model_file(const Fixture& fx) { return fx.dir + "/" + fx.name + ".gguf"; }

// Tokens the model ran in each step, summed (the step observer).
struct StepCount {
  std::shared_ptr<int64_t> tokens = std::make_shared<int64_t>(0);
  void attach(Scheduler& s) {
    auto t = tokens;
    s.set_step_observer([t](const StepInfo& i) { *t += i.n_tokens; });
  }
};

// Free-running greedy from the prompt reproduces llama.cpp's first free_run_checked_steps ids (fixtures README),
// with the prompt prefilled in one step, in chunks of 7 and one token at a time. keep_logits: a logits processor
// on the sequence makes every step fetch the row (host argmax); without, the device's argmax decides.
void check_free_run(const Fixture& fx, bool keep_logits) {
  SCOPED_TRACE(fx.name + (keep_logits ? " (logits rows)" : " (device argmax)"));
  const auto want = read_ids(fx.dir + "/" + fx.name + ".greedy.txt");
  ASSERT_EQ(want.size(), 32u);
  for (int n_batch : {512, 7, 1}) {
    SCOPED_TRACE("batch_tokens " + std::to_string(n_batch));
    auto s = make_scheduler(model_file(fx), one_sequence(256, n_batch));
    ASSERT_TRUE(s);
    StepCount steps;
    steps.attach(*s);
    std::vector<std::vector<float>> rows;
    GenRequest req = greedy_request(prompt(), 32);
    if (keep_logits) req.hooks = test::record_rows(&rows);
    Generated g = generate(*s, req);
    ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
    EXPECT_EQ(g.stop, StopReason::kLimit);
    EXPECT_EQ(g.reason, FinishReason::kLength);
    ASSERT_EQ(g.ids.size(), 32u);
    for (int i = 0; i < fx.checked_steps; ++i) EXPECT_EQ(g.ids[i], want[i]) << "step " << i;
    EXPECT_EQ(*steps.tokens, 32 + 31);  // the last sampled token is never fed
    EXPECT_EQ(rows.size(), keep_logits ? 32u : 0u);
    EXPECT_EQ(g.timings.n_prompt, 32);
    EXPECT_EQ(g.timings.n_gen, 32);
  }
}

// Models whose manifest checks no free-running step (free_run_checked_steps 0) would pass while checking nothing:
// they are counted and reported, and a suite where none is checkable skips with the reason.
void free_run_all(const std::vector<Fixture>& fxs) {
  int checked = 0;
  std::string unchecked;
  for (auto& fx : fxs) {
    if (fx.checked_steps == 0) {
      unchecked += " " + fx.name;
      continue;
    }
    check_free_run(fx, /*keep_logits=*/true);   // host argmax of the fetched row
    check_free_run(fx, /*keep_logits=*/false);  // the backend's argmax (the greedy fast path)
    ++checked;
  }
  std::printf("[free-run] %d models checked; not checkable (free_run_checked_steps 0):%s\n", checked,
              unchecked.empty() ? " none" : unchecked.c_str());
  if (checked == 0) GTEST_SKIP() << "skipped: no model here has free_run_checked_steps > 0 (" << unchecked << ")";
}

TEST(Generate, FreeRunGreedyMatchesLlamaCpp) {
  auto fxs = committed();
  ASSERT_FALSE(fxs.empty());
  free_run_all(fxs);
}

TEST(Generate, FreeRunGreedyMatchesLlamaCppFullMatrix) {
  KILN_REQUIRE_FIXTURES();
  auto fxs = fixtures_in(test::fixtures_dir() + "/models");
  ASSERT_GE(fxs.size(), 20u);
  free_run_all(fxs);
}

// Qwen3.5 and Gemma 3 (models-next/, own manifest and prompt): the engine loop's chunked prefill and decode over
// the hybrid model's recurrent state and the sliding window.
TEST(Generate, FreeRunGreedyMatchesLlamaCppModelsNext) {
  KILN_REQUIRE_FIXTURES();
  auto fxs = fixtures_in(test::fixtures_dir() + "/models-next");
  ASSERT_GE(fxs.size(), 6u);
  free_run_all(fxs);
}

// The last prompt row after chunked prefill equals the one after one-shot prefill, within the parity limits the
// fixtures README sets between two correct paths (F16/BF16: NMSE 1e-4; quantized: L = max(2e-3, 4 x llama.cpp's
// own batched-vs-sequential spread)), and against llama.cpp's row 31 of logits.bin under the same limits.
TEST(Generate, ChunkedPrefillEqualsOneShot) {
  for (auto& fx : committed()) {
    SCOPED_TRACE(fx.name);
    const bool is_float = fx.type == "f16" || fx.type == "bf16" || fx.type == "f32";
    const double limit = is_float ? 1e-4 : std::max(2e-3, 4 * fx.self_spread);
    std::vector<float> one_shot, ref;
    for (int n_batch : {512, 7, 5, 1}) {
      SCOPED_TRACE("batch_tokens " + std::to_string(n_batch));
      auto s = make_scheduler(model_file(fx), one_sequence(256, n_batch));
      ASSERT_TRUE(s);
      const int64_t nv = s->n_vocab();
      if (ref.empty()) {
        auto ref_bytes = test::read_file(fx.dir + "/" + fx.name + ".logits.bin");
        ASSERT_EQ(ref_bytes.size(), 64u * nv * sizeof(float));
        ref.resize(nv);
        std::memcpy(ref.data(), ref_bytes.data() + 31 * nv * sizeof(float), nv * sizeof(float));
      }
      std::vector<std::vector<float>> rows;
      GenRequest req = greedy_request(prompt(), 1);
      req.hooks = test::record_rows(&rows);
      ASSERT_TRUE(generate(*s, req).error.is_ok());
      ASSERT_EQ(rows.size(), 1u);
      ASSERT_EQ(static_cast<int64_t>(rows[0].size()), nv);
      if (one_shot.empty()) one_shot = rows[0];
      EXPECT_LE(test::nmse(rows[0].data(), one_shot.data(), nv), limit);
      EXPECT_LE(test::nmse(rows[0].data(), ref.data(), nv), limit);
    }
  }
}

TEST(Generate, ContextFullStopsCleanly) {
  auto fxs = committed();
  ASSERT_FALSE(fxs.empty());
  // 40 tokens for this sequence: 32 prompt tokens, then 8 generated tokens are fed and a 9th is sampled from the
  // logits of position 39; it cannot be fed, so generation stops there.
  EngineConfig cfg = one_sequence(64);
  cfg.max_seq_ctx = 40;
  auto s = make_scheduler(model_file(fxs[0]), cfg);
  ASSERT_TRUE(s);
  StepCount steps;
  steps.attach(*s);
  GenRequest req = greedy_request(prompt(), -1);
  Generated g = generate(*s, req);
  ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
  EXPECT_EQ(g.stop, StopReason::kContextFull);
  EXPECT_EQ(g.reason, FinishReason::kLength);
  EXPECT_EQ(g.ids.size(), 9u);
  EXPECT_EQ(*steps.tokens, 40);
  EXPECT_EQ(s->stats().kv_blocks_used, 0);  // freed at the end
  // More prompt than the context holds: an error naming the context, nothing run.
  cfg.max_seq_ctx = 16;
  auto small = make_scheduler(model_file(fxs[0]), cfg);
  ASSERT_TRUE(small);
  Generated o = generate(*small, req);
  EXPECT_EQ(o.error.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(o.error.message().find("context"), std::string::npos) << o.error.message();
  EXPECT_EQ(small->stats().steps, 0u);
}

TEST(Generate, BadTokenIdsAreErrors) {
  auto fxs = committed();
  auto s = make_scheduler(model_file(fxs[0]), one_sequence());
  ASSERT_TRUE(s);
  Generated g = generate(*s, greedy_request({997, 5, s->n_vocab()}, 4));
  EXPECT_EQ(g.error.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(g.error.message().find("token 2"), std::string::npos) << g.error.message();
  EXPECT_FALSE(generate(*s, greedy_request({-1}, 4)).error.is_ok());
  // Still usable afterwards.
  Generated ok = generate(*s, greedy_request(prompt(), 4));
  EXPECT_TRUE(ok.error.is_ok()) << ok.error.to_string();
  EXPECT_EQ(ok.ids.size(), 4u);
}

TEST(Generate, InvalidOptionsNameTheParameter) {
  auto fxs = committed();
  EngineConfig bad = one_sequence();
  bad.batch_tokens = 0;
  auto b = Scheduler::create(test::load_cpu_model(model_file(fxs[0])), bad);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("-b"), std::string::npos) << b.status().message();
  auto s = make_scheduler(model_file(fxs[0]), one_sequence());
  ASSERT_TRUE(s);
  Generated g = generate(*s, greedy_request(prompt(), -2));
  EXPECT_NE(g.error.message().find("max_new_tokens"), std::string::npos) << g.error.message();
  GenRequest r = greedy_request(prompt(), 4);
  r.sampling.top_p = -1;
  EXPECT_NE(generate(*s, r).error.message().find("top_p"), std::string::npos);
}

TEST(Generate, StopsAtEogUnlessIgnored) {
  auto fxs = committed();
  auto s = make_scheduler(model_file(fxs[0]), one_sequence());
  ASSERT_TRUE(s);
  const Tokenizer& tok = s->tokenizer();
  const int32_t eos = tok.eos();
  ASSERT_GE(eos, 0);
  ASSERT_TRUE(tok.is_eog(eos));
  // A negative presence "penalty" over a window of one token lifts the last token fed (EOS) to the top.
  std::vector<int32_t> p = prompt();
  p.push_back(eos);
  GenRequest r = greedy_request(p, 16);
  r.ignore_eos = false;
  r.sampling.presence_penalty = -1e4f;
  r.sampling.penalty_last_n = 1;
  Generated g = generate(*s, r);
  ASSERT_TRUE(g.error.is_ok());
  EXPECT_EQ(g.stop, StopReason::kEog);
  EXPECT_EQ(g.reason, FinishReason::kStop);
  EXPECT_TRUE(g.ids.empty());  // the EOG token is not emitted
  // With ignore_eos the same setup emits EOS until max_new_tokens.
  r.ignore_eos = true;
  g = generate(*s, r);
  ASSERT_TRUE(g.error.is_ok());
  EXPECT_EQ(g.stop, StopReason::kLimit);
  EXPECT_EQ(g.ids, std::vector<int32_t>(16, eos));
}

// A stop string ends the sequence at the token that completes it; the text before it is returned.
TEST(Generate, StopStringEndsTheSequence) {
  auto fxs = committed();
  auto s = make_scheduler(model_file(fxs[0]), one_sequence());
  ASSERT_TRUE(s);
  auto h = s->submit(greedy_request(prompt(), 32));
  ASSERT_TRUE(h.is_ok());
  std::vector<TokenEvent> evs = (*h)->wait_all();
  std::string all;
  std::vector<size_t> ends;  // text length after each token
  for (auto& e : evs) {
    all += e.text;
    if (e.id >= 0) ends.push_back(all.size());
  }
  // The stop string: the text of the first token from the third on that has text.
  std::string stop;
  for (size_t k = 2; k < evs.size() && stop.empty(); ++k)
    if (evs[k].id >= 0) stop = evs[k].text;
  if (stop.empty()) GTEST_SKIP() << "skipped: the greedy continuation writes no text";
  const size_t at = all.find(stop);
  size_t n = 0;
  while (ends[n] < at + stop.size()) ++n;
  GenRequest r = greedy_request(prompt(), 32);
  r.stop = {stop};
  Generated g = generate(*s, r);
  ASSERT_TRUE(g.error.is_ok());
  EXPECT_EQ(g.stop, StopReason::kStopString);
  EXPECT_EQ(g.reason, FinishReason::kStop);
  EXPECT_EQ(g.ids.size(), n + 1);
  EXPECT_EQ(g.text, all.substr(0, at));
}

// Chat turns: a request whose prompt is the conversation so far plus a new turn attaches the cached blocks of the
// conversation (the prefix cache) and computes only the rest; its row equals computing everything from scratch.
TEST(Generate, ChatTurnReusesTheConversation) {
  auto fxs = committed();
  EngineConfig cfg = one_sequence();
  cfg.prefix_cache = true;
  auto s = make_scheduler(model_file(fxs[0]), cfg);
  ASSERT_TRUE(s);
  std::vector<int32_t> conv = prompt();
  Generated first = generate(*s, greedy_request(conv, 8));
  ASSERT_EQ(first.ids.size(), 8u);
  EXPECT_EQ(first.timings.n_cached, 0);
  // Next turn: the conversation + the reply + 5 new tokens (45): the 39 tokens fed before hold two full blocks.
  conv.insert(conv.end(), first.ids.begin(), first.ids.end());
  const std::vector<int32_t> turn = {10, 20, 30, 40, 50};
  conv.insert(conv.end(), turn.begin(), turn.end());
  const uint64_t computed = s->stats().prompt_tokens_computed;
  std::vector<std::vector<float>> rows;
  GenRequest next = greedy_request(conv, 1);
  next.hooks = test::record_rows(&rows);
  Generated second = generate(*s, next);
  ASSERT_TRUE(second.error.is_ok());
  EXPECT_EQ(second.timings.n_cached, 32);
  EXPECT_EQ(s->stats().prompt_tokens_computed - computed, conv.size() - 32);
  ASSERT_EQ(rows.size(), 1u);
  // A diverging history (an edited earlier turn) attaches only the blocks before the edit.
  std::vector<int32_t> edited(conv.begin(), conv.begin() + 20);
  edited.push_back(7);
  EXPECT_EQ(generate(*s, greedy_request(edited, 1)).timings.n_cached, 16);
  // From scratch (no prefix cache) gives the same last row as the incremental path.
  auto fresh = make_scheduler(model_file(fxs[0]), one_sequence());
  std::vector<std::vector<float>> scratch;
  next.hooks = test::record_rows(&scratch);
  ASSERT_TRUE(generate(*fresh, next).error.is_ok());
  ASSERT_EQ(scratch.size(), 1u);
  const bool is_float = fxs[0].type == "f16" || fxs[0].type == "bf16";
  const double limit = is_float ? 1e-4 : std::max(2e-3, 4 * fxs[0].self_spread);
  EXPECT_LE(test::nmse(rows[0].data(), scratch[0].data(), scratch[0].size()), limit);
}

TEST(Generate, SameSeedSameText) {
  auto fxs = committed();
  auto s = make_scheduler(model_file(fxs[0]), one_sequence());
  ASSERT_TRUE(s);
  auto run = [&](uint64_t seed) {
    GenRequest r = greedy_request(prompt(), 24);
    r.sampling.temp = 1.5f;
    r.sampling.seed = seed;
    return generate(*s, r).ids;
  };
  auto a = run(5), b = run(5), c = run(6);
  EXPECT_EQ(a.size(), 24u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Two sequences driven by hand through shared batches (Sequence over Engine::forward) give each the same tokens
// as the engine loop running it alone.
TEST(Generate, TwoSequencesInOneBatchMatchSolo) {
  auto fxs = committed();
  const std::string path = model_file(fxs[0]);
  auto model = test::load_cpu_model(path);
  ASSERT_TRUE(model);
  KvCacheConfig kc;
  kc.n_ctx = 256;
  kc.max_seqs = 2;
  auto engine = Engine::create(*model, kc);
  ASSERT_TRUE(engine.is_ok());
  KvCache& cache = (*engine)->cache();
  const Tokenizer& tok = model->tokenizer();
  const int32_t nv = static_cast<int32_t>(model->hparams().n_vocab);
  std::vector<int32_t> p0 = prompt(), p1(p0.begin(), p0.begin() + 20);
  SequenceOptions so;
  so.max_new_tokens = 6;
  so.ignore_eos = true;
  so.sampling.temp = 0;
  Sequence s0(0, tok, nv, 128, so, cache), s1(1, tok, nv, 128, so, cache);
  ASSERT_TRUE(s0.append(p0).is_ok());
  ASSERT_TRUE(s1.append(p1).is_ok());
  s0.begin_turn();
  s1.begin_turn();
  std::vector<int32_t> out0, out1;
  Batch batch;
  std::vector<float> logits;
  for (int step = 0; step < 64 && (s0.stop_reason() == StopReason::kNone || s1.stop_reason() == StopReason::kNone); ++step) {
    batch.clear();
    std::vector<Sequence*> order;
    for (Sequence* s : {&s0, &s1})
      if (s->stop_reason() == StopReason::kNone && s->schedule(batch, 9) > 0) order.push_back(s);
    ASSERT_FALSE(order.empty());
    ASSERT_TRUE((*engine)->forward(batch, &logits).is_ok());
    size_t row = 0;
    for (Sequence* s : order) {
      const bool want = s->scheduled_wants_logits();
      s->commit();
      if (!want) continue;
      auto st = s->on_logits(std::span<const float>(logits.data() + row * nv, nv));
      ++row;
      if (st.token >= 0) (s == &s0 ? out0 : out1).push_back(st.token);
    }
  }
  auto solo = [&](const std::vector<int32_t>& p) {
    auto s = make_scheduler(path, one_sequence());
    return generate(*s, greedy_request(p, 6)).ids;
  };
  EXPECT_EQ(out0, solo(p0));
  EXPECT_EQ(out1, solo(p1));
}

}  // namespace
}  // namespace kiln
