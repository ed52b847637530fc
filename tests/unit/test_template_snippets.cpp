// The interpreter feature by feature against jinja2: tests/data/templates/snippets.json holds small templates
// (whitespace control, literals and repr, operators, Undefined, attribute access, every filter and test, string
// methods and formatting, loops, scoping, macros and call blocks, globals, syntax errors), each rendered by the
// oracle (tests/template_oracle.py, transformers' environment) and by kiln. Same bytes where jinja2 renders, an
// error where jinja2 raises.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "template/template.h"

namespace {

using nlohmann::ordered_json;

std::string python() {
  if (const char* p = std::getenv("KILN_PYTHON")) return p;
  if (std::system("/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1") == 0) return "/usr/bin/python3";
  if (std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0) return "python3";
  return "";
}

TEST(TemplateSnippets, MatchJinja2) {
  const std::string py = python();
  if (py.empty()) GTEST_SKIP() << "skipped: python3 with jinja2 not found (scripts/deps.sh installs python3-jinja2)";
  const ordered_json snippets = ordered_json::parse(kiln::test::slurp(kiln::test::data_path("templates/snippets.json")));
  ASSERT_GT(snippets.size(), 100u);
  const long long now = 1764582000;
  ordered_json job;
  job["now"] = now;
  job["snippets"] = snippets;
  const std::string base = ::kiln::test::temp_dir() + "kiln_snip_" + std::to_string(::getpid());
  std::ofstream(base + ".job.json") << job.dump();
  const std::string cmd = "'" + py + "' '" KILN_SOURCE_DIR "/tests/template_oracle.py' '" + base + ".job.json' '" +
                          base + ".out.json'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const ordered_json want = ordered_json::parse(kiln::test::slurp(base + ".out.json"));
  std::remove((base + ".job.json").c_str());
  std::remove((base + ".out.json").c_str());
  ASSERT_EQ(want.size(), snippets.size());
  int matched = 0;
  for (size_t i = 0; i < snippets.size(); ++i) {
    const std::string src = snippets[i]["source"].get<std::string>();
    auto t = kiln::tpl::Template::parse(src, "snippet");
    kiln::Result<std::string> got = t ? t->render(snippets[i]["vars"], now) : kiln::Result<std::string>(t.status());
    const std::string label = "snippet " + std::to_string(i) + ": " + nlohmann::json(src).dump();
    if (want[i]["ok"].get<bool>()) {
      const std::string w = want[i]["text"].get<std::string>();
      if (!got) {
        ADD_FAILURE() << label << "\n  jinja2: " << nlohmann::json(w).dump() << "\n  kiln error: " << got.status().message();
      } else if (*got != w) {
        ADD_FAILURE() << label << "\n  jinja2: " << nlohmann::json(w).dump() << "\n  kiln:   " << nlohmann::json(*got).dump();
      } else {
        ++matched;
      }
    } else if (got) {
      ADD_FAILURE() << label << "\n  jinja2 raises: " << want[i]["error"].get<std::string>()
                    << "\n  kiln renders: " << nlohmann::json(*got).dump();
    } else {
      // Every kiln error names the template position.
      EXPECT_NE(got.status().message().find("snippet: line "), std::string::npos) << label << ": " << got.status().message();
      ++matched;
    }
  }
  std::printf("jinja2 snippets: %d of %zu match\n", matched, snippets.size());
  EXPECT_EQ(matched, static_cast<int>(snippets.size()));
}

}  // namespace
