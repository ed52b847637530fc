// The JSON-schema corpus (tests/data/json-schemas: real-world API shapes): every schema compiles, and text sampled
// under the mask with random logits is, every time, a complete JSON document (nlohmann parses it) that validates
// against its schema (ajv with ajv-formats through node: tests/grammar/ajv_validate.mjs). ajv is installed at
// test time into <build>/npm-ajv (ignored by git); without node, npm or the network that test skips and says why.
//
// The vocabulary is GPT-2's first 8,000 tokens (all 256 bytes and the common merges, so tokens cross JSON
// structure as real ones do: `":`, `",`, ` "`) plus an end-of-generation token: a full 50k vocabulary would
// multiply the mask-cache compile time of 124 grammars for no extra coverage (test_grammar_matcher uses it).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"

namespace kiln::grammar {
namespace {

namespace fs = std::filesystem;
constexpr int kSamples = 3;
constexpr int kBudget = 120;  // tokens drawn at random before the sampler finishes the document

struct CaseResult {
  std::string name;
  nlohmann::ordered_json schema;
  std::string error;  // compile error
  std::vector<test::Sample> samples;
};

std::shared_ptr<const VocabIndex> corpus_vocab() {
  static const std::shared_ptr<const VocabIndex> v = [] {
    auto full = test::gpt2_vocab();
    Vocabulary voc;
    for (int32_t id = 0; id < 8000; ++id) voc.tokens.push_back(full->token(id));
    voc.tokens.push_back("");
    voc.eog_ids = {8000};
    return VocabIndex::build(std::move(voc));
  }();
  return v;
}

const std::vector<CaseResult>& corpus() {
  static const std::vector<CaseResult> results = [] {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(kiln::test::data_path("json-schemas")))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::vector<CaseResult> out;
    for (const fs::path& f : files) {
      CaseResult c;
      c.name = f.stem().string();
      c.schema = nlohmann::ordered_json::parse(kiln::test::slurp(f.string()), nullptr, false);
      auto gbnf = json_schema_to_gbnf(c.schema);
      std::shared_ptr<const CompiledGrammar> cg;
      if (gbnf) {
        auto g = Grammar::from_gbnf(*gbnf);
        if (g) {
          auto compiled = CompiledGrammar::compile(*g, corpus_vocab(), 2);
          if (compiled) cg = *compiled;
          else c.error = compiled.status().message();
        } else {
          c.error = g.status().message() + "\n" + *gbnf;
        }
      } else {
        c.error = gbnf.status().message();
      }
      if (cg) {
        for (int i = 0; i < kSamples; ++i) {
          std::mt19937_64 rng(std::hash<std::string>()(c.name) + static_cast<uint64_t>(i));
          c.samples.push_back(test::sample(cg, rng, kBudget));
        }
      }
      out.push_back(std::move(c));
    }
    return out;
  }();
  return results;
}

TEST(GrammarSchemaCorpus, HasAtLeastOneHundredSchemas) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(kiln::test::data_path("json-schemas"))) n += e.path().extension() == ".json";
  EXPECT_GE(n, 100u);
}

TEST(GrammarSchemaCorpus, EverySampleIsCompleteJson) {
  size_t n = 0;
  for (const CaseResult& c : corpus()) {
    EXPECT_TRUE(c.error.empty()) << c.name << ": " << c.error;
    for (const test::Sample& s : c.samples) {
      ++n;
      EXPECT_TRUE(s.error.empty()) << c.name << ": " << s.error << " after " << s.text;
      EXPECT_TRUE(s.complete) << c.name;
      EXPECT_FALSE(nlohmann::json::parse(s.text, nullptr, false).is_discarded()) << c.name << ": " << s.text;
    }
  }
  EXPECT_EQ(n, corpus().size() * kSamples);
}

TEST(GrammarSchemaCorpus, EverySampleValidatesWithAjv) {
  std::string why;
  const std::string npm_dir = kiln::test::npm_packages("npm-ajv", {"ajv@8", "ajv-formats@3"}, &why);
  if (npm_dir.empty()) GTEST_SKIP() << "skipped: " << why;
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const CaseResult& c : corpus()) {
    nlohmann::ordered_json outs = nlohmann::ordered_json::array();
    for (const test::Sample& s : c.samples) outs.push_back(s.text);
    cases.push_back({{"name", c.name}, {"schema", c.schema}, {"outputs", outs}});
  }
  const std::string dir = ::testing::TempDir() + "kiln_ajv_" + std::to_string(::getpid());
  fs::create_directories(dir);
  std::ofstream(dir + "/cases.json") << cases.dump();
  const std::string script = std::string(KILN_SOURCE_DIR) + "/tests/grammar/ajv_validate.mjs";
  const std::string cmd = "KILN_NPM_DIR='" + npm_dir + "' timeout 120 node '" + script + "' '" + dir +
                          "/cases.json' >'" + dir + "/out.log' 2>&1";
  const int st = std::system(cmd.c_str());
  const std::string log = kiln::test::slurp(dir + "/out.log");
  fs::remove_all(dir);
  std::printf("%s", log.c_str());
  EXPECT_EQ(st, 0) << log;
  EXPECT_NE(log.find("ajv: " + std::to_string(corpus().size() * kSamples) + " of "), std::string::npos) << log;
}

}  // namespace
}  // namespace kiln::grammar
