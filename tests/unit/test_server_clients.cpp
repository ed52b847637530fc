// kiln serve through real clients run by node: the official SDKs (npm `openai` and `@anthropic-ai/sdk`) against
// /v1/responses and /v1/messages (tests/server/sdk_check.mjs), and the chat page at / (served from the binary
// without the API key, with a policy that allows only this server; --no-webui turns it off) in headless Chromium
// through npm `puppeteer-core` (tests/server/webui_check.mjs: load, key, send, the streamed reply, stop mid-stream,
// reload and the history, the markdown renderer). The npm packages are installed at test time into <build>/npm-sdk
// and <build>/npm-web (ignored by git); without node, npm, the network or Chromium a test skips and says why.
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

TEST(ServeWebui, ServedWithoutTheKeyAndTurnedOff) {
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "1", "--api-key", "k"})) << p.log();
  test::HttpResponse r = test::http(p.port, "GET", "/");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("text/html"), std::string::npos) << r.headers;
  EXPECT_NE(r.headers.find("Content-Security-Policy: default-src 'self'"), std::string::npos) << r.headers;
  EXPECT_NE(r.body.find("<!doctype html>"), std::string::npos);
  EXPECT_EQ(r.body.find("http://"), std::string::npos);  // nothing from elsewhere
  EXPECT_EQ(r.body.find("https://"), std::string::npos);
  EXPECT_EQ(test::http(p.port, "GET", "/props").status, 401);  // the API still wants the key
  EXPECT_EQ(test::http(p.port, "GET", "/props", "", "k").j()["webui"], true);
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  test::ServeProcess q;
  ASSERT_TRUE(q.start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "1", "--no-webui"})) << q.log();
  r = test::http(q.port, "GET", "/");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("--no-webui"), std::string::npos) << r.body;
  EXPECT_EQ(test::http(q.port, "GET", "/props").j()["webui"], false);
  EXPECT_EQ(q.stop(SIGTERM), 0) << q.log();
}

TEST(ServeWebui, ChatInHeadlessChromium) {
  const char* env = std::getenv("CHROMIUM");
  const std::string chromium = env ? env : "/usr/bin/chromium";
  if (!std::filesystem::exists(chromium)) GTEST_SKIP() << "skipped: no Chromium at " << chromium << " (set CHROMIUM)";
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "skipped: node or npm not found";
  // KILN_BINARY is <build>/bin/kiln.
  const std::string npm_dir =
      (std::filesystem::path(test::kiln_binary()).parent_path().parent_path() / "npm-web").string();
  const std::string install = "mkdir -p '" + npm_dir + "' && cd '" + npm_dir +
                              "' && flock .install-lock sh -c '[ -f node_modules/puppeteer-core/package.json ] || "
                              "timeout 180 npm install --no-audit --no-fund --loglevel=error puppeteer-core@24 "
                              ">npm-install.log 2>&1'";
  if (std::system(install.c_str()) != 0)
    GTEST_SKIP() << "skipped: npm could not install puppeteer-core (no network?): "
                 << test::slurp(npm_dir + "/npm-install.log").substr(0, 600);
  // The embedded demo model: real words to stream.
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-t", "2", "--api-key", "k-web"})) << p.log();
  const std::string out = ::kiln::test::temp_dir() + "webui_check_" + std::to_string(::getpid()) + ".log";
  const std::string run = "CHROMIUM='" + chromium + "' KILN_NPM_DIR='" + npm_dir + "' timeout 120 node '" +
                          std::string(KILN_SOURCE_DIR) + "/tests/server/webui_check.mjs' http://127.0.0.1:" +
                          std::to_string(p.port) + " k-web kiln-demo >'" + out + "' 2>&1";
  const int st = std::system(run.c_str());
  const std::string log = test::slurp(out);
  std::printf("%s", log.c_str());
  std::filesystem::remove(out);
  EXPECT_EQ(st, 0) << log << "\nserver log:\n" << p.log();
  EXPECT_NE(log.find("all webui checks passed"), std::string::npos) << log;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
