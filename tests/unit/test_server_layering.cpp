// The include direction of src/server (issue 15): its files include only runtime/, tokenizer/, template/, util/
// and server/ headers (plus system and library headers; docs/ARCHITECTURE.md, scripts/check_layers.sh), and
// nothing they reach through those names a model/, backend/ or cli/ header: the server never touches tensors or
// the CLI. (template/ comes in through runtime/prompt.h: chat templates and reply parsing.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::vector<std::string> project_includes(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::vector<std::string> out;
  const std::regex re("^\\s*#\\s*include\\s+\"([^\"]+)\"");
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, re)) out.push_back(m[1]);
  return out;
}

TEST(ServerLayering, IncludesOnlyRuntimeTokenizerUtil) {
  const fs::path src = fs::path(KILN_SOURCE_DIR) / "src";
  const std::set<std::string> direct_ok = {"runtime", "tokenizer", "template", "grammar", "util", "server"};
  const std::set<std::string> never = {"model", "backend", "cli"};
  std::vector<fs::path> todo;
  for (const auto& e : fs::directory_iterator(src / "server")) todo.push_back(e.path());
  ASSERT_FALSE(todo.empty());
  for (const fs::path& f : todo)
    for (const std::string& inc : project_includes(f)) {
      const std::string top = inc.substr(0, inc.find('/'));
      EXPECT_TRUE(direct_ok.count(top)) << f.filename() << " includes \"" << inc << "\"";
    }
  // Transitively.
  std::set<std::string> seen;
  std::vector<std::pair<std::string, std::string>> stack;  // header, who included it
  for (const fs::path& f : todo)
    for (const std::string& inc : project_includes(f)) stack.push_back({inc, f.filename().string()});
  while (!stack.empty()) {
    auto [h, from] = stack.back();
    stack.pop_back();
    if (!seen.insert(h).second) continue;
    const std::string top = h.substr(0, h.find('/'));
    EXPECT_FALSE(never.count(top)) << "src/server reaches \"" << h << "\" (through " << from << ")";
    const fs::path p = src / h;
    if (!fs::exists(p)) continue;
    for (const std::string& inc : project_includes(p)) stack.push_back({inc, h});
  }
}

}  // namespace
