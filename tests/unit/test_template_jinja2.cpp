// kiln's template interpreter against Python's jinja2, byte for byte, on real chat templates.
// For every template (the committed subset in tests/data/templates, and the full ../shared/fixtures/templates set
// when present) and every conversation in tests/data/templates/conversations*.json, the oracle
// tests/template_oracle.py renders with jinja2 configured exactly as transformers configures it, and kiln renders
// with render_chat. Where jinja2 renders, kiln must produce the same bytes; where jinja2 raises, kiln must return
// an error. strftime_now is pinned to the same instant on both sides.
// Templates kiln cannot match are listed in kUnsupported with the reason (none today); such a template is still
// compared and reported, and the test fails if it starts matching (so the list stays true).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "template/template.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

constexpr long long kNow = 1764582000;  // 2025-12-01, fixed for strftime_now on both sides

// template file name -> why kiln cannot match jinja2 on it
const std::map<std::string, std::string> kUnsupported = {};

std::string python() {
  if (const char* p = std::getenv("KILN_PYTHON")) return p;
  // Debian's interpreter first: python3-jinja2 is installed for it (scripts/deps.sh).
  if (std::system("/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1") == 0) return "/usr/bin/python3";
  if (std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0) return "python3";
  return "";
}

std::vector<std::string> templates_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".jinja") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string show(const std::string& s, size_t at) {
  const size_t b = at > 60 ? at - 60 : 0;
  return nlohmann::json(s.substr(b, 160)).dump();
}

struct Outcome {
  int pairs = 0, matched = 0;
  std::vector<std::string> failures;
  std::map<std::string, int> mismatches_per_template;
};

// Runs the oracle and kiln over templates x conversations.
Outcome compare(const std::vector<std::string>& templates) {
  Outcome o;
  const std::string py = python();
  if (py.empty()) {
    o.failures.push_back("python3 with jinja2 not found (install python3-jinja2: scripts/deps.sh)");
    return o;
  }
  // The hand-written set (system/user, multi-turn, tool calls and results, parts, thinking on/off, ...) plus 60
  // seeded random conversations (gen_random_conversations.py: odd role orders, null/list/dict content, tool calls
  // with dict or string arguments, kwargs), which exercise the templates' error paths.
  ordered_json convs = ordered_json::parse(kiln::test::slurp(kiln::test::data_path("templates/conversations.json")));
  for (auto& c : ordered_json::parse(kiln::test::slurp(kiln::test::data_path("templates/conversations_random.json"))))
    convs.push_back(std::move(c));
  ordered_json job;
  job["now"] = kNow;
  job["templates"] = templates;
  job["conversations"] = convs;
  const std::string base = ::kiln::test::temp_dir() + "kiln_tpl_" + std::to_string(::getpid());
  std::ofstream(base + ".job.json") << job.dump();
  const std::string cmd = "'" + py + "' '" KILN_SOURCE_DIR "/tests/template_oracle.py' '" + base + ".job.json' '" +
                          base + ".out.json'";
  if (std::system(cmd.c_str()) != 0) {
    o.failures.push_back("oracle failed: " + cmd);
    return o;
  }
  const ordered_json results = ordered_json::parse(kiln::test::slurp(base + ".out.json"));
  std::remove((base + ".job.json").c_str());
  std::remove((base + ".out.json").c_str());

  for (size_t t = 0; t < templates.size(); ++t) {
    const std::string source = kiln::test::slurp(templates[t]);
    const std::string tname = fs::path(templates[t]).filename().string();
    for (size_t c = 0; c < convs.size(); ++c) {
      const ordered_json& conv = convs[c];
      const ordered_json& want = results[t][c];
      kiln::tpl::RenderOptions opts;
      opts.tools = conv["tools"];
      opts.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
      opts.kwargs = conv["kwargs"];
      opts.bos_token = conv["bos_token"].get<std::string>();
      opts.eos_token = conv["eos_token"].get<std::string>();
      opts.template_name = tname;
      opts.now = kNow;
      auto got = kiln::tpl::render_chat(source, conv["messages"], opts);
      ++o.pairs;
      const std::string where = tname + " x " + conv["name"].get<std::string>();
      bool ok;
      if (want["ok"].get<bool>()) {
        const std::string w = want["text"].get<std::string>();
        if (!got) {
          ok = false;
          o.failures.push_back(where + ": jinja2 renders, kiln fails: " + got.status().message());
        } else if (*got != w) {
          ok = false;
          size_t d = 0;
          while (d < w.size() && d < got->size() && w[d] == (*got)[d]) ++d;
          o.failures.push_back(where + ": differs at byte " + std::to_string(d) + "\n  jinja2: " + show(w, d) +
                               "\n  kiln:   " + show(*got, d));
        } else {
          ok = true;
        }
      } else {
        ok = !got.is_ok();
        if (!ok) o.failures.push_back(where + ": jinja2 raises (" + want["error"].get<std::string>() + "), kiln renders");
      }
      if (ok) ++o.matched;
      else ++o.mismatches_per_template[tname];
    }
  }
  return o;
}

void check(const Outcome& o, const char* set) {
  std::printf("jinja2 comparison (%s): %d of %d (template, conversation) pairs match\n", set, o.matched, o.pairs);
  for (const auto& [name, why] : kUnsupported) {
    std::printf("  not supported: %s: %s\n", name.c_str(), why.c_str());
    auto it = o.mismatches_per_template.find(name);
    if (it == o.mismatches_per_template.end() && o.pairs > 0)
      ADD_FAILURE() << name << " is listed as unsupported but now matches: remove it from kUnsupported";
  }
  ASSERT_GT(o.pairs, 0) << (o.failures.empty() ? "no templates" : o.failures[0]);
  int unexpected = 0;
  for (const auto& f : o.failures) {
    const std::string name = f.substr(0, f.find(' '));
    if (kUnsupported.count(name)) continue;
    ++unexpected;
    ADD_FAILURE() << f;
  }
  EXPECT_EQ(unexpected, 0);
}

TEST(TemplateJinja2, CommittedSubsetMatchesByteForByte) {
  const auto t = templates_in(kiln::test::data_path("templates"));
  ASSERT_GE(t.size(), 4u) << "tests/data/templates should hold a handful of templates";
  if (python().empty()) GTEST_SKIP() << "skipped: python3 with jinja2 not found (scripts/deps.sh installs python3-jinja2)";
  check(compare(t), "tests/data/templates");
}

TEST(TemplateJinja2, AllFixtureTemplatesMatchByteForByte) {
  const std::string dir = std::string(KILN_FIXTURES_DIR) + "/templates";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "skipped: fixtures not found at " << dir;
  if (python().empty()) GTEST_SKIP() << "skipped: python3 with jinja2 not found (scripts/deps.sh installs python3-jinja2)";
  const auto t = templates_in(dir);
  ASSERT_GE(t.size(), 50u);
  check(compare(t), "../shared/fixtures/templates");
}

}  // namespace
