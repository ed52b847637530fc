// The sampling flags of llama.cpp beyond temperature/top-k/top-p/min-p (--typical, --dry-*, --xtc-*, --mirostat*,
// -l/--logit-bias) through the kiln binary: out-of-range values are errors naming the flag, before the model loads
// (a --logit-bias token outside the vocabulary right after); the flags act on the output (a bias of +100 forces its
// token, -inf bans it; a seeded run with every stage on repeats itself and differs from one without them).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace kiln {
namespace {

using test::CmdResult;

std::string model() { return test::data_path("models/fixture-llama-q8_0.gguf"); }

// `kiln run --ids` on the fixture: the generated ids.
std::vector<int> run_ids(const std::string& flags, std::string* err = nullptr) {
  CmdResult r = test::run_kiln("run --device cpu -t 1 -m '" + model() + "' -p 'The quick brown fox' -n 8 --ignore-eos --ids " +
                               flags);
  if (err) *err = r.err;
  EXPECT_EQ(r.rc, 0) << r.err;
  std::vector<int> ids;
  std::string num;
  for (char c : r.out) {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if (!num.empty()) {
      ids.push_back(std::stoi(num));
      num.clear();
    }
  }
  return ids;
}

TEST(CliSampling, FlagsAreCheckedBeforeTheModelLoadsAndNamed) {
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--typical 1.5", "--typical: must be in [0, 1]"},
      {"--typical nan", "--typical: must be in [0, 1]"},
      {"--dry-multiplier -1", "--dry-multiplier: must be a finite number >= 0"},
      {"--dry-base 0.5", "--dry-base: must be a finite number >= 1"},
      {"--dry-allowed-length -1", "--dry-allowed-length: must be >= 0"},
      {"--dry-penalty-last-n -2", "--dry-penalty-last-n: must be >= -1"},
      {"--dry-sequence-breaker ''", "--dry-sequence-breaker: empty"},
      {"--xtc-probability 2", "--xtc-probability: must be in [0, 1]"},
      {"--xtc-threshold -0.5", "--xtc-threshold: must be in [0, 1]"},
      {"--logit-bias 15", "--logit-bias: '15' is not TOKEN_ID(+/-)BIAS"},
      {"-l 15*2", "-l: '15*2' is not TOKEN_ID(+/-)BIAS"},
      {"-l x+1", "-l: 'x+1' is not TOKEN_ID(+/-)BIAS"},
      {"-l 15+inf", "-l: '15+inf' is not TOKEN_ID(+/-)BIAS"},
      {"-l 15+nan", "-l: '15+nan' is not TOKEN_ID(+/-)BIAS"},
      {"-l 15+-2", "-l: '15+-2' is not TOKEN_ID(+/-)BIAS"},
      {"--mirostat 3", "--mirostat: must be 0 (off), 1 or 2"},
      {"--mirostat-lr -0.1", "--mirostat-lr: must be a finite number >= 0"},
      {"--mirostat-ent nan", "--mirostat-ent: must be a finite number >= 0"},
  };
  const char* internal[] = {"typical_p", "dry_multiplier", "dry_base", "xtc_probability", "logit_bias", "mirostat_"};
  const std::string missing = "-m /nonexistent/model.gguf ";
  for (const char* cmd : {"run -p hi", "chat", "serve --port 0"}) {
    for (auto& c : cases) {
      SCOPED_TRACE(std::string(cmd) + " " + c.args);
      CmdResult r = test::run_kiln(std::string(cmd) + " " + missing + c.args, "hi\n");
      EXPECT_EQ(r.rc, 1);
      EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("/nonexistent/model.gguf"), std::string::npos) << "checked after loading: " << r.err;
      for (const char* f : internal) EXPECT_EQ(r.err.find(f), std::string::npos) << r.err;
    }
  }
  // The help lists them.
  CmdResult h = test::run_kiln("run -h");
  for (const char* f : {"--typical", "--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n",
                        "--dry-sequence-breaker", "--xtc-probability", "--xtc-threshold", "--logit-bias", "--mirostat",
                        "--mirostat-lr", "--mirostat-ent"})
    EXPECT_NE(h.out.find(f), std::string::npos) << f;
}

TEST(CliSampling, LogitBiasTokenOutsideTheVocabularyIsNamed) {
  for (const char* cmd : {"run -p hi", "chat"}) {
    CmdResult r = test::run_kiln(std::string(cmd) + " --device cpu -m '" + model() + "' -l 99999+1", "hi\n");
    EXPECT_EQ(r.rc, 1) << cmd;
    EXPECT_NE(r.err.find("--logit-bias: token id 99999 is outside the model's vocabulary"), std::string::npos) << r.err;
  }
}

TEST(CliSampling, LogitBiasForcesAndBansTokens) {
  const std::vector<int> greedy = run_ids("--temp 0");
  ASSERT_EQ(greedy.size(), 8u);
  // +100 on a token the greedy run does not start with: every token is it.
  const int forced = greedy[0] == 7 ? 8 : 7;
  const std::vector<int> all(8, forced);
  EXPECT_EQ(run_ids("--temp 0 -l " + std::to_string(forced) + "+100"), all);
  EXPECT_EQ(run_ids("--temp 0 --logit-bias " + std::to_string(forced) + "+100"), all);
  // -inf (and -100) on the greedy run's tokens: none of them comes out.
  std::string ban;
  for (int t : std::set<int>(greedy.begin(), greedy.end())) ban += " -l " + std::to_string(t) + "-inf";
  for (int t : run_ids("--temp 0" + ban))
    EXPECT_EQ(std::count(greedy.begin(), greedy.end(), t), 0) << t;
  const std::vector<int> moved = run_ids("--temp 0 -l " + std::to_string(greedy[0]) + "-100");
  ASSERT_EQ(moved.size(), 8u);
  EXPECT_NE(moved[0], greedy[0]);
}

TEST(CliSampling, SeededStagesRepeatAndAct) {
  const std::string base = "--temp 0.9 -s 42";
  const std::string stages = base + " --typical 0.9 --xtc-probability 0.5 --xtc-threshold 0.05 --dry-multiplier 0.8 "
                             "--dry-allowed-length 1 --dry-sequence-breaker none --dry-sequence-breaker '.'";
  const std::vector<int> a = run_ids(stages), b = run_ids(stages);
  ASSERT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, run_ids(base));
  // XTC at probability 1 and threshold 0 removes every token but the least likely: greedy differs from plain greedy.
  const std::string wide = "--temp 0 --top-k 0 --top-p 1 --min-p 0";
  EXPECT_NE(run_ids(wide + " --xtc-probability 1 --xtc-threshold 0"), run_ids(wide));
  // Mirostat: seeded runs repeat; a surprise budget of 0 (mirostat 2, tau 0) keeps only the top token: greedy.
  for (const char* m : {"--mirostat 1", "--mirostat 2 --mirostat-ent 3 --mirostat-lr 0.2"}) {
    const std::vector<int> r = run_ids(base + " " + m);
    ASSERT_EQ(r.size(), 8u) << m;
    EXPECT_EQ(r, run_ids(base + " " + m)) << m;
  }
  EXPECT_EQ(run_ids(base + " --mirostat 2 --mirostat-ent 0"), run_ids("--temp 0"));
}

}  // namespace
}  // namespace kiln
