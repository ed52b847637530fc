// Unit tests of the template interpreter for what the jinja2 comparison cannot show: error positions, bounds on
// hostile templates, the render_chat contract (tools/documents none, kwargs), value formatting, template reuse
// and reply parsing. (Byte-exactness against jinja2 is in test_template_jinja2 and test_template_snippets.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "template/template.h"
#include "template/tool_formats.h"
#include "template/value.h"

namespace {

using kiln::ErrorCode;
using kiln::tpl::Template;
using nlohmann::ordered_json;

kiln::Result<std::string> render(const std::string& src, const ordered_json& vars = ordered_json::object(),
                                 const kiln::tpl::RenderLimits& lim = {}) {
  auto t = Template::parse(src, "t.jinja");
  if (!t) return t.status();
  return t->render(vars, 0, lim);
}

std::string error_of(const std::string& src, const kiln::tpl::RenderLimits& lim = {}) {
  auto r = render(src, ordered_json::object(), lim);
  EXPECT_FALSE(r.is_ok()) << src << " rendered " << (r ? *r : "");
  return r ? "" : r.status().message();
}

TEST(TemplateErrors, ParseErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("ok\n{% if x %}\n  {{ 1 + }}\n{% endif %}"),
            "t.jinja: line 3, column 10: unexpected end of print statement");
  EXPECT_EQ(error_of("{% for x in y %}"), "t.jinja: line 1, column 17: unexpected end of template, expected 'endfor' or 'else'");
  EXPECT_EQ(error_of("a\n  {% frobnicate %}"), "t.jinja: line 2, column 6: Encountered unknown tag 'frobnicate'.");
  EXPECT_EQ(error_of("{{ x|nosuch }}"), "t.jinja: line 1, column 6: No filter named 'nosuch'.");
  EXPECT_EQ(error_of("{{ 'abc }}"), "t.jinja: line 1, column 4: unexpected char ''' (unterminated string)");
}

TEST(TemplateErrors, RuntimeErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("line one\n  {{ raise_exception('Roles must alternate') }}"),
            "t.jinja: line 2, column 6: raise_exception: Roles must alternate");
  EXPECT_EQ(error_of("{{ x.y }}"), "t.jinja: line 1, column 5: 'x' is undefined");
  EXPECT_EQ(error_of("\n\n   {{ 1 ~ (2 + 'a') }}"), "t.jinja: line 3, column 12: unsupported operand type(s) for +: 'int' and 'str'");
  // An unknown filter inside an if is only an error when it runs (jinja2 defers it there).
  EXPECT_EQ(*render("{% if false %}{{ x|nosuch }}{% endif %}ok"), "ok");
  EXPECT_EQ(error_of("{% if true %}{{ x|nosuch }}{% endif %}"), "t.jinja: line 1, column 19: No filter named 'nosuch' found.");
  EXPECT_EQ(error_of("{{ [1]|tojson }}{{ ([1]|map('string'))|tojson }}"),
            "t.jinja: line 1, column 40: Object of type generator is not JSON serializable");
  EXPECT_EQ(error_of("{% set l = [] %}{{ l.append(1) }}"),
            "t.jinja: line 1, column 21: access to attribute 'append' of 'list' object is unsafe.");
}

TEST(TemplateBounds, HostileTemplatesFailFastWithAnError) {
  kiln::tpl::RenderLimits lim;
  lim.max_steps = 100'000;
  auto check = [&](const std::string& src, const char* needle) {
    auto r = render(src, ordered_json::object(), lim);
    ASSERT_FALSE(r.is_ok()) << src;
    EXPECT_EQ(r.status().code(), ErrorCode::kOutOfRange) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("t.jinja: line ", 0), 0u) << r.status().message();
  };
  check("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "evaluation steps");
  check("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion depth");
  check("{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}", "recursion depth");
  // each call nests 90 unary operators: 100 calls x 90 levels overflowed the native stack under ASan
  // (fuzz_template); with a 256 KiB budget every build stops within the 100 calls, at the stack bound
  lim.max_stack_bytes = 256u << 10;
  check("{% macro f(n) %}{{ " + std::string(90, '+') + "f(n) }}{% endmacro %}{{ f(0) }}", "nested too deeply at run time");
  lim.max_stack_bytes = kiln::tpl::RenderLimits().max_stack_bytes;
  check("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "exceeds");
  check("{{ 'x' * 100000000000 }}", "exceeds");
  check("{{ [1] * 100000000000 }}", "exceeds");
  lim.max_output_bytes = 1000;
  check("{% for i in range(2000) %}x{% endfor %}", "output exceeds");
  // range() is capped as in jinja2's sandbox
  EXPECT_NE(error_of("{{ range(100001)|length }}").find("Range too big"), std::string::npos);
  // deep nesting is rejected by the parser instead of overflowing the stack
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested deeper"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if 1 %}";
  EXPECT_NE(error_of(ifs).find("nested deeper"), std::string::npos);
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "t.jinja: line 1, column 4: integer overflow (kiln's template integers are 64-bit)");
}

TEST(TemplateUndefined, BehavesLikeJinja2DefaultUndefined) {
  EXPECT_EQ(*render("[{{ x }}][{{ x|length }}][{{ x is defined }}][{% for i in x %}i{% else %}none{% endfor %}][{{ x ~ 'a' }}]"),
            "[][0][False][none][a]");
  EXPECT_EQ(*render("{{ d.missing }}|{{ d.missing is defined }}|{{ l[9] is defined }}", {{"d", {{"a", 1}}}, {"l", {1}}}),
            "|False|False");
  EXPECT_EQ(error_of("{{ x + 1 }}"), "t.jinja: line 1, column 4: 'x' is undefined");
  EXPECT_EQ(error_of("{{ x < 1 }}"), "t.jinja: line 1, column 4: 'x' is undefined");
}

// Where kiln knowingly differs from jinja2 (none of the fixture templates reaches these): Python's unbounded
// integers, the printed form of range objects, and the textwrap-based wordwrap filter.
TEST(TemplateKnownDivergences, AreErrorsOrDocumentedStandIns) {
  EXPECT_NE(error_of("{{ 10 ** 19 }}").find("integer overflow"), std::string::npos);  // Python: 10000000000000000000
  EXPECT_EQ(*render("{{ range(3) }}"), "[0, 1, 2]");                                   // Python: range(0, 3)
  EXPECT_NE(error_of("{{ 'abc'|wordwrap(2) }}").find("not supported"), std::string::npos);
  EXPECT_EQ(*render("{{ {'a': 1}.items() }}"), "[('a', 1)]");                          // Python: dict_items([('a', 1)])
  EXPECT_EQ(*render("{{ [1]|map('string') }}"), "<generator object>");                 // Python adds an address
}

TEST(TemplateRender, ParsedOnceRendersManyTimesIndependently) {
  auto t = Template::parse("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.is_ok());
  ordered_json v = {{"messages", {1, 2, 3}}};
  EXPECT_EQ(*t->render(v), "3");
  EXPECT_EQ(*t->render(v), "3");  // no state carried between renders
  EXPECT_EQ(*Template::parse("{{ strftime_now('%Y-%m-%d') }}")->render({}, 86400 * 365), "1971-01-01");
}

TEST(TemplateChat, RenderChatPassesWhatTransformersPasses) {
  const ordered_json msgs = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  kiln::tpl::RenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  const std::string src =
      "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ messages[0].content }}|{{ enable_thinking is defined }}";
  EXPECT_EQ(*kiln::tpl::render_chat(src, msgs, o), "<s>|</s>|True|True|True|hi|False");
  o.add_generation_prompt = false;
  o.tools = ordered_json::array();
  o.kwargs = {{"enable_thinking", false}, {"bos_token", "[BOS]"}};
  EXPECT_EQ(*kiln::tpl::render_chat(src, msgs, o), "[BOS]|</s>|False|True|False|hi|True");
  o.kwargs = {{"messages", 1}};
  auto r = kiln::tpl::render_chat(src, msgs, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("may not set 'messages'"), std::string::npos);
  // key order of the input JSON is what the template sees (Python dicts are ordered)
  o.kwargs = ordered_json::object();
  EXPECT_EQ(*kiln::tpl::render_chat("{{ messages[0]|tojson }}",
                                    ordered_json::parse(R"([{"role": "user", "content": "x", "a": 1}])"), o),
            R"({"role": "user", "content": "x", "a": 1})");
}

TEST(TemplateValues, PythonFloatRepr) {
  using kiln::tpl::py_float_repr;
  EXPECT_EQ(py_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(py_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(-2.0), "-2.0");
  EXPECT_EQ(py_float_repr(1e300 * 1e300), "inf");
  EXPECT_EQ(kiln::tpl::py_repr_string("it's"), "\"it's\"");
  EXPECT_EQ(kiln::tpl::py_repr_string("a\n\x01\xc3\xa9"), "'a\\n\\x01\xc3\xa9'");
}

TEST(TemplateReply, SplitsReasoningAndHermesToolCalls) {
  auto r = kiln::tpl::parse_reply(
      "<think>\nplan it\n</think>\n\nSure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>");
  EXPECT_EQ(r.reasoning_content, "plan it");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"location\":\"Paris\"}");
  EXPECT_EQ(r.tool_calls[0].id.rfind("call_", 0), 0u);  // fresh ids, one per call
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
  EXPECT_EQ(r.tool_calls[1].arguments, "{\"q\":1}");
}

TEST(TemplateReply, ReasoningWithoutOpeningTagAndTruncatedThinking) {
  auto r = kiln::tpl::parse_reply("reasoning only closed\n</think>\n\nanswer");
  EXPECT_EQ(r.reasoning_content, "reasoning only closed");
  EXPECT_EQ(r.content, "answer");
  r = kiln::tpl::parse_reply("<think>still thinking");
  EXPECT_EQ(r.reasoning_content, "still thinking");
  EXPECT_EQ(r.content, "");
  r = kiln::tpl::parse_reply("Text mentioning <think> later</think> stays");  // not a leading block
  EXPECT_EQ(r.reasoning_content, "");
  EXPECT_EQ(r.content, "Text mentioning <think> later</think> stays");
}

TEST(TemplateReply, MalformedToolCallsStayContent) {
  auto r = kiln::tpl::parse_reply("<tool_call>{\"name\": broken</tool_call> after");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<tool_call>{\"name\": broken</tool_call> after");
  r = kiln::tpl::parse_reply("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}", {});
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}");
  r = kiln::tpl::parse_reply("{\"not\": \"a call\"}");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "{\"not\": \"a call\"}");
  // A call without a function name (empty or blank) is no call; found by fuzz_template.
  for (const char* name : {"", " "}) {
    const std::string text = std::string("ok <tool_call>\n{\"name\": \"") + name + "\", \"arguments\": {\"a\": 0}}\n</tool_call>";
    r = kiln::tpl::parse_reply(text);
    EXPECT_TRUE(r.tool_calls.empty()) << "name '" << name << "'";
    EXPECT_EQ(r.content, text);
  }
}

TEST(TemplateReply, MistralAndLlama3Formats) {
  auto r = kiln::tpl::parse_reply("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abc123XYZ\"}]");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].id, "abc123XYZ");
  EXPECT_EQ(r.content, "");
  r = kiln::tpl::parse_reply("Checking.[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\"}[TOOL_CALLS]search[ARGS]{}");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(r.content, "Checking.");
  r = kiln::tpl::parse_reply("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": [1, 2]}}");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"x\":[1,2]}");
  r = kiln::tpl::parse_reply("{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {\"y\": 1}}");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[1].name, "g");
  // a template's own markers: Mistral reasoning
  const auto opts = kiln::tpl::reply_options_for_template("... [THINK] ... [TOOL_CALLS] ...");
  ASSERT_NE(opts.tool_format, nullptr);
  EXPECT_EQ(opts.tool_format->name, "mistral");
  r = kiln::tpl::parse_reply("[THINK]hmm[/THINK]Answer", opts);
  EXPECT_EQ(r.reasoning_content, "hmm");
  EXPECT_EQ(r.content, "Answer");
}

}  // namespace
