// Shared test helpers: where the test data lives, fixture discovery, NMSE.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::test {

// tests/data: the small committed subset, always present.
inline std::string data_dir() { return KILN_TEST_DATA_DIR; }
inline std::string data_path(const std::string& rel) { return data_dir() + "/" + rel; }
// The committed vocabularies (tests/data/tokenizer.tar.xz, unpacked by the build): ggml-vocab-<name>.gguf with
// its test vectors <file>.inp / <file>.out, for name gpt-2 and llama-spm.
inline std::string vocab_dir() { return KILN_TEST_VOCAB_DIR; }
inline std::string vocab_path(const std::string& name) { return vocab_dir() + "/ggml-vocab-" + name + ".gguf"; }
// The full llama.cpp fixture matrix (../shared/fixtures), or "" when absent.
inline std::string fixtures_dir() {
  std::error_code ec;
  return std::filesystem::is_directory(KILN_FIXTURES_DIR, ec) ? std::string(KILN_FIXTURES_DIR) : std::string();
}
inline std::string kiln_binary() { return KILN_BINARY; }

// This test process's own temporary folder, "<TMPDIR>/kiln-test-XXXXXX/" (with the slash), made on first use and
// removed with everything in it when the process exits (ctest runs each test in its own process: one folder per
// test). Only the process that made it removes it (a forked child that exits leaves it alone).
class TempFolder {
 public:
  TempFolder() : owner_(::getpid()) {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string tmpl = (base / "kiln-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "cannot make a temporary folder under " << base;
      tmpl = base.string();
      owner_ = -1;
    }
    path_ = tmpl + "/";
  }
  ~TempFolder() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  pid_t owner_;
  std::string path_;
};
inline const std::string& temp_dir() {
  static TempFolder folder;
  return folder.path();
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct CmdResult {
  int rc = -1;  // exit status (-1: killed by a signal)
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `kiln <args>` through the shell (args may hold quotes and redirections), stdin from `input` (or
// /dev/null); captures stdout and stderr separately through temp files.
inline CmdResult run_kiln(const std::string& args, const std::string& input = "") {
  static int counter = 0;
  const std::string base = temp_dir() + "kiln_cli_" + std::to_string(counter++);
  std::string cmd = "'" + kiln_binary() + "' " + args + " >" + base + ".out 2>" + base + ".err";
  if (!input.empty()) {
    std::ofstream(base + ".in") << input;
    cmd += " <" + base + ".in";
  } else {
    cmd += " </dev/null";
  }
  CmdResult r;
  const int st = std::system(cmd.c_str());
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  std::remove((base + ".in").c_str());
  return r;
}

// npm packages (e.g. {"ajv@8", "ajv-formats@3"}) installed once into <build>/<name> (ignored by git), where the
// node tests load them from (KILN_NPM_DIR). Returns that folder, or "" with *why set when node or npm is missing or
// the install failed (no network): the test then skips and says why. Tests that run in parallel share a folder, so
// the check and the install run under flock.
inline std::string npm_packages(const std::string& name, const std::vector<std::string>& packages, std::string* why) {
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0) {
    *why = "node or npm not found";
    return "";
  }
  // KILN_BINARY is <build>/bin/kiln.
  const std::string dir =
      (std::filesystem::path(kiln_binary()).parent_path().parent_path() / name).string();
  std::string check = "true", specs;
  for (const std::string& p : packages) {
    const std::string pkg = p.substr(0, p.find('@', 1));
    check += " && [ -f node_modules/" + pkg + "/package.json ]";
    specs += " " + p;
  }
  const std::string cmd = "mkdir -p '" + dir + "' && cd '" + dir + "' && flock .install-lock sh -c '" + check +
                          " || timeout 180 npm install --no-audit --no-fund --loglevel=error" + specs +
                          " >npm-install.log 2>&1'";
  if (std::system(cmd.c_str()) != 0) {
    *why = "npm could not install" + specs + " (no network?): " + slurp(dir + "/npm-install.log").substr(0, 600);
    return "";
  }
  return dir;
}

// sum((a-b)^2) / sum(b^2) over n elements.
inline double nmse(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace kiln::test

// Skips (visibly) a test that needs the full fixture matrix when it is not there.
#define KILN_REQUIRE_FIXTURES()                                                           \
  do {                                                                                    \
    if (::kiln::test::fixtures_dir().empty()) GTEST_SKIP() << "skipped: fixtures not found at " KILN_FIXTURES_DIR; \
  } while (0)
