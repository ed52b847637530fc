// kiln embed as a user runs it: one JSON line per input (-p repeatable, -f one input per line), the vectors against
// the generation path's hidden states of an identity-head model (common/embed_models.h), --pooling and
// --embd-normalize, and flag errors named before anything runs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "common/embed_models.h"
#include "common/engine_util.h"
#include "runtime/embedding.h"

namespace kiln {
namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<float> parse_vec(const std::string& line) { return nlohmann::json::parse(line).get<std::vector<float>>(); }

TEST(CliEmbed, OneJsonLinePerInputAgainstTheReference) {
  const std::string model = test::make_embed_model("cli-embed.gguf", {});
  auto m = test::load_cpu_model(model);
  ASSERT_TRUE(m);
  const std::vector<std::string> texts = {"The quick brown fox", "jumps", "over the lazy dog"};
  const std::string file = test::temp_dir() + "inputs.txt";
  std::ofstream(file) << texts[1] << "\n\n" << texts[2] << "\n";
  test::CmdResult r = test::run_kiln("embed -m '" + model + "' -t 1 --pooling mean -p '" + texts[0] + "' -f '" + file + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<std::string> out = lines(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto h = test::reference_hidden(*m, embedding_tokens(m->tokenizer(), texts[i]));
    std::vector<float> mean(h[0].size());
    for (size_t k = 0; k < mean.size(); ++k) {
      double s = 0;
      for (const auto& row : h) s += row[k];
      mean[k] = static_cast<float>(s / static_cast<double>(h.size()));
    }
    const std::vector<float> v = parse_vec(out[i]), want = test::l2_normalized(mean);
    ASSERT_EQ(v.size(), want.size());
    for (size_t k = 0; k < v.size(); ++k) ASSERT_NEAR(v[k], want[k], 1e-6) << "input " << i << " element " << k;
  }
  EXPECT_NE(r.err.find("3 inputs"), std::string::npos) << r.err;
  // --embd-normalize -1: the pooled vector as it is; pooling none: one vector per token.
  r = test::run_kiln("embed -m '" + model + "' -t 1 --pooling last --embd-normalize -1 -p '" + texts[0] + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto h = test::reference_hidden(*m, embedding_tokens(m->tokenizer(), texts[0]));
  const std::vector<float> last = parse_vec(lines(r.out)[0]);
  for (size_t k = 0; k < last.size(); ++k) ASSERT_NEAR(last[k], h.back()[k], 1e-6) << k;
  r = test::run_kiln("embed -m '" + model + "' -t 1 -p '" + texts[0] + "'");  // the file has no pooling type: none
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = nlohmann::json::parse(lines(r.out)[0]);
  ASSERT_EQ(rows.size(), h.size());
  for (size_t t = 0; t < h.size(); ++t) {
    const std::vector<float> v = rows[t].get<std::vector<float>>(), want = test::l2_normalized(h[t]);
    for (size_t k = 0; k < v.size(); ++k) ASSERT_NEAR(v[k], want[k], 1e-6) << t << " " << k;
  }
}

TEST(CliEmbed, FlagErrorsNameTheFlag) {
  const std::string model = test::data_path("models/fixture-llama-f16.gguf");
  struct Case {
    std::string args, want;
  } cases[] = {
      {"embed -m '" + model + "'", "no input"},
      {"embed -m '" + model + "' -p x --pooling max", "--pooling"},
      {"embed -m '" + model + "' -p x --embd-normalize 99", "--embd-normalize"},
      {"embed -m '" + model + "' -p x -np 0", "--parallel"},
      {"embed -m '" + model + "' -p ''", "empty"},
      {"embed -m '" + model + "' -p x --pooling rank", "classification head"},
      {"embed -m '" + model + "' -p x -f /nonexistent/file", "-f"},
  };
  for (const Case& c : cases) {
    test::CmdResult r = test::run_kiln(c.args);
    EXPECT_EQ(r.rc, 1) << c.args;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << c.args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
}

}  // namespace
}  // namespace kiln
