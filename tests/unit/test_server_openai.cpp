// The official OpenAI client library (npm `openai`, through node) against kiln serve: tests/server/openai_check.mjs
// (models, chat, completions, embeddings, errors) and tests/server/openai_structured.mjs (structured outputs: zodResponseFormat
// with .parse(), a plain json_schema, streaming, a GBNF request, guided_choice; every output validated by zod and
// ajv). The packages are installed at test time into <build>/npm (ignored by git); without node, npm or the
// network the tests skip and say why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "unit/test_server_util.h"

namespace kiln {
namespace {

const std::vector<std::string> kNpmPackages = {"openai@7", "zod@3", "ajv@8", "ajv-formats@3"};

// Runs tests/server/<script> against a kiln serve of the fixture model: its output in *log; true when the script
// and the server (SIGTERM) both exit 0.
bool run_script(const std::string& script, const std::string& npm_dir, std::string* log) {
  test::ServeProcess p;
  if (!p.start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "--api-key", "k-123", "-a",
                "fixture", "--pooling", "mean"})) {
    *log = "kiln serve did not start:\n" + p.log();
    return false;
  }
  const std::string out = ::kiln::test::temp_dir() + script + ".log";
  const std::string cmd = "KILN_NPM_DIR='" + npm_dir + "' timeout 120 node '" + std::string(KILN_SOURCE_DIR) +
                          "/tests/server/" + script + "' http://127.0.0.1:" + std::to_string(p.port) +
                          "/v1 k-123 fixture >'" + out + "' 2>&1";
  const int st = std::system(cmd.c_str());
  *log = test::slurp(out);
  std::printf("%s", log->c_str());
  const int rc = p.stop(SIGTERM);
  if (st != 0) *log += "\nserver log:\n" + p.log();
  if (rc != 0) *log += "\nkiln serve exited " + std::to_string(rc) + ":\n" + p.log();
  return st == 0 && rc == 0;
}

TEST(ServeOpenAI, OfficialClientWorksUnchanged) {
  std::string why;
  const std::string npm_dir = test::npm_packages("npm", kNpmPackages, &why);
  if (npm_dir.empty()) GTEST_SKIP() << "skipped: " << why;
  std::string log;
  EXPECT_TRUE(run_script("openai_check.mjs", npm_dir, &log)) << log;
  EXPECT_NE(log.find("all openai client checks passed"), std::string::npos) << log;
}

TEST(ServeOpenAI, StructuredOutputsThroughTheClient) {
  std::string why;
  const std::string npm_dir = test::npm_packages("npm", kNpmPackages, &why);
  if (npm_dir.empty()) GTEST_SKIP() << "skipped: " << why;
  std::string log;
  EXPECT_TRUE(run_script("openai_structured.mjs", npm_dir, &log)) << log;
  EXPECT_NE(log.find("all structured output checks passed"), std::string::npos) << log;
}

}  // namespace
}  // namespace kiln
