// Speculative decoding in the engine loop (runtime/engine_config.h SpecConfig, runtime/hooks.h DraftProposer,
// runtime/ngram_draft.h): with prompt lookup the greedy tokens are the same as without, on the demo model (a trained
// model, where a prompt that repeats itself is continued by copying) and on every fixture model in tests/data; the
// drafts are really verified (stats) and the limits inside a verified chunk hold (max_new_tokens, stop strings);
// sampled requests run with drafts; bad options are refused naming the flag (the kiln run flags: test_cli_run).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/engine_test_util.h"
#include "common/engine_util.h"
#include "common/test_util.h"
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

struct SpecRun {
  test::Generated g;
  SchedulerStats stats;
};

SpecRun run(const std::string& model, const EngineConfig& cfg, GenRequest r) {
  SpecRun out;
  auto s = test::make_scheduler(model, cfg);
  if (!s) return out;
  out.g = test::generate(*s, std::move(r));
  out.stats = s->stats();
  return out;
}

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
