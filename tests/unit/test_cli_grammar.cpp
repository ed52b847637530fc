// kiln run and kiln chat with llama.cpp's output-constraint flags (--grammar, --grammar-file, -j/--json-schema,
// -jf/--json-schema-file) on a random-weight fixture model: the output follows the grammar, ends where it ends, and
// is all content (no reasoning split where the template opens a reasoning block); every reply of a chat follows
// it; bad grammars and schemas, two flags, a missing file: exit 1 naming the flag, before the model loads.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"

namespace {

using kiln::test::CmdResult;
using json = nlohmann::ordered_json;

std::string model() { return kiln::test::data_path("models/fixture-llama-q8_0.gguf"); }

std::string file_with(const std::string& name, const std::string& text) {
  const std::string p = kiln::test::temp_dir() + name;
  std::ofstream(p) << text;
  return p;
}

// The text kiln run printed (it ends the output with a newline).
std::string printed(const CmdResult& r) {
  std::string s = r.out;
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

CmdResult run(const std::string& args) {
  return kiln::test::run_kiln("run --device cpu -t 1 -m '" + model() + "' -p 'Once upon a time' " + args);
}

const char* kSchema = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
  "n": {"type": "integer", "minimum": 1, "maximum": 9}, "tags": {"type": "array", "items": {"enum": ["x", "y"]},
  "maxItems": 3}}, "required": ["name", "n", "tags"], "additionalProperties": false})";

TEST(CliGrammar, RunFollowsTheSchemaAndTheGrammar) {
  auto gbnf = kiln::grammar::json_schema_to_gbnf(std::string_view(kSchema));
  ASSERT_TRUE(gbnf);
  const std::string schema_file = file_with("schema.json", kSchema);
  for (int seed = 1; seed <= 3; ++seed) {
    for (const std::string& flag : {"-j '" + std::string(kSchema) + "'", "-jf '" + schema_file + "'",
                                    "--json-schema-file '" + schema_file + "'"}) {
      CmdResult r = run(flag + " --temp 1 -s " + std::to_string(seed));
      ASSERT_EQ(r.rc, 0) << r.err;
      const std::string t = printed(r);
      EXPECT_TRUE(kiln::grammar::test::matches(*gbnf, t)) << t;
      EXPECT_TRUE(json::parse(t, nullptr, false).is_object()) << t;
      EXPECT_NE(r.err.find("stop: eog"), std::string::npos) << r.err;
    }
  }
  const std::string g = "root ::= \"(\" [a-z]{1,4} (\",\" [a-z]{1,4}){0,2} \")\"";
  const std::regex same(R"(\([a-z]{1,4}(,[a-z]{1,4}){0,2}\))");
  const std::string gfile = file_with("g.gbnf", g + "\n");
  for (const std::string& flag : {"--grammar '" + g + "'", "--grammar-file '" + gfile + "'"}) {
    for (const char* sampling : {"--temp 0", "--temp 1 -s 4"}) {
      CmdResult r = run(flag + " " + sampling);
      ASSERT_EQ(r.rc, 0) << r.err;
      EXPECT_TRUE(std::regex_match(printed(r), same)) << printed(r);
    }
  }
  // --ignore-eos does not run past the end of the grammar.
  CmdResult r = run("--grammar 'root ::= \"yes\" | \"no\"' --ignore-eos -n 50");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(printed(r) == "yes" || printed(r) == "no") << r.out;
}

// A template that opens a reasoning block: with a grammar the reply is content on stdout, nothing on stderr.
TEST(CliGrammar, ConstrainedChatRepliesAreContent) {
  const std::string tmpl = file_with("think.jinja", "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                                                    "{% endfor %}<assistant><think>\n");
  CmdResult r = run("--chat --chat-template-file '" + tmpl + "' -j '" + std::string(kSchema) + "' --temp 1 -s 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json::parse(printed(r), nullptr, false).is_object()) << r.out;
  EXPECT_EQ(r.err.find("[reasoning]"), std::string::npos) << r.err;
  // kiln chat: every reply follows the grammar (the plain-text conversation of this model, whose stop strings do
  // not apply to a constrained reply).
  CmdResult c = kiln::test::run_kiln("chat --device cpu -t 1 -m '" + model() + "' --temp 1 -s 3 -j '" +
                                         std::string(kSchema) + "'",
                                     "first\nsecond\nthird\n");
  ASSERT_EQ(c.rc, 0) << c.err;
  // Each reply is one JSON document followed by a newline; the documents may span lines (JSON whitespace).
  const std::string& all = c.out;
  int n = 0;
  size_t pos = 0;
  while (pos < all.size()) {
    const size_t b = all.find('{', pos);
    if (b == std::string::npos) break;
    size_t depth = 0, e = b;
    bool in_str = false;
    for (; e < all.size(); ++e) {
      const char ch = all[e];
      if (in_str) {
        if (ch == '\\') ++e;
        else if (ch == '"') in_str = false;
      } else if (ch == '"') {
        in_str = true;
      } else if (ch == '{') {
        ++depth;
      } else if (ch == '}' && --depth == 0) {
        break;
      }
    }
    ASSERT_LT(e, all.size()) << all;
    EXPECT_TRUE(json::parse(all.substr(b, e - b + 1), nullptr, false).is_object()) << all.substr(b, e - b + 1);
    ++n;
    pos = e + 1;
  }
  EXPECT_EQ(n, 3) << c.out;
}

TEST(CliGrammar, BadFlagsNameTheFlagBeforeTheModelLoads) {
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"--grammar 'root ::= (\"a\"'", "--grammar: grammar: line 1, column"},
      {"--grammar 'start ::= \"a\"'", "--grammar: grammar: no rule named 'root'"},
      {"--grammar ''", "--grammar: empty"},
      {"-j '{\"type\": \"integer\", \"multipleOf\": 2}'", "--json-schema: json schema: /multipleOf: keyword 'multipleOf'"},
      {"--json-schema '{not json'", "--json-schema: json schema: not valid JSON"},
      {"-jf /nonexistent/schema.json", "--json-schema-file: cannot open '/nonexistent/schema.json'"},
      {"--grammar-file /nonexistent/g.gbnf", "--grammar-file: cannot open"},
      {"--grammar 'root ::= \"a\"' -j '{}'", "pass only one of --grammar and --json-schema"},
  };
  for (const char* cmd : {"run", "chat"}) {
    for (const Case& c : cases) {
      const std::string prompt = std::string(cmd) == "run" ? " -p x " : " ";
      CmdResult r = kiln::test::run_kiln(std::string(cmd) + " -m /nonexistent/model.gguf" + prompt + c.args);
      EXPECT_EQ(r.rc, 1) << cmd << " " << c.args;
      EXPECT_NE(r.err.find(c.says), std::string::npos) << cmd << " " << c.args << ": " << r.err;
      EXPECT_EQ(r.err.find("nonexistent/model.gguf"), std::string::npos) << r.err;  // checked before loading
    }
  }
  CmdResult h = kiln::test::run_kiln("run -h");
  for (const char* f : {"--grammar", "--grammar-file", "--json-schema", "--json-schema-file", "-jf"})
    EXPECT_NE(h.out.find(f), std::string::npos) << f;
}

}  // namespace
