// The official SDKs (npm `openai` and `@anthropic-ai/sdk`, through node) against kiln serve's /v1/responses and
// /v1/messages: tests/server/sdk_check.mjs. The packages are installed at test time into <build>/npm-sdk (ignored by
// git); without node, npm or the network the test skips and says why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "unit/test_server_util.h"

namespace kiln {
namespace {

TEST(ServeSdks, ResponsesAndMessagesThroughTheOfficialClients) {
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "skipped: node or npm not found";
  // KILN_BINARY is <build>/bin/kiln.
  const std::string npm_dir =
      (std::filesystem::path(test::kiln_binary()).parent_path().parent_path() / "npm-sdk").string();
  const std::string cmd = "mkdir -p '" + npm_dir + "' && cd '" + npm_dir +
                          "' && flock .install-lock sh -c '[ -f node_modules/openai/package.json ] && "
                          "[ -f node_modules/@anthropic-ai/sdk/package.json ] || timeout 180 npm install --no-audit "
                          "--no-fund --loglevel=error openai@7 @anthropic-ai/sdk@1 >npm-install.log 2>&1'";
  if (std::system(cmd.c_str()) != 0)
    GTEST_SKIP() << "skipped: npm could not install openai and @anthropic-ai/sdk (no network?): "
                 << test::slurp(npm_dir + "/npm-install.log").substr(0, 600);
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "--api-key", "k-sdk"}))
      << p.log();
  const std::string out = ::kiln::test::temp_dir() + "sdk_check_" + std::to_string(::getpid()) + ".log";
  const std::string run = "KILN_NPM_DIR='" + npm_dir + "' timeout 120 node '" + std::string(KILN_SOURCE_DIR) +
                          "/tests/server/sdk_check.mjs' http://127.0.0.1:" + std::to_string(p.port) + " k-sdk >'" +
                          out + "' 2>&1";
  const int st = std::system(run.c_str());
  const std::string log = test::slurp(out);
  std::printf("%s", log.c_str());
  std::filesystem::remove(out);
  EXPECT_EQ(st, 0) << log << "\nserver log:\n" << p.log();
  EXPECT_NE(log.find("all sdk checks passed"), std::string::npos) << log;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
