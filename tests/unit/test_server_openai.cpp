// The official OpenAI client library (npm `openai`, through node) against kiln serve: tests/server/openai_check.mjs.
// The package is installed at test time into <build>/npm (ignored by git); without node, npm or the network the
// test skips and says why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "unit/test_server_util.h"

namespace kiln {
namespace {

std::string build_dir() {
  // KILN_BINARY is <build>/bin/kiln.
  return std::filesystem::path(test::kiln_binary()).parent_path().parent_path().string();
}

TEST(ServeOpenAI, OfficialClientWorksUnchanged) {
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "skipped: node or npm not found";
  const std::string npm_dir = build_dir() + "/npm";
  if (!std::filesystem::exists(npm_dir + "/node_modules/openai/package.json")) {
    const std::string cmd = "mkdir -p '" + npm_dir + "' && cd '" + npm_dir +
                            "' && timeout 180 npm install --no-audit --no-fund --loglevel=error openai@7 "
                            ">npm-install.log 2>&1";
    if (std::system(cmd.c_str()) != 0)
      GTEST_SKIP() << "skipped: npm could not install the openai package (no network?): "
                   << test::slurp(npm_dir + "/npm-install.log").substr(0, 600);
  }
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "--api-key", "k-123",
                       "-a", "fixture"}))
      << p.log();
  const std::string script = std::string(KILN_SOURCE_DIR) + "/tests/server/openai_check.mjs";
  const std::string out = ::kiln::test::temp_dir() + "openai_check_" + std::to_string(::getpid()) + ".log";
  const std::string cmd = "KILN_NPM_DIR='" + npm_dir + "' timeout 120 node '" + script + "' http://127.0.0.1:" +
                          std::to_string(p.port) + "/v1 k-123 fixture >'" + out + "' 2>&1";
  const int st = std::system(cmd.c_str());
  const std::string log = test::slurp(out);
  std::printf("%s", log.c_str());
  EXPECT_EQ(st, 0) << log << "\nserver log:\n" << p.log();
  EXPECT_NE(log.find("all openai client checks passed"), std::string::npos);
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
