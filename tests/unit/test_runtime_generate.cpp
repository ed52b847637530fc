// Generation loop (Sequence + Generator) on the fixture models: free-running greedy reproduces llama.cpp's ids at
// every prefill chunk size, chunked prefill equals one-shot prefill, stop rules (n_predict, EOG, full context),
// bad input is an error, chat-style sync feeds only the new suffix.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"

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

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  KvCache* cache = nullptr;  // engine->cache()
};

Loaded load(const std::string& path, int64_t n_ctx = 256, int32_t max_seqs = 1) {
  Loaded l;
  LoadOptions lo;
  lo.devices.device = "cpu";
  lo.devices.backend.n_threads = 1;  // the machine is shared: one thread keeps these correctness tests quick under load
  auto m = Model::load(path, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m) return l;
  l.model = std::move(m).value();
  KvCacheConfig cfg;
  cfg.n_ctx = n_ctx;
  cfg.max_seqs = max_seqs;
  auto e = Engine::create(*l.model, cfg);
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  if (e) {
    l.engine = std::move(e).value();
    l.cache = &l.engine->cache();
  }
  return l;
}

GenerateOptions greedy(int n_batch, int n_predict) {
  GenerateOptions o;
  o.n_batch = n_batch;
  o.seq.n_predict = n_predict;
  o.seq.ignore_eos = true;
  o.seq.sampling.temp = 0;
  o.keep_logits = true;  // the tests compare logits rows (the argmax-only path has its own test)
  return o;
}

std::vector<int32_t> prompt() { return read_ids(test::data_path("models/prompt.txt")); }

// Free-running greedy from the prompt reproduces llama.cpp's first free_run_checked_steps ids (fixtures README),
// with the prompt prefilled in one pass, in chunks of 7 and one token at a time.
void check_free_run(const Fixture& fx, bool keep_logits) {
  SCOPED_TRACE(fx.name + (keep_logits ? " (logits rows)" : " (device argmax)"));
  const auto want = read_ids(fx.dir + "/" + fx.name + ".greedy.txt");
  ASSERT_EQ(want.size(), 32u);
  Loaded l = load(fx.dir + "/" + fx.name + ".gguf");
  ASSERT_TRUE(l.model && l.cache);
  for (int n_batch : {512, 7, 1}) {
    SCOPED_TRACE("n_batch " + std::to_string(n_batch));
    l.cache->clear();
    GenerateOptions o = greedy(n_batch, 32);
    o.keep_logits = keep_logits;
    Generator g(*l.engine, 0, o);
    ASSERT_TRUE(g.validate().is_ok());
    ASSERT_TRUE(g.feed(prompt()).is_ok());
    std::vector<int32_t> got;
    auto stop = g.generate([&](int32_t id, const std::string&) {
      if (id >= 0) got.push_back(id);
      return true;
    });
    ASSERT_TRUE(stop.is_ok()) << stop.status().to_string();
    EXPECT_EQ(*stop, StopReason::kLimit);
    ASSERT_EQ(got.size(), 32u);
    for (int i = 0; i < fx.checked_steps; ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
    EXPECT_EQ(g.sequence().n_cached(), 32 + 31);  // the last sampled token is never fed
    EXPECT_EQ(l.cache->seq_len(0), 32 + 31);
    EXPECT_EQ(g.timings().n_prompt, 32);
    EXPECT_EQ(g.timings().n_gen, 32);
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

// Qwen3.5 and Gemma 3 (models-next/, own manifest and prompt): the Generator's chunked prefill and decode loop over
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
    Loaded l = load(fx.dir + "/" + fx.name + ".gguf");
    ASSERT_TRUE(l.model);
    const int64_t nv = l.model->hparams().n_vocab;
    auto ref_bytes = test::read_file(fx.dir + "/" + fx.name + ".logits.bin");
    ASSERT_EQ(ref_bytes.size(), 64u * nv * sizeof(float));
    std::vector<float> ref(nv);
    std::memcpy(ref.data(), ref_bytes.data() + 31 * nv * sizeof(float), nv * sizeof(float));
    std::vector<float> one_shot;
    for (int n_batch : {512, 7, 5, 1}) {
      SCOPED_TRACE("n_batch " + std::to_string(n_batch));
      l.cache->clear();
      Generator g(*l.engine, 0, greedy(n_batch, 1));
      ASSERT_TRUE(g.feed(prompt()).is_ok());
      auto row = g.last_logits();
      ASSERT_EQ(static_cast<int64_t>(row.size()), nv);
      std::vector<float> cur(row.begin(), row.end());
      if (one_shot.empty()) one_shot = cur;
      EXPECT_LE(test::nmse(cur.data(), one_shot.data(), nv), limit);
      EXPECT_LE(test::nmse(cur.data(), ref.data(), nv), limit);
    }
  }
}

TEST(Generate, ContextFullStopsCleanly) {
  auto fxs = committed();
  ASSERT_FALSE(fxs.empty());
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf", /*n_ctx=*/64);
  ASSERT_TRUE(l.model);
  // n_ctx 40 for this sequence: 32 prompt tokens, then 8 generated tokens are fed and a 9th is sampled from the
  // logits of position 39; it cannot be fed, so generation stops there.
  Generator g(*l.engine, 0, greedy(512, -1), /*n_ctx=*/40);
  ASSERT_TRUE(g.feed(prompt()).is_ok());
  int n = 0;
  auto stop = g.generate([&](int32_t id, const std::string&) {
    n += id >= 0;
    return true;
  });
  ASSERT_TRUE(stop.is_ok()) << stop.status().to_string();
  EXPECT_EQ(*stop, StopReason::kContextFull);
  EXPECT_EQ(n, 9);
  EXPECT_EQ(g.sequence().n_cached(), 40);
  // More prompt than the context holds: an error naming the context, nothing fed.
  Generator g2(*l.engine, 0, greedy(512, -1), /*n_ctx=*/16);
  l.cache->clear();
  Status st = g2.feed(prompt());
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("context"), std::string::npos) << st.message();
  EXPECT_EQ(l.cache->seq_len(0), 0);
}

TEST(Generate, BadTokenIdsAreErrors) {
  auto fxs = committed();
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  ASSERT_TRUE(l.model);
  Generator g(*l.engine, 0, greedy(512, 4));
  std::vector<int32_t> bad = {997, 5, 1000};
  Status st = g.feed(bad);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token 2"), std::string::npos) << st.message();
  std::vector<int32_t> neg = {-1};
  EXPECT_FALSE(g.feed(neg).is_ok());
  // generate() before any logits exist is an error too.
  EXPECT_FALSE(g.generate(nullptr).is_ok());
  // Still usable afterwards.
  ASSERT_TRUE(g.feed(prompt()).is_ok());
  EXPECT_TRUE(g.generate(nullptr).is_ok());
}

TEST(Generate, InvalidOptionsNameTheParameter) {
  auto fxs = committed();
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  ASSERT_TRUE(l.model);
  GenerateOptions o = greedy(0, 4);
  EXPECT_NE(Generator(*l.engine, 0, o).validate().message().find("n_batch"), std::string::npos);
  o = greedy(8, -2);
  EXPECT_NE(Generator(*l.engine, 0, o).validate().message().find("n_predict"), std::string::npos);
  o = greedy(8, 4);
  o.seq.sampling.top_p = -1;
  EXPECT_NE(Generator(*l.engine, 0, o).validate().message().find("top_p"), std::string::npos);
}

TEST(Generate, StopsAtEogUnlessIgnored) {
  auto fxs = committed();
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  ASSERT_TRUE(l.model);
  const Tokenizer& tok = l.model->tokenizer();
  const int32_t eos = tok.eos();
  ASSERT_GE(eos, 0);
  ASSERT_TRUE(tok.is_eog(eos));
  // A negative presence "penalty" over a window of one token lifts the last token fed (EOS) to the top.
  GenerateOptions o = greedy(512, 16);
  o.seq.ignore_eos = false;
  o.seq.sampling.presence_penalty = -1e4f;
  o.seq.sampling.penalty_last_n = 1;
  Generator g(*l.engine, 0, o);
  std::vector<int32_t> p = prompt();
  p.push_back(eos);
  ASSERT_TRUE(g.feed(p).is_ok());
  int n = 0;
  auto stop = g.generate([&](int32_t id, const std::string&) {
    n += id >= 0;
    return true;
  });
  ASSERT_TRUE(stop.is_ok());
  EXPECT_EQ(*stop, StopReason::kEog);
  EXPECT_EQ(n, 0);  // the EOG token is not emitted
  // With ignore_eos the same setup emits EOS until n_predict.
  o.seq.ignore_eos = true;
  l.cache->clear();
  Generator g2(*l.engine, 0, o);
  ASSERT_TRUE(g2.feed(p).is_ok());
  std::vector<int32_t> got;
  stop = g2.generate([&](int32_t id, const std::string&) {
    if (id >= 0) got.push_back(id);
    return true;
  });
  ASSERT_TRUE(stop.is_ok());
  EXPECT_EQ(*stop, StopReason::kLimit);
  EXPECT_EQ(got, std::vector<int32_t>(16, eos));
}

TEST(Generate, CallbackCanStop) {
  auto fxs = committed();
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  ASSERT_TRUE(l.model);
  Generator g(*l.engine, 0, greedy(512, 32));
  ASSERT_TRUE(g.feed(prompt()).is_ok());
  int n = 0;
  auto stop = g.generate([&](int32_t id, const std::string&) { return id < 0 || ++n < 3; });
  ASSERT_TRUE(stop.is_ok());
  EXPECT_EQ(*stop, StopReason::kCallback);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(g.sequence().n_cached(), 32 + 2);
}

// Chat turns: sync() with the conversation so far plus a new turn keeps the cached prefix and feeds only the
// suffix, and the result equals feeding everything from scratch.
TEST(Generate, SyncFeedsOnlyTheNewSuffix) {
  auto fxs = committed();
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  ASSERT_TRUE(l.model);
  Generator g(*l.engine, 0, greedy(512, 8));
  std::vector<int32_t> conv = prompt();
  ASSERT_TRUE(g.sync(conv).is_ok());
  EXPECT_EQ(g.timings().n_prompt, 32);
  std::vector<int32_t> reply;
  ASSERT_TRUE(g.generate([&](int32_t id, const std::string&) {
                 if (id >= 0) reply.push_back(id);
                 return true;
               }).is_ok());
  ASSERT_EQ(reply.size(), 8u);
  // Next turn: the conversation + the reply + 5 new tokens: the 7 fed reply tokens are cached already, the last
  // reply token and the 5 new ones are fed.
  conv.insert(conv.end(), reply.begin(), reply.end());
  const std::vector<int32_t> turn = {10, 20, 30, 40, 50};
  conv.insert(conv.end(), turn.begin(), turn.end());
  ASSERT_TRUE(g.sync(conv).is_ok());
  EXPECT_EQ(g.timings().n_prompt, 32 + 1 + 5);
  EXPECT_EQ(l.cache->seq_len(0), static_cast<int64_t>(conv.size()));
  std::vector<float> incremental(g.last_logits().begin(), g.last_logits().end());
  // A diverging history (an edited earlier turn) truncates back to the common prefix.
  std::vector<int32_t> edited(conv.begin(), conv.begin() + 20);
  edited.push_back(7);
  ASSERT_TRUE(g.sync(edited).is_ok());
  EXPECT_EQ(l.cache->seq_len(0), 21);
  // From scratch on a second sequence-sized cache gives the same last row as the incremental path.
  Loaded fresh = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  Generator g2(*fresh.engine, 0, greedy(512, 8));
  ASSERT_TRUE(g2.feed(conv).is_ok());
  std::vector<float> scratch(g2.last_logits().begin(), g2.last_logits().end());
  const bool is_float = fxs[0].type == "f16" || fxs[0].type == "bf16";
  const double limit = is_float ? 1e-4 : std::max(2e-3, 4 * fxs[0].self_spread);
  EXPECT_LE(test::nmse(incremental.data(), scratch.data(), scratch.size()), limit);
}

TEST(Generate, SameSeedSameText) {
  auto fxs = committed();
  Loaded l = load(fxs[0].dir + "/" + fxs[0].name + ".gguf");
  ASSERT_TRUE(l.model);
  auto run = [&](uint64_t seed) {
    l.cache->clear();
    GenerateOptions o;
    o.seq.n_predict = 24;
    o.seq.ignore_eos = true;
    o.seq.sampling.seed = seed;
    o.seq.sampling.temp = 1.5f;
    Generator g(*l.engine, 0, o);
    EXPECT_TRUE(g.feed(prompt()).is_ok());
    std::vector<int32_t> ids;
    EXPECT_TRUE(g.generate([&](int32_t id, const std::string&) {
                   if (id >= 0) ids.push_back(id);
                   return true;
                 }).is_ok());
    return ids;
  };
  auto a = run(5), b = run(5), c = run(6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Two sequences driven through shared batches (what the server's scheduler does) give each the same tokens as
// running it alone.
TEST(Generate, TwoSequencesInOneBatchMatchSolo) {
  auto fxs = committed();
  const std::string path = fxs[0].dir + "/" + fxs[0].name + ".gguf";
  Loaded l = load(path, 256, 2);
  ASSERT_TRUE(l.model);
  const Tokenizer& tok = l.model->tokenizer();
  const int32_t nv = static_cast<int32_t>(l.model->hparams().n_vocab);
  std::vector<int32_t> p0 = prompt(), p1(p0.begin(), p0.begin() + 20);
  SequenceOptions so;
  so.n_predict = 6;
  so.ignore_eos = true;
  so.sampling.temp = 0;
  Sequence s0(0, tok, nv, 128, so, *l.cache), s1(1, tok, nv, 128, so, *l.cache);
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
    ASSERT_TRUE(l.engine->forward(batch, &logits).is_ok());
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
    Loaded one = load(path);
    Generator g(*one.engine, 0, greedy(512, 6));
    EXPECT_TRUE(g.feed(p).is_ok());
    std::vector<int32_t> ids;
    EXPECT_TRUE(g.generate([&](int32_t id, const std::string&) {
                   if (id >= 0) ids.push_back(id);
                   return true;
                 }).is_ok());
    return ids;
  };
  EXPECT_EQ(out0, solo(p0));
  EXPECT_EQ(out1, solo(p1));
}

}  // namespace
}  // namespace kiln
