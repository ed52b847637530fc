// Speculative decoding in the engine loop (runtime/engine_config.h SpecConfig, runtime/hooks.h DraftProposer,
// runtime/ngram_draft.h): with prompt lookup the greedy tokens are the same as without, on the demo model (a trained
// model, where a prompt that repeats itself is continued by copying) and on every fixture model in tests/data; the
// drafts are really verified (stats) and the limits inside a verified chunk hold (max_new_tokens, stop strings);
// sampled requests run with drafts; bad options are refused naming the flag (the kiln run flags: test_cli_run).
// A draft model (runtime/draft_model.h): the vocabulary check names what differs; the same file as its own draft is
// accepted in full and another fixture with the same vocabulary in part, the greedy ids unchanged either way; the
// draft's cache follows the confirmed tokens (rejected drafts rolled back); a request's speculative limits hold.
// Batched drafting (runtime/hooks.h DraftBatch): CPU rows do not depend on the batch; the batched drafts and draft
// caches are the per-sequence ones; parallel sequences keep their greedy ids; -ctkd / -ctvd reach the draft's cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/engine_test_util.h"
#include "common/engine_util.h"
#include "common/test_util.h"
#include "runtime/draft_model.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

std::string demo_model() { return std::string(KILN_SOURCE_DIR) + "/models/kiln-demo.gguf"; }

EngineConfig with_lookup(EngineConfig c, int32_t n, int32_t draft_max = 8) {
  c.spec.type = SpecConfig::Type::kNgram;
  c.spec.ngram_n = n;
  c.spec.draft_max = draft_max;
  return c;
}

// A prompt that copies: the demo model continues a passage it has just seen by repeating it.
const char* kCopyPrompt =
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God "
    "divided the light from the darkness. And God called the light Day, and the darkness he called Night. "
    "And God said, Let there be light: and there was light. And God saw the light,";

using test::SpecRun;
const auto run = test::run_spec;

std::vector<int32_t> encode(const std::string& model, const std::string& text) {
  auto s = test::make_scheduler(model, test::one_sequence(512));
  return s ? s->tokenizer().encode(text, true, false) : std::vector<int32_t>{};
}

TEST(Speculative, GreedyTokensUnchangedOnTheDemoModel) {
  const std::vector<int32_t> p = encode(demo_model(), kCopyPrompt);
  ASSERT_FALSE(p.empty());
  for (int32_t n_new : {1, 5, 40}) {
    SCOPED_TRACE("max_new_tokens " + std::to_string(n_new));
    const SpecRun plain = run(demo_model(), test::one_sequence(512), test::greedy_request(p, n_new));
    const SpecRun spec = run(demo_model(), with_lookup(test::one_sequence(512), 3), test::greedy_request(p, n_new));
    ASSERT_TRUE(plain.g.error.is_ok() && spec.g.error.is_ok()) << spec.g.error.to_string();
    EXPECT_EQ(spec.g.ids, plain.g.ids);
    EXPECT_EQ(spec.g.text, plain.g.text);
    EXPECT_EQ(static_cast<int32_t>(spec.g.ids.size()), n_new);
    EXPECT_EQ(plain.stats.draft_tokens, 0u);
    if (n_new == 40) {
      EXPECT_GT(spec.stats.draft_tokens, 0u) << "the copy prompt gives the lookup matches";
      EXPECT_GT(spec.stats.draft_accepted, 0u);
      EXPECT_LT(spec.stats.steps, plain.stats.steps) << "confirmed drafts save steps";
      std::printf("demo model, copy prompt, 40 tokens: %llu steps without drafts, %llu with (%llu drafts, %llu "
                  "confirmed)\n",
                  (unsigned long long)plain.stats.steps, (unsigned long long)spec.stats.steps,
                  (unsigned long long)spec.stats.draft_tokens, (unsigned long long)spec.stats.draft_accepted);
    }
  }
}

// Every fixture model of tests/data (random weights: their greedy text repeats itself, so the lookup finds
// matches), greedy with and without drafts, token for token.
TEST(Speculative, GreedyTokensUnchangedOnTheFixtureModels) {
  const std::string dir = test::data_path("models");
  const std::vector<int32_t> prompt = test::read_ids(dir + "/prompt.txt");
  ASSERT_FALSE(prompt.empty());
  int checked = 0;
  uint64_t drafted = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().filename().string());
    const SpecRun plain = run(e.path().string(), test::one_sequence(512), test::greedy_request(prompt, 48));
    const SpecRun spec = run(e.path().string(), with_lookup(test::one_sequence(512), 2), test::greedy_request(prompt, 48));
    ASSERT_TRUE(plain.g.error.is_ok() && spec.g.error.is_ok()) << spec.g.error.to_string();
    EXPECT_EQ(spec.g.ids, plain.g.ids) << "drafted " << spec.stats.draft_tokens << ", confirmed "
                                       << spec.stats.draft_accepted;
    drafted += spec.stats.draft_tokens;
    ++checked;
  }
  EXPECT_GE(checked, 3);
  EXPECT_GT(drafted, 0u) << "no fixture's text repeated itself: the drafts were never verified";
}

// A stop string that ends inside a verified chunk ends the text where it does without drafts.
TEST(Speculative, StopStringInsideConfirmedDrafts) {
  const std::vector<int32_t> p = encode(demo_model(), kCopyPrompt);
  const SpecRun plain = run(demo_model(), test::one_sequence(512), test::greedy_request(p, 40));
  ASSERT_GT(plain.g.text.size(), 40u);
  const std::string stop = plain.g.text.substr(plain.g.text.size() / 2, 6);
  GenRequest r = test::greedy_request(p, 40);
  r.stop = {stop};
  const SpecRun a = run(demo_model(), test::one_sequence(512), r);
  const SpecRun b = run(demo_model(), with_lookup(test::one_sequence(512), 3), r);
  EXPECT_EQ(b.g.text, a.g.text);
  EXPECT_EQ(b.g.stop, StopReason::kStopString);
  EXPECT_EQ(a.g.stop, StopReason::kStopString);
}

// Sampling at temperature > 0 with drafts: as many tokens as asked, no error, drafts verified. (Each row is sampled
// as without drafts and a draft is kept only when the sample equals it: the rejection rule for drafts proposed
// with certainty, so the distribution is the sampler's.)
TEST(Speculative, SampledRequestsRunWithDrafts) {
  const std::vector<int32_t> p = encode(demo_model(), kCopyPrompt);
  GenRequest r = test::greedy_request(p, 40);
  r.sampling.temp = 0.3f;
  r.sampling.seed = 5;
  const SpecRun spec = run(demo_model(), with_lookup(test::one_sequence(512), 3), r);
  ASSERT_TRUE(spec.g.error.is_ok()) << spec.g.error.to_string();
  EXPECT_EQ(spec.g.ids.size(), 40u);
  EXPECT_GT(spec.stats.draft_tokens, 0u);
}

// Several sequences verifying drafts in one step, within a small token budget (drafts take what is left).
TEST(Speculative, ManySequencesAndASmallBudget) {
  const std::vector<int32_t> p = encode(demo_model(), kCopyPrompt);
  EngineConfig c = test::one_sequence(2048, 16);
  c.max_seqs = 3;
  auto plain = test::make_scheduler(demo_model(), c);
  auto spec = test::make_scheduler(demo_model(), with_lookup(c, 3, 12));
  ASSERT_TRUE(plain && spec);
  std::vector<std::shared_ptr<RequestHandle>> hp, hs;
  for (int i = 0; i < 3; ++i) {
    hp.push_back(*plain->submit(test::greedy_request(p, 24 + 4 * i)));
    hs.push_back(*spec->submit(test::greedy_request(p, 24 + 4 * i)));
  }
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> a, b;
    for (const TokenEvent& e : hp[static_cast<size_t>(i)]->wait_all())
      if (e.id >= 0) a.push_back(e.id);
    for (const TokenEvent& e : hs[static_cast<size_t>(i)]->wait_all())
      if (e.id >= 0) b.push_back(e.id);
    EXPECT_EQ(b, a) << "request " << i;
    EXPECT_EQ(b.size(), static_cast<size_t>(24 + 4 * i));
  }
  EXPECT_GT(spec->stats().draft_tokens, 0u);
}

// ---- draft model ----

std::string fixture(const std::string& name) { return test::data_path("models/" + name + ".gguf"); }

EngineConfig with_draft(EngineConfig c, int32_t draft_max = 4) {
  c.spec.type = SpecConfig::Type::kDraft;
  c.spec.draft_max = draft_max;
  return c;
}

SpecRun run_draft(const std::string& model, const std::string& draft, const EngineConfig& cfg, GenRequest r) {
  SpecRun out;
  auto m = test::load_cpu_model(model);
  auto d = test::load_cpu_model(draft);
  if (!m || !d) return out;
  auto s = Scheduler::create(std::move(m), cfg, std::move(d));
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s) return out;
  out.g = test::generate(**s, std::move(r));
  out.stats = (*s)->stats();
  return out;
}

// A vocabulary in memory: what check_draft_vocab reads.
class FakeVocab final : public Tokenizer {
 public:
  explicit FakeVocab(int32_t n) : text_(static_cast<size_t>(n)) {
    for (int32_t i = 0; i < n; ++i) text_[static_cast<size_t>(i)] = "t" + std::to_string(i);
  }
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string token_to_piece(int32_t id, bool) const override { return text_[static_cast<size_t>(id)]; }
  bool strips_leading_space() const override { return false; }
  int32_t n_vocab() const override { return static_cast<int32_t>(text_.size()); }
  const std::string& token_text(int32_t id) const override { return text_[static_cast<size_t>(id)]; }
  TokenType token_type(int32_t) const override { return TokenType::kNormal; }
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }
  int32_t sep() const override { return -1; }
  bool add_bos() const override { return add_bos_; }
  bool add_eos() const override { return false; }
  bool add_sep() const override { return false; }
  bool is_eog(int32_t id) const override { return id == eos_ || id == eot_; }
  FimTokens fim() const override { return {}; }
  const std::string& model_name() const override { return model_; }
  const std::string& pre_name() const override { return model_; }

  std::vector<std::string> text_;
  int32_t bos_ = 1, eos_ = 2, eot_ = -1;
  bool add_bos_ = true;
  std::string model_ = "gpt2";
};

TEST(DraftModel, VocabularyCheckNamesWhatDiffers) {
  const auto err = [](const FakeVocab& t, const FakeVocab& d) { return check_draft_vocab(t, d).to_string(); };
  const FakeVocab t(1000);
  EXPECT_TRUE(check_draft_vocab(t, FakeVocab(1000)).is_ok());
  EXPECT_TRUE(check_draft_vocab(t, FakeVocab(1000 + kMaxVocabDiff)).is_ok()) << "llama.cpp's size tolerance";
  EXPECT_NE(err(t, FakeVocab(1000 + kMaxVocabDiff + 1)).find("vocabulary has 1129 tokens, the model's 1000"),
            std::string::npos);
  FakeVocab d(1000);
  d.model_ = "llama";
  EXPECT_NE(err(t, d).find("tokenizer is 'llama', the model's 'gpt2'"), std::string::npos) << err(t, d);
  d = FakeVocab(1000);
  d.bos_ = 3;
  EXPECT_NE(err(t, d).find("BOS token differs"), std::string::npos) << err(t, d);
  d = FakeVocab(1000);
  d.add_bos_ = false;
  EXPECT_NE(err(t, d).find("BOS token differs"), std::string::npos) << err(t, d);
  d = FakeVocab(1000);
  d.eos_ = 7;
  EXPECT_NE(err(t, d).find("EOS token differs"), std::string::npos) << err(t, d);
  d = FakeVocab(1000);
  d.eot_ = 900;
  EXPECT_NE(err(t, d).find("token 900 't900' ends generation"), std::string::npos) << err(t, d);
  d = FakeVocab(1000);
  d.text_[517] = "x\n";
  EXPECT_NE(err(t, d).find("token 517 is 't517' in the model, 'x\\x0a' in the draft"), std::string::npos) << err(t, d);
  d = FakeVocab(1000);
  d.text_[3] = "other";  // below llama.cpp's first checked id
  EXPECT_TRUE(check_draft_vocab(t, d).is_ok());
  // Real files: the demo model's vocabulary is not the fixtures'.
  auto m = test::load_cpu_model(fixture("fixture-llama-f16"));
  auto demo = test::load_cpu_model(demo_model());
  ASSERT_TRUE(m && demo);
  auto s = Scheduler::create(std::move(m), with_draft(test::one_sequence(256)), std::move(demo));
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().message().rfind("-md:", 0), 0u) << s.status().to_string();
}

TEST(DraftModel, ConfigErrorsNameTheFlag) {
  auto m = test::load_cpu_model(fixture("fixture-llama-q8_0"));
  ASSERT_TRUE(m);
  auto a = Scheduler::create(std::move(m), with_draft(test::one_sequence(256)));
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("draft-simple: needs a draft model (-md FILE)"), std::string::npos);
  auto m2 = test::load_cpu_model(fixture("fixture-llama-q8_0"));
  auto d2 = test::load_cpu_model(fixture("fixture-llama-q8_0"));
  auto b = Scheduler::create(std::move(m2), with_lookup(test::one_sequence(256), 2), std::move(d2));
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("-md: a draft model is used by --spec-type draft-simple (got ngram-simple)"),
            std::string::npos);
  SpecConfig p;
  p.p_min = 1.5f;
  EXPECT_NE(check_spec(p).to_string().find("--spec-draft-p-min"), std::string::npos);
}

// The same file as its own draft: every draft is the model's own greedy choice (a verify step's rows equal one-token
// steps' bit for bit), so all are confirmed; the ids are those without drafts.
TEST(DraftModel, OwnDraftIsAcceptedInFull) {
  const std::vector<int32_t> prompt = test::read_ids(test::data_path("models/prompt.txt"));
  const std::string f = fixture("fixture-llama-f16");
  const SpecRun plain = run(f, test::one_sequence(512), test::greedy_request(prompt, 40));
  const SpecRun spec = run_draft(f, f, with_draft(test::one_sequence(512)), test::greedy_request(prompt, 40));
  ASSERT_TRUE(plain.g.error.is_ok() && spec.g.error.is_ok()) << spec.g.error.to_string();
  EXPECT_EQ(spec.g.ids, plain.g.ids);
  EXPECT_GT(spec.stats.draft_tokens, 0u);
  EXPECT_EQ(spec.stats.draft_accepted, spec.stats.draft_tokens);
  EXPECT_EQ(spec.g.timings.n_draft, static_cast<int64_t>(spec.stats.draft_tokens));
  EXPECT_EQ(spec.g.timings.n_draft_accepted, static_cast<int64_t>(spec.stats.draft_accepted));
  // The prompt's step gives 1 token, then 4 drafts and the model's own token per step, the last step's drafts cut
  // to the 3 the limit leaves: 40 tokens in 9 steps, 31 drafts.
  EXPECT_EQ(spec.stats.steps, 9u);
  EXPECT_EQ(spec.stats.draft_tokens, 31u);
}

// Another fixture with the same vocabulary proposes some of the model's tokens: partial acceptance, the same ids.
TEST(DraftModel, OtherDraftIsAcceptedInPartWithTheSameIds) {
  const std::vector<int32_t> prompt = test::read_ids(test::data_path("models/prompt.txt"));
  const std::string f = fixture("fixture-llama-f16");
  const SpecRun plain = run(f, test::one_sequence(512), test::greedy_request(prompt, 48));
  for (const char* d : {"fixture-llama-q4_k_m", "fixture-qwen3-q4_0"}) {
    SCOPED_TRACE(d);
    const SpecRun spec = run_draft(f, fixture(d), with_draft(test::one_sequence(512)), test::greedy_request(prompt, 48));
    ASSERT_TRUE(spec.g.error.is_ok()) << spec.g.error.to_string();
    EXPECT_EQ(spec.g.ids, plain.g.ids);
    EXPECT_EQ(spec.g.text, plain.g.text);
    EXPECT_GT(spec.stats.draft_tokens, 0u);
    EXPECT_LT(spec.stats.draft_accepted, spec.stats.draft_tokens);
    // The quantized copy of the model agrees with it often; another architecture's random weights (almost) never.
    if (std::string(d) == "fixture-llama-q4_k_m") {
      EXPECT_GT(spec.stats.draft_accepted, 0u);
    }
    std::printf("fixture-llama-f16 with draft %s: %llu drafts, %llu accepted, %llu steps (%llu without)\n", d,
                (unsigned long long)spec.stats.draft_tokens, (unsigned long long)spec.stats.draft_accepted,
                (unsigned long long)spec.stats.steps, (unsigned long long)plain.stats.steps);
  }
}

// The proposer's draft cache: after a step that confirmed one draft and sampled another token, the rejected drafts
// are gone from the draft's KV and the next drafts are those a fresh proposer makes from the same tokens.
TEST(DraftModel, RejectedDraftsAreRolledBack) {
  auto target = test::load_cpu_model(fixture("fixture-llama-f16"));
  auto dm = DraftModel::create(*target, test::load_cpu_model(fixture("fixture-llama-q4_k_m")), DraftCacheConfig{512, 2});
  ASSERT_TRUE(dm.is_ok()) << dm.status().to_string();
  DraftModel& m = **dm;
  DraftModelProposer a(*dm, 0, 0.0f), fresh(*dm, 1, 0.0f);
  const std::vector<int32_t> prompt = test::read_ids(test::data_path("models/prompt.txt"));
  std::vector<int32_t> out(8);
  ASSERT_EQ(a.propose(prompt, 4, out), 4);
  const std::vector<int32_t> d1(out.begin(), out.begin() + 4);
  // The draft's cache: the prompt and the first 3 drafts (the 4th was never fed).
  std::vector<int32_t> want = prompt;
  want.insert(want.end(), d1.begin(), d1.begin() + 3);
  EXPECT_EQ(a.held(), want);
  EXPECT_EQ(m.engine().cache().seq_len(0), static_cast<int64_t>(want.size()));
  a.accepted(1);
  EXPECT_EQ(a.n_proposed(), 4);
  EXPECT_EQ(a.n_accepted(), 1);
  // The model confirmed d1[0] and then sampled something other than d1[1].
  std::vector<int32_t> seq = prompt;
  seq.push_back(d1[0]);
  seq.push_back((d1[1] + 1) % 1000);
  ASSERT_EQ(a.propose(seq, 4, out), 4);
  const std::vector<int32_t> d2(out.begin(), out.begin() + 4);
  ASSERT_EQ(a.held().size(), seq.size() + 3);
  EXPECT_TRUE(std::equal(seq.begin(), seq.end(), a.held().begin())) << "the rejected drafts left the draft's cache";
  EXPECT_EQ(m.engine().cache().seq_len(0), static_cast<int64_t>(seq.size() + 3));
  ASSERT_EQ(fresh.propose(seq, 4, out), 4);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 4), d2);
  // p_min 1: no token of a random model is that certain: nothing is proposed.
  DraftModelProposer sure(*dm, 1, 1.0f);
  EXPECT_EQ(sure.propose(seq, 4, out), 0);
  EXPECT_FALSE(sure.off());
}

// A request's own limits: n_max 0 drafts nothing, n_max 2 at most 2 per step; out-of-range values are refused
// naming llama-server's field.
TEST(DraftModel, RequestLimits) {
  const std::vector<int32_t> prompt = test::read_ids(test::data_path("models/prompt.txt"));
  const std::string f = fixture("fixture-llama-q8_0");
  auto m = test::load_cpu_model(f);
  auto d = test::load_cpu_model(f);
  ASSERT_TRUE(m && d);
  auto s = Scheduler::create(std::move(m), with_draft(test::one_sequence(512), 6), std::move(d));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Scheduler& S = **s;
  int32_t widest = 0;
  S.set_step_observer([&](const StepInfo& st) {
    if (st.n_decode > 0) widest = std::max(widest, st.n_tokens);
  });
  const test::Generated all = test::generate(S, test::greedy_request(prompt, 16));
  EXPECT_EQ(widest, 7) << "the engine's 6 drafts and the pending token";
  GenRequest r0 = test::greedy_request(prompt, 16);
  r0.spec.n_max = 0;
  widest = 0;
  const uint64_t before = S.stats().draft_tokens;
  const test::Generated none = test::generate(S, r0);
  EXPECT_EQ(S.stats().draft_tokens, before);
  EXPECT_EQ(none.timings.n_draft, 0);
  EXPECT_EQ(widest, 1);
  GenRequest r2 = test::greedy_request(prompt, 16);
  r2.spec.n_max = 2;
  widest = 0;
  const test::Generated two = test::generate(S, r2);
  EXPECT_EQ(widest, 3);
  EXPECT_EQ(none.ids, all.ids);
  EXPECT_EQ(two.ids, all.ids);
  const auto err = [&](SpecRequest sr) {
    GenRequest r = test::greedy_request(prompt, 4);
    r.spec = sr;
    auto h = S.submit(r);
    return h ? std::string() : h.status().message();
  };
  EXPECT_EQ(err({7, -1, -1}).rfind("speculative.n_max: must be in [0, 6]", 0), 0u) << err({7, -1, -1});
  EXPECT_EQ(err({2, 3, -1}).rfind("speculative.n_min:", 0), 0u);
  EXPECT_EQ(err({-1, -1, 1.5f}).rfind("speculative.p_min:", 0), 0u);
  EXPECT_EQ(err({2, 2, 0.5f}), "");
  SpecConfig off, lookup;
  lookup.type = SpecConfig::Type::kNgram;
  EXPECT_EQ(check_spec_request({4, -1, -1}, off).message().rfind("speculative.n_max: this engine runs without", 0), 0u);
  EXPECT_TRUE(check_spec_request({0, 0, 0}, off).is_ok());
  EXPECT_EQ(check_spec_request({-1, -1, 0.5f}, lookup).message().rfind("speculative.p_min:", 0), 0u);
}

// ---- batched drafting (runtime/hooks.h DraftBatch) ----

// n ids of the fixture vocabulary: the prompt file's, shifted by `seed` (sequences of different content and length).
std::vector<int32_t> ids_of(size_t n, int32_t seed) {
  const std::vector<int32_t> p = test::read_ids(test::data_path("models/prompt.txt"));
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = (p[i % p.size()] + seed * 7 + static_cast<int32_t>(i / p.size()) * 3) % 1000;
  return v;
}

std::shared_ptr<DraftModel> draft_of(const Model& target, const std::string& file, DraftCacheConfig c) {
  auto dm = DraftModel::create(target, test::load_cpu_model(file), c);
  EXPECT_TRUE(dm.is_ok()) << dm.status().to_string();
  return dm ? *dm : nullptr;
}

// One model's row for the last token of seq 0 (20 tokens, then 1 more) alone, and in steps with other sequences
// around it (a few tokens, or 130 and 70: wide matmul tiles), with 1 and 2 threads: on the CPU backend the rows are
// the same bit for bit (what makes batched drafts the per-sequence ones).
TEST(DraftModel, CpuRowsDoNotDependOnTheBatch) {
  for (const std::string& file : {fixture("fixture-llama-f16"), fixture("fixture-llama-q4_k_m"),
                                   fixture("fixture-qwen3-q4_0"), fixture("fixture-llama-q8_0"), demo_model()})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(file + ", threads " + std::to_string(threads));
      LoadOptions lo;
      lo.devices.device = "cpu";
      lo.devices.backend.n_threads = threads;
      auto m = Model::load(file, lo);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      KvCacheConfig kc;
      kc.n_ctx = 1024;
      kc.max_seqs = 3;
      kc.max_outputs = 3;
      const std::vector<int32_t> s0 = ids_of(21, 0), s1 = ids_of(400, 1), s2 = ids_of(8, 2);
      const OutputKind kinds[3] = {OutputKind::kLogits, OutputKind::kLogits, OutputKind::kLogits};
      // c0, c1: tokens of seq 1 in steps 1 and 2 (0: seq 0 alone); a few, or enough for wide matmul tiles.
      auto rows_of = [&](size_t c0, size_t c1) {
        const bool crowded = c0 > 0;
        std::vector<std::vector<float>> rows;
        auto e = Engine::create(**m, kc);
        EXPECT_TRUE(e.is_ok()) << e.status().to_string();
        if (!e) return rows;
        std::vector<BatchToken> b;
        auto add = [&](const std::vector<int32_t>& s, int32_t seq, size_t from, size_t to) {
          for (size_t i = from; i < to; ++i) b.push_back({s[i], static_cast<int32_t>(i), seq, i + 1 == to});
        };
        // Step 1: the first 20 tokens of seq 0 (between two others); step 2: its 21st (and others' chunks, decodes).
        for (int step = 0; step < 2; ++step) {
          b.clear();
          if (crowded) add(s1, 1, step == 0 ? 0 : c0, step == 0 ? c0 : c0 + c1);
          add(s0, 0, step == 0 ? 0 : 20, step == 0 ? 20 : 21);
          if (crowded) add(s2, 2, step == 0 ? 0 : 7, step == 0 ? 7 : 8);
          auto out = (*e)->step(b, kinds);
          EXPECT_TRUE(out.is_ok()) << out.status().to_string();
          if (!out) return rows;
          const int32_t r = crowded ? 1 : 0;
          rows.emplace_back(out->row(r), out->row(r) + out->n_vocab);
        }
        return rows;
      };
      const auto alone = rows_of(0, 0);
      ASSERT_EQ(alone.size(), 2u);
      for (const auto& [c0, c1] : {std::pair<size_t, size_t>{11, 3}, {130, 70}}) {
        const auto crowded = rows_of(c0, c1);
        ASSERT_EQ(crowded.size(), 2u);
        for (size_t i = 0; i < 2; ++i)
          EXPECT_EQ(std::memcmp(alone[i].data(), crowded[i].data(), alone[i].size() * sizeof(float)), 0)
              << "step " << i << ", " << c0 << " + " << c1 << " tokens of another sequence";
      }
    }
}

// Five sequences, drafted together by one DraftModel and one propose() at a time by another: the same drafts and the
// same draft caches, over two steps, with steps of 512 and of 4 tokens (catch-ups and rounds split over several).
// Sequence 0 reaches its max_k, 1 has its drafts rejected in the second step, 2 stops at p_min, 3 needs more than
// the draft's whole cache (it proposes nothing, the others go on), 4 confirms one draft. The second step's budget
// runs out part way: sequence 1 is given fewer drafts than it asks for and 2 and 4 only their catch-up (they draft
// on alone).
TEST(DraftModel, BatchedDraftsAreThePerSequenceDrafts) {
  auto target = test::load_cpu_model(fixture("fixture-llama-f16"));
  ASSERT_TRUE(target);
  const std::string dfile = fixture("fixture-llama-q4_k_m");
  // p_min for sequence 2: the probability of its first draft, when a later one of its first 4 is less likely.
  std::vector<int32_t> s2;
  float p2 = 0;
  {
    auto probe = draft_of(*target, dfile, DraftCacheConfig{512, 1});
    ASSERT_TRUE(probe);
    for (size_t len = 33; len < 64 && p2 == 0; ++len) {
      std::vector<int32_t> s = ids_of(len, 5);
      probe->engine().cache().truncate(0, 0);
      auto next = probe->run(0, s, 0, true);
      ASSERT_TRUE(next.is_ok());
      const float p0 = next->p;
      for (int j = 1; j < 4; ++j) {
        const int32_t id = next->id;
        next = probe->run(0, std::span<const int32_t>(&id, 1), static_cast<int64_t>(len) + j - 1, true);
        ASSERT_TRUE(next.is_ok());
        if (next->p < p0) {
          s2 = s, p2 = p0;
          break;
        }
      }
    }
    ASSERT_GT(p2, 0.0f) << "no sequence whose draft probabilities fall";
  }
  for (int32_t batch : {512, 4}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    DraftCacheConfig c{256, 5, batch};
    auto bm = draft_of(*target, dfile, c), sm = draft_of(*target, dfile, c);
    ASSERT_TRUE(bm && sm);
    EXPECT_EQ(bm->engine().caps().max_outputs, std::min(5, batch));
    const std::vector<float> p_min = {0, 0, p2, 0, 0};
    std::vector<std::unique_ptr<DraftModelProposer>> pb, ps;
    for (int32_t i = 0; i < 5; ++i) {
      pb.push_back(std::make_unique<DraftModelProposer>(bm, i, p_min[static_cast<size_t>(i)]));
      ps.push_back(std::make_unique<DraftModelProposer>(sm, i, p_min[static_cast<size_t>(i)]));
    }
    std::vector<std::vector<int32_t>> seqs = {ids_of(9, 0), ids_of(20, 1), s2, ids_of(300, 3), ids_of(3, 4)};
    std::vector<int32_t> max_k = {4, 6, 4, 4, 3};
    std::vector<std::vector<int32_t>> drafts(5);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::vector<DraftJob> jobs;
      for (size_t i = 0; i < 5; ++i) jobs.push_back({pb[i].get(), seqs[i], max_k[i]});
      bm->propose(jobs, step == 0 ? 1000 : 10);
      for (size_t i = 0; i < 5; ++i) {
        SCOPED_TRACE("sequence " + std::to_string(i));
        std::vector<int32_t> ob(8, -1), os(8, -1);
        const int32_t nb = pb[i]->propose(seqs[i], max_k[i], ob), ns = ps[i]->propose(seqs[i], max_k[i], os);
        EXPECT_EQ(nb, ns);
        EXPECT_EQ(ob, os);
        EXPECT_EQ(pb[i]->held(), ps[i]->held());
        EXPECT_EQ(pb[i]->off(), ps[i]->off());
        EXPECT_EQ(bm->engine().cache().seq_len(static_cast<int32_t>(i)), static_cast<int64_t>(pb[i]->held().size()));
        drafts[i].assign(ob.begin(), ob.begin() + std::max(nb, 0));
      }
      if (step == 0) {
        EXPECT_EQ(drafts[0].size(), 4u) << "max_k";
        EXPECT_EQ(drafts[1].size(), 6u);
        EXPECT_GE(drafts[2].size(), 1u);
        EXPECT_LT(drafts[2].size(), 4u) << "p_min";
        EXPECT_TRUE(drafts[3].empty() && pb[3]->off()) << "the draft's cache holds 256 tokens, not 300";
        EXPECT_EQ(drafts[4].size(), 3u);
      }
      // What the model made of them: 0 all confirmed and one more; 1 the first confirmed, the second rejected; 2 the
      // first rejected; 4 one confirmed.
      const auto confirm = [&](size_t i, size_t n, int32_t other) {
        seqs[i].insert(seqs[i].end(), drafts[i].begin(), drafts[i].begin() + static_cast<std::ptrdiff_t>(n));
        seqs[i].push_back(n < drafts[i].size() ? (drafts[i][n] + 1) % 1000 : other);
      };
      confirm(0, drafts[0].size(), 17);
      confirm(1, std::min<size_t>(1, drafts[1].size()), 18);
      confirm(2, 0, 19);
      confirm(3, 0, 20);
      confirm(4, std::min<size_t>(1, drafts[4].size()), 21);
    }
  }
}

// Several sequences at once through the scheduler with a draft model: each one's greedy ids are those without
// drafts, with steps wide enough for every sequence's drafts and with steps of 12 tokens (the later sequences get
// what the earlier ones leave); one request has its own p_min. The model as its own draft is confirmed in full.
TEST(DraftModel, ParallelSequencesKeepTheirGreedyIds) {
  const std::string f = fixture("fixture-llama-f16");
  std::vector<GenRequest> rq;
  for (int i = 0; i < 4; ++i)
    rq.push_back(test::greedy_request(ids_of(static_cast<size_t>(32 - 7 * i), i), 16 + 5 * i));
  rq[2].spec.p_min = 0.2f;
  for (int32_t batch : {512, 12}) {
    EngineConfig c = test::one_sequence(1024, batch);
    c.max_seqs = 4;
    auto plain = test::make_scheduler(f, c);
    ASSERT_TRUE(plain);
    std::vector<std::vector<int32_t>> want;
    for (GenRequest r : rq) {
      r.spec = SpecRequest{};  // the request's p_min is for drafts
      want.push_back(test::generate(*plain, r).ids);
      EXPECT_EQ(want.back().size(), static_cast<size_t>(r.max_new_tokens));
    }
    for (const char* d : {"fixture-llama-q4_k_m", "fixture-llama-f16"}) {
      SCOPED_TRACE(std::string(d) + ", batch " + std::to_string(batch));
      auto m = test::load_cpu_model(f);
      auto dm = test::load_cpu_model(fixture(d));
      ASSERT_TRUE(m && dm);
      auto s = Scheduler::create(std::move(m), with_draft(c, 6), std::move(dm));
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      std::vector<std::shared_ptr<RequestHandle>> hs;
      for (const GenRequest& r : rq) hs.push_back(*(*s)->submit(r));
      for (size_t i = 0; i < hs.size(); ++i) {
        std::vector<int32_t> got;
        for (const TokenEvent& e : hs[i]->wait_all())
          if (e.id >= 0) got.push_back(e.id);
        EXPECT_EQ(got, want[i]) << "request " << i;
        EXPECT_TRUE(hs[i]->error().is_ok()) << hs[i]->error().to_string();
      }
      const SchedulerStats st = (*s)->stats();
      EXPECT_GT(st.draft_tokens, 0u);
      if (std::string(d) == "fixture-llama-f16") {
        EXPECT_EQ(st.draft_accepted, st.draft_tokens);
      }
    }
  }
}

// -ctkd / -ctvd (EngineConfig::kv_type_k_draft / _v_draft): the draft's cache takes them, else the model's types;
// without a draft model they are refused naming the flag.
TEST(DraftModel, DraftCacheTypes) {
  const std::string f = fixture("fixture-llama-f16"), d = fixture("fixture-llama-q4_k_m");
  const std::vector<int32_t> prompt = test::read_ids(test::data_path("models/prompt.txt"));
  const SpecRun plain = run(f, test::one_sequence(512), test::greedy_request(prompt, 24));
  struct Case {
    DType k, v;
    std::optional<DType> dk, dv;
    DType want_k, want_v;
  } cases[] = {
      {DType::F16, DType::F16, DType::Q8_0, std::nullopt, DType::Q8_0, DType::F16},
      {DType::F16, DType::F16, DType::Q4_0, DType::Q8_0, DType::Q4_0, DType::Q8_0},
      {DType::Q8_0, DType::F16, std::nullopt, std::nullopt, DType::Q8_0, DType::F16},
      {DType::Q8_0, DType::Q8_0, DType::F16, DType::F16, DType::F16, DType::F16},
  };
  for (const Case& t : cases) {
    EngineConfig c = with_draft(test::one_sequence(512));
    c.kv_type_k = t.k, c.kv_type_v = t.v, c.kv_type_k_draft = t.dk, c.kv_type_v_draft = t.dv;
    auto m = test::load_cpu_model(f);
    auto dm = test::load_cpu_model(d);
    ASSERT_TRUE(m && dm);
    auto s = Scheduler::create(std::move(m), c, std::move(dm));
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    const KvCacheConfig* kc = (*s)->draft_cache_config();
    ASSERT_NE(kc, nullptr);
    EXPECT_EQ(kc->type_k, t.want_k);
    EXPECT_EQ(kc->type_v, t.want_v);
    const test::Generated g = test::generate(**s, test::greedy_request(prompt, 24));
    EXPECT_TRUE(g.error.is_ok()) << g.error.to_string();
    if (t.k == DType::F16 && t.v == DType::F16) {
      EXPECT_EQ(g.ids, plain.g.ids) << "the draft's cache type changes its drafts, not the model's ids";
    }
    EXPECT_GT((*s)->stats().draft_tokens, 0u);
  }
  EXPECT_EQ(test::make_scheduler(f, test::one_sequence(256))->draft_cache_config(), nullptr);
  for (bool k : {true, false}) {
    EngineConfig c = test::one_sequence(256);
    (k ? c.kv_type_k_draft : c.kv_type_v_draft) = DType::Q8_0;
    auto s = Scheduler::create(test::load_cpu_model(f), c);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.status().message(), std::string(k ? "-ctkd" : "-ctvd") +
                                        ": the draft model's KV cache type needs a draft model (-md FILE)");
  }
}

TEST(Speculative, BadOptionsNameTheFlag) {
  const auto err = [](SpecConfig sp) { return check_spec(sp).to_string(); };
  SpecConfig a;
  a.draft_max = 300;
  EXPECT_NE(err(a).find("--spec-draft-n-max"), std::string::npos);
  SpecConfig b;
  b.draft_min = 20;
  EXPECT_NE(err(b).find("--spec-draft-n-min"), std::string::npos);
  SpecConfig c;
  c.ngram_n = 0;
  EXPECT_NE(err(c).find("--spec-ngram-simple-size-n"), std::string::npos);
}

}  // namespace
}  // namespace kiln
