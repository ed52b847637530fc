// kiln serve's output constraints (docs/GRAMMAR.md) with a random-weight fixture model, whose text follows only the
// grammar: OpenAI's response_format (json_schema, json_object), llama-server's grammar and json_schema, vLLM's
// guided_json / guided_regex / guided_choice / guided_grammar, on /v1/chat/completions and /v1/completions,
// streamed and not. Every output parses as JSON and validates against its schema (ajv with ajv-formats, the grammar
// tests' oracle, where node and npm are present; the grammar's own matcher always), GBNF and regex outputs match,
// choices are one of the choices; a constrained chat reply is content even where the template opened a reasoning
// block. Two constraints, an unenforceable keyword, bad GBNF, a bad regex or choice list: 400 naming the field.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;
namespace fs = std::filesystem;

std::string work_dir() {
  static const std::string d = [] {
    std::string p = ::kiln::test::temp_dir() + "kiln_structured_" + std::to_string(::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

// Schemas whose every path ends within a few hundred bytes: random weights never choose to stop early, so an
// unbounded string or array would run to max_tokens.
const char* kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "ok": {"type": "boolean"}},
        "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"city": {"enum": ["Paris", "Lima", "Oslo"]},
        "unit": {"const": "celsius"}, "days": {"type": "array", "minItems": 1, "maxItems": 3,
        "items": {"type": "object", "properties": {"date": {"type": "string", "format": "date"},
        "high": {"type": "integer", "minimum": -60, "maximum": 60}}, "required": ["date", "high"],
        "additionalProperties": false}}}, "required": ["city", "unit", "days"], "additionalProperties": false})",
    R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}},
        "anyOf": [{"type": "object", "properties": {"kind": {"const": "line"}, "from": {"$ref": "#/$defs/point"},
        "to": {"$ref": "#/$defs/point"}}, "required": ["kind", "from", "to"], "additionalProperties": false},
        {"type": "object", "properties": {"kind": {"const": "dot"}, "at": {"$ref": "#/$defs/point"}},
        "required": ["kind", "at"], "additionalProperties": false}]})",
    R"({"type": "array", "items": {"type": "string", "format": "uuid"}, "minItems": 1, "maxItems": 2})",
    R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "when": {"type": "string", "format": "date-time"}, "score": {"type": "number", "minimum": 0, "maximum": 100},
        "note": {"type": ["string", "null"], "maxLength": 8}}, "required": ["id", "when", "score", "note"],
        "additionalProperties": false})",
};

class ServeStructured : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A template that opens a reasoning block in the prompt: an unconstrained reply is reasoning_content.
    const std::string tmpl = work_dir() + "/think.jinja";
    std::ofstream(tmpl) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant><think>\n";
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "--parallel", "4",
                              "-c", "8192", "--chat-template-file", tmpl}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const std::string& path, const json& body) {
    return test::http(proc_->port, "POST", path, body.dump());
  }
  static json chat(json extra) {
    json b = {{"messages", {{{"role", "user"}, {"content", "Answer in JSON."}}}}, {"max_tokens", 1500}};
    b.update(extra);
    return b;
  }
  static json completion(json extra) {
    json b = {{"prompt", "Once upon a time"}, {"max_tokens", 1500}};
    b.update(extra);
    return b;
  }
  // The texts of every choice of a 200 response (chat content or completion text), each finished by "stop".
  static std::vector<std::string> texts(const HttpResponse& r) {
    std::vector<std::string> out;
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) return out;
    const json j = r.j();
    for (const json& c : j["choices"]) {
      EXPECT_EQ(c["finish_reason"], "stop") << r.body;
      if (c.contains("message")) {
        EXPECT_FALSE(c["message"].contains("reasoning_content")) << r.body;
        out.push_back(c["message"]["content"].get<std::string>());
      } else {
        out.push_back(c["text"].get<std::string>());
      }
    }
    return out;
  }
  static HttpResponse expect_400(const std::string& path, const json& body, const std::string& param,
                                 const std::string& says) {
    HttpResponse r = post(path, body);
    EXPECT_EQ(r.status, 400) << body.dump() << "\n" << r.body;
    EXPECT_EQ(r.j()["error"]["param"], param) << r.body;
    EXPECT_NE(r.j()["error"]["message"].get<std::string>().find(says), std::string::npos) << r.body;
    return r;
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* ServeStructured::proc_ = nullptr;

// ajv over every output (tests/grammar/ajv_validate.mjs); "" when all validate, the reason when ajv cannot run.
std::string ajv_check(const json& cases, bool* ran) {
  *ran = false;
  std::string why;
  const std::string npm_dir = test::npm_packages("npm-ajv", {"ajv@8", "ajv-formats@3"}, &why);
  if (npm_dir.empty()) return why;
  const std::string file = work_dir() + "/cases.json", log = work_dir() + "/ajv.log";
  std::ofstream(file) << cases.dump();
  const std::string cmd = "KILN_NPM_DIR='" + npm_dir + "' timeout 120 node '" + std::string(KILN_SOURCE_DIR) +
                          "/tests/grammar/ajv_validate.mjs' '" + file + "' >'" + log + "' 2>&1";
  *ran = true;
  const int st = std::system(cmd.c_str());
  const std::string out = test::slurp(log);
  std::printf("%s", out.c_str());
  return st == 0 ? "" : out;
}

TEST_F(ServeStructured, JsonSchemaOutputsValidate) {
  json cases = json::array();
  for (size_t i = 0; i < std::size(kSchemas); ++i) {
    SCOPED_TRACE("schema " + std::to_string(i));
    const json schema = json::parse(kSchemas[i]);
    // Properties come in the order the client wrote them: the text's, or (a schema sent as an object from this
    // test's json) sorted by name.
    auto gbnf = grammar::json_schema_to_gbnf(std::string_view(kSchemas[i]));
    auto sorted = grammar::json_schema_to_gbnf(std::string_view(schema.dump()));
    ASSERT_TRUE(gbnf && sorted) << gbnf.status().to_string();
    std::vector<std::string> outs;
    auto add = [&](const std::vector<std::string>& t) { outs.insert(outs.end(), t.begin(), t.end()); };
    const json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"strict", true}, {"schema", schema}}}};
    add(texts(post("/v1/chat/completions", chat({{"response_format", rf}, {"n", 3}, {"temperature", 1.0}, {"seed", i}}))));
    add(texts(post("/v1/chat/completions", chat({{"response_format", rf}, {"temperature", 0}}))));
    add(texts(post("/v1/completions", completion({{"json_schema", schema}, {"n", 2}, {"temperature", 1.0}}))));
    add(texts(post("/v1/completions", completion({{"guided_json", kSchemas[i]}, {"temperature", 0.7}}))));
    add(texts(post("/v1/chat/completions", chat({{"guided_json", schema}, {"top_k", 5}, {"temperature", 1.5}}))));
    ASSERT_EQ(outs.size(), 8u);
    for (const std::string& t : outs) {
      EXPECT_TRUE(grammar::test::matches(*gbnf, t) || grammar::test::matches(*sorted, t)) << t;
      EXPECT_FALSE(json::parse(t, nullptr, false).is_discarded()) << t;
    }
    cases.push_back({{"name", "schema " + std::to_string(i)}, {"schema", schema}, {"outputs", outs}});
  }
  bool ran = false;
  const std::string why = ajv_check(cases, &ran);
  if (ran) EXPECT_EQ(why, "");
  else std::printf("ajv not run: %s (the outputs were checked by the grammar's matcher)\n", why.c_str());
}

// response_format json_object: any object, strings and nesting unbounded, so a random model may run to the limit:
// a reply that ends ("stop") parses as an object, one cut by max_tokens is a prefix the grammar allows. Streamed:
// the same text as the same seeded request unstreamed.
TEST_F(ServeStructured, JsonObjectAndStreaming) {
  const std::string gbnf = grammar::json_object_gbnf();
  int stopped = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    const json body = chat({{"response_format", {{"type", "json_object"}}}, {"temperature", 1.0}, {"seed", seed},
                            {"max_tokens", 200}});
    HttpResponse r = post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = r.j()["choices"][0];
    const std::string t = c["message"]["content"];
    if (c["finish_reason"] == "stop") {
      ++stopped;
      EXPECT_TRUE(json::parse(t, nullptr, false).is_object()) << t;
    } else {
      auto cg = grammar::test::compile(gbnf, grammar::test::byte_vocab());
      grammar::Matcher m(cg);
      EXPECT_TRUE(m.accept_bytes(t).is_ok()) << t;
    }
    json sb = body;
    sb["stream"] = true;
    const test::Streamed s = test::parse_stream(post("/v1/chat/completions", sb).body);
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.text, t);
    EXPECT_EQ(s.finish, c["finish_reason"].get<std::string>());
  }
  EXPECT_GT(stopped, 0);
  // llama-server's json_object with a schema beside it.
  const json rfs = {{"type", "json_object"}, {"schema", {{"type", "array"}, {"items", {{"type", "boolean"}}},
                                                         {"maxItems", 3}}}};
  for (const std::string& t : texts(post("/v1/completions", completion({{"response_format", rfs}})))) {
    const json j = json::parse(t, nullptr, false);
    EXPECT_TRUE(j.is_array() && j.size() <= 3) << t;
  }
}

TEST_F(ServeStructured, GrammarRegexAndChoice) {
  const std::string gbnf = R"g(root ::= "(" word ("," word){0,3} ")"
word ::= [a-z]{1,5})g";
  const std::regex same(R"(\([a-z]{1,5}(,[a-z]{1,5}){0,3}\))");
  for (const char* field : {"grammar", "guided_grammar"}) {
    for (const std::string& t : texts(post("/v1/completions", completion({{field, gbnf}, {"n", 3}, {"temperature", 1}}))))
      EXPECT_TRUE(std::regex_match(t, same)) << field << ": " << t;
    for (const std::string& t : texts(post("/v1/chat/completions", chat({{field, gbnf}, {"temperature", 0}}))))
      EXPECT_TRUE(std::regex_match(t, same)) << field << ": " << t;
  }
  const std::regex plate(R"([A-Z]{2}-\d{3}(-[a-z]+)?)");
  for (const std::string& t :
       texts(post("/v1/completions", completion({{"guided_regex", R"([A-Z]{2}-\d{3}(-[a-z]{1,6})?)"}, {"n", 4},
                                                 {"temperature", 1}}))))
    EXPECT_TRUE(std::regex_match(t, plate)) << t;
  const std::vector<std::string> choices = {"positive", "negative", "neutral", "pos"};
  for (const std::string& t : texts(post("/v1/chat/completions", chat({{"guided_choice", choices}, {"n", 6},
                                                                        {"temperature", 1.0}, {"seed", 5}}))))
    EXPECT_NE(std::find(choices.begin(), choices.end(), t), choices.end()) << t;
  // Not constraints: response_format text, llama-server's default grammar "" (the reply is reasoning here).
  for (const json& extra : {json{{"response_format", {{"type", "text"}}}}, json{{"grammar", ""}}}) {
    json b = chat(extra);
    b["max_tokens"] = 4;
    b["ignore_eos"] = true;
    HttpResponse r = post("/v1/chat/completions", b);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(r.j()["choices"][0]["message"].contains("reasoning_content")) << r.body;
  }
}

// With tools offered and tool_choice "auto" the constrained reply is content; a tool call required is refused.
TEST_F(ServeStructured, ToolsBesideAConstraint) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  const json schema = json::parse(kSchemas[0]);
  const std::vector<std::string> t =
      texts(post("/v1/chat/completions", chat({{"tools", tools}, {"tool_choice", "auto"}, {"json_schema", schema}})));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(json::parse(t[0], nullptr, false).is_object()) << t[0];
  expect_400("/v1/chat/completions", chat({{"tools", tools}, {"tool_choice", "required"}, {"json_schema", schema}}),
             "tool_choice", "'json_schema' does not allow");
  const json named = {{"type", "function"}, {"function", {{"name", "f"}}}};
  expect_400("/v1/chat/completions",
             chat({{"tools", tools}, {"tool_choice", named}, {"response_format", {{"type", "json_object"}}}}),
             "tool_choice", "'response_format' does not allow");
}

TEST_F(ServeStructured, RefusalsNameTheField) {
  const json schema = json::parse(kSchemas[0]);
  const json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}};
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    SCOPED_TRACE(path);
    auto body = [&](json extra) { return std::string(path) == "/v1/completions" ? completion(extra) : chat(extra); };
    expect_400(path, body({{"grammar", "root ::= \"a\""}, {"json_schema", schema}}), "json_schema",
               "'grammar' and 'json_schema' both constrain the output");
    expect_400(path, body({{"response_format", rf}, {"guided_regex", "a+"}}), "guided_regex",
               "'response_format' and 'guided_regex' both constrain the output");
    expect_400(path, body({{"guided_choice", {"a"}}, {"guided_json", schema}, {"stream", true}}), "guided_choice",
               "'guided_json' and 'guided_choice' both constrain the output");
    json mult = rf;
    mult["json_schema"]["schema"]["properties"]["age"]["multipleOf"] = 5;
    expect_400(path, body({{"response_format", mult}}), "response_format.json_schema.schema",
               "/properties/age/multipleOf: keyword 'multipleOf' is not supported");
    expect_400(path, body({{"json_schema", {{"type", "string"}, {"format", "uri"}}}}), "json_schema",
               "format 'uri' is not supported");
    expect_400(path, body({{"guided_json", "{not json"}}), "guided_json", "not valid JSON");
    expect_400(path, body({{"grammar", "root ::= (\"a\""}}), "grammar", "line 1, column");
    expect_400(path, body({{"guided_grammar", "start ::= \"a\""}}), "guided_grammar", "no rule named 'root'");
    expect_400(path, body({{"guided_regex", "(?=a)b"}}), "guided_regex", "regex: offset");
    expect_400(path, body({{"guided_choice", json::array()}}), "guided_choice", "the list is empty");
    expect_400(path, body({{"guided_choice", {"a", 1}}}), "guided_choice", "'guided_choice[1]' must be a string");
    expect_400(path, body({{"guided_whitespace_pattern", " *"}, {"guided_json", schema}}), "guided_whitespace_pattern",
               "not supported");
    expect_400(path, body({{"response_format", {{"type", "xml"}}}}), "response_format.type", "not 'xml'");
    expect_400(path, body({{"response_format", {{"type", "json_schema"}}}}), "response_format.json_schema",
               "must be an object");
    expect_400(path, body({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"strict", "yes"}}}}}}),
               "response_format.json_schema.strict", "must be a boolean");
    expect_400(path, body({{"grammar", 7}}), "grammar", "must be a string");
  }
}

}  // namespace
}  // namespace kiln
