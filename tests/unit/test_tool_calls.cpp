// Tool-call formats (template/tool_formats.h) and the grammar of a forced call (runtime/tool_grammar.h), family by
// family:
//   - every fixture template is detected as the format its tool-call rendering uses (or none);
//   - a conversation with tool calls rendered by kiln's template engine parses back into the calls;
//   - the canonical text of calls (the format's patterns filled in, which the template renders too) parses into
//     the calls, the grammar of tool_choice "required" / a named function accepts it and refuses malformed text
//     (an unknown function, an argument of the wrong type, text before the call, a cut-off call);
//   - calls sampled under the grammar with random choices parse, name an allowed function and have arguments
//     the schema accepts (the JSON-schema grammar as the validator).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "runtime/grammar_mask.h"
#include "runtime/prompt.h"
#include "runtime/tool_grammar.h"
#include "template/template.h"
#include "template/tool_formats.h"
#include "unit/grammar_test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using tpl::Slot;
using tpl::ToolFormat;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "the city"},
      "days": {"type": "integer", "minimum": 1, "maximum": 14, "description": "days ahead"}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "search", "description": "Web search",
    "parameters": {"type": "object", "properties": {
      "query": {"type": "string", "description": "the query"},
      "exact": {"type": "boolean", "description": "exact match"}},
    "required": ["query"]}}}])");

struct Call {
  std::string name;
  ojson args;
};
const std::vector<Call> kCalls = {{"get_weather", {{"city", "Paris"}, {"days", 2}}},
                                  {"get_weather", {{"city", "Lima"}, {"days", 1}}}};
// Call ids as the templates ask for them (Mistral: 9 letters and digits; Solar Open: 10 lowercase ones) and as
// kiln makes them.
std::string id_for(const ToolFormat& f, size_t i) {
  if (f.ids == tpl::CallIds::kSolar) return i ? "f6g7h8i9j0" : "a1b2c3d4e5";
  if (f.ids == tpl::CallIds::kMistral) return i ? "def456UVW" : "abc123XYZ";
  return i ? "call_0123456789abcdefABCDEFGH" : "call_ABCDEFGHabcdef0123456789";
}

// The template that uses each format (file name without .jinja -> format name; "" none).
const std::map<std::string, std::string> kExpected = {
    {"Apertus-8B-Instruct", "apertus"},
    {"Apriel-1.6-15b-Thinker-fixed", "apriel"},
    {"Bielik-11B-v3.0-Instruct", "hermes"},
    {"ByteDance-Seed-OSS", "seed-oss"},
    {"Cohere2MoE", "command-r7b"},
    {"CohereForAI-c4ai-command-r-plus-tool_use", "command-r-plus"},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", "command-r7b"},
    {"GLM-4.6", "glm"},
    {"GigaChat3-10B-A1.8B", "gigachat3"},
    {"GigaChat3.1-10B-A1.8B", "gigachat3.1"},
    {"Kimi-K2-Thinking", "kimi-k2"},
    {"Kimi-K3", "kimi-k3"},
    {"LFM2-8B-A1B", "lfm2"},
    {"LFM2.5-8B-A1B", "lfm2"},
    {"MiMo-VL", "hermes"},
    {"MiniMax-M1", "minimax-m1"},
    {"MiniMax-M3", "minimax-m3"},
    {"Mistral-Small-3.2-24B-Instruct-2506", "mistral-call-id"},
    {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "qwen3-coder"},
    {"NVIDIA-Nemotron-Nano-v2", "nemotron-v2"},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"},
    {"Qwen-QwQ-32B", "hermes"},
    {"Qwen-Qwen2.5-7B-Instruct", "hermes"},
    {"Qwen-Qwen3-0.6B", "hermes"},
    {"Reka-Edge", "hermes"},
    {"Spark2.5", "glm"},
    {"StepFun3.5-Flash", "qwen3-coder"},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-r1"},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1"},
    {"deepseek-ai-DeepSeek-V3.2", "deepseek-v3.2"},
    {"deepseek-ai-DeepSeek-V4-Flash-0731", "deepseek-v4"},
    {"deepseek-ai-DeepSeek-V4", "deepseek-v4"},
    {"fireworks-ai-llama-3-firefunction-v2", "firefunction-v2"},
    {"google-gemma-2-2b-it", ""},
    {"google-gemma-4-31B-it-interleaved", "gemma4"},
    {"ibm-granite-granite-3.3-2B-Instruct", "granite-3"},
    {"ibm-granite-granite-4.1", "hermes"},
    {"inclusionai-ling-3.0-flash", "glm"},
    {"llama-cpp-deepseek-r1", "deepseek-r1"},
    {"llama-cpp-rwkv-world", ""},
    {"meetkai-functionary-medium-v3.1", "functionary-v3.1"},
    {"meetkai-functionary-medium-v3.2", "functionary-v3.2"},
    {"meta-llama-Llama-3.1-8B-Instruct", "llama3"},
    {"meta-llama-Llama-3.2-3B-Instruct", "llama3"},
    {"microsoft-Phi-3.5-mini-instruct", ""},
    {"mistralai-Ministral-3-14B-Reasoning-2512", "mistral-args"},
    {"moonshotai-Kimi-K2", "kimi-k2"},
    {"muse-glimmer", "muse-glimmer"},
    {"openai-gpt-oss-120b", "harmony"},
    {"openbmb-MiniCPM5-1B", "minicpm5"},
    {"poolside-Laguna-S-2.1", "glm"},
    {"poolside-Laguna-XS-2.1", "glm"},
    {"poolside-Laguna-XS.2", "glm"},
    {"tencent-Hy3", "hy3"},
    {"unsloth-Apriel-1.5", "apriel"},
    {"unsloth-mistral-Devstral-Small-2507", "mistral-args"},
    {"upstage-Solar-Open-100B", "solar-open"},
};

// Templates that write their format only in the prompt's instructions (no assistant tool-call rendering), or that
// jinja2 itself refuses to render with tool calls (so kiln's engine does too).
const std::set<std::string> kNoRendering = {"ibm-granite-granite-3.3-2B-Instruct", "LFM2-8B-A1B", "Kimi-K2-Thinking"};

std::vector<std::pair<std::string, std::string>> templates() {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  std::vector<std::string> dirs = {test::data_path("templates")};
  if (!test::fixtures_dir().empty()) dirs.insert(dirs.begin(), test::fixtures_dir() + "/templates");
  for (const std::string& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files)
      if (seen.insert(p.stem().string()).second) out.push_back({p.stem().string(), test::slurp(p.string())});
  }
  return out;
}

// Python's json.dumps (", " and ": " separators), as templates write arguments with tojson.
std::string py_json(const ojson& v) {
  if (v.is_object()) {
    std::string s = "{";
    for (auto it = v.begin(); it != v.end(); ++it) s += (it == v.begin() ? "" : ", ") + ojson(it.key()).dump() + ": " + py_json(it.value());
    return s + "}";
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + py_json(v[i]);
    return s + "]";
  }
  return v.dump();
}

std::string value_text(const ToolFormat& f, const ojson& v) {
  if (f.values == tpl::ValueSyntax::kPython) {
    if (v.is_string()) return "'" + v.get<std::string>() + "'";
    if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
    return v.dump();
  }
  if (f.values == tpl::ValueSyntax::kGemma) return v.is_string() ? "<|\"|>" + v.get<std::string>() + "<|\"|>" : v.dump();
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string no_ws(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') out += c;
  return out;
}

// The canonical text of calls in format f: its patterns filled in (the inverse of the parser). compact: the
// literals without their whitespace (which the grammar leaves optional).
std::string canonical(const ToolFormat& f, const std::vector<Call>& calls, bool compact = false) {
  const auto L = [&](const std::string& t) { return compact ? no_ws(t) : t; };
  std::string all;
  for (size_t c = 0; c < calls.size(); ++c) {
    if (c) all += L(f.call_sep);
    ojson args = calls[c].args;
    std::vector<std::string> keys;
    for (auto it = args.begin(); it != args.end(); ++it) keys.push_back(it.key());
    if (f.sorted_keys) std::sort(keys.begin(), keys.end());
    for (const tpl::Piece& x : f.call) {
      switch (x.slot) {
        case Slot::kText: all += L(x.text); break;
        case Slot::kName: all += calls[c].name; break;
        case Slot::kId: all += id_for(f, c); break;
        case Slot::kIndex: all += std::to_string(c); break;
        case Slot::kIndex1: all += std::to_string(c + 1); break;
        case Slot::kArgs: all += py_json(args); break;
        case Slot::kJson: {
          const tpl::JsonShape& sh = f.json;
          if (sh.name_is_key) {
            all += "{" + ojson(calls[c].name).dump() + ": " + py_json(args) + "}";
          } else {
            all += "{";
            if (!sh.counter_key.empty()) all += ojson(sh.counter_key).dump() + ": \"" + std::to_string(c) + "\", ";
            all += ojson(sh.name_key).dump() + ": " + ojson(calls[c].name).dump() + ", " + ojson(sh.args_key).dump() +
                   ": " + py_json(args);
            if (!sh.id_key.empty()) all += ", " + ojson(sh.id_key).dump() + ": " + ojson(id_for(f, c)).dump();
            all += "}";
          }
          break;
        }
        case Slot::kParams:
          for (size_t k = 0; k < keys.size(); ++k) {
            if (k) all += L(f.param_sep);
            const ojson& v = args[keys[k]];
            for (const tpl::Piece& y : f.param) {
              if (y.slot == Slot::kText) all += L(y.text);
              else if (y.slot == Slot::kKey) all += keys[k];
              else if (y.slot == Slot::kValue) all += value_text(f, v);
              else if (y.slot == Slot::kIsString) all += v.is_string() ? "true" : "false";
              else if (y.slot == Slot::kType) all += v.is_string() ? "string" : v.is_boolean() ? "boolean" : "number";
            }
          }
          break;
        default: break;
      }
    }
  }
  if (f.section.empty()) return all;
  std::string out;
  for (const tpl::Piece& x : f.section) out += x.slot == Slot::kCalls ? all : L(x.text);
  return out;
}

// A grammar compiled once for the byte vocabulary; accepts(text): the whole text is in its language.
struct Compiled {
  std::shared_ptr<const grammar::CompiledGrammar> cg;
  explicit Compiled(const std::string& gbnf) : cg(grammar::test::compile(gbnf, grammar::test::byte_vocab())) {}
  bool accepts(const std::string& text) const {
    if (!cg) return false;
    grammar::Matcher m(cg);
    return m.accept_bytes(text).is_ok() && m.is_complete();
  }
};

std::vector<tpl::ToolCall> parse(const ToolFormat& f, std::string text, bool opened = false,
                                 const std::string& opener_tail = {}) {
  std::vector<tpl::ToolCall> calls;
  tpl::parse_tool_calls(f, &text, &calls, kTools, opened, opener_tail);
  return calls;
}

void expect_calls(const std::vector<tpl::ToolCall>& got, const std::vector<Call>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name) << where;
    EXPECT_EQ(ojson::parse(got[i].arguments), want[i].args) << where << ": " << got[i].arguments;
    EXPECT_FALSE(got[i].id.empty()) << where;
  }
}

std::string gbnf(const ToolFormat& f, std::vector<std::string> names, bool parallel) {
  ToolGrammarRequest rq;
  rq.names = std::move(names);
  rq.parallel = parallel;
  auto g = tool_call_gbnf(f, kTools, rq);
  EXPECT_TRUE(g) << f.name << ": " << g.status().message();
  return g ? *g : std::string();
}

size_t n_calls(const ToolFormat& f) { return f.parallel ? 2 : 1; }

std::vector<Call> calls_for(const ToolFormat& f) {
  return std::vector<Call>(kCalls.begin(), kCalls.begin() + static_cast<long>(n_calls(f)));
}

TEST(ToolFormats, EveryFixtureTemplateIsDetected) {
  const auto ts = templates();
  ASSERT_FALSE(ts.empty());
  for (const auto& [name, src] : ts) {
    auto it = kExpected.find(name);
    ASSERT_NE(it, kExpected.end()) << "no expectation for template " << name;
    const ToolFormat* f = tpl::detect_tool_format(src);
    EXPECT_EQ(f ? f->name : std::string(), it->second) << name;
  }
  if (test::fixtures_dir().empty()) GTEST_SKIP() << "skipped: fixtures not found at " KILN_FIXTURES_DIR " (checked "
                                                  << ts.size() << " committed templates)";
}

TEST(ToolFormats, EveryFormatIsUsedAndNamedOnce) {
  std::set<std::string> names, used;
  for (const auto& [t, f] : kExpected) used.insert(f);
  for (const ToolFormat& f : tpl::tool_formats()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_FALSE(f.opener().empty() && !f.at_start) << f.name << ": a call must start with a literal";
    // Without a fixture template: MiniMax M2's and DeepSeek V3.1's published formats, and Mistral's first
    // [TOOL_CALLS] JSON array (Mistral 7B v0.3, Nemo; also read from the replies of templates that name no format).
    static const std::set<std::string> kNoFixture = {"minimax-m2", "deepseek-v3.1", "mistral"};
    EXPECT_TRUE(kNoFixture.count(f.name) || used.count(f.name)) << f.name << " has no fixture template";
  }
}

// The calls of format f in text: all of them, or (formats whose calls open the reply) those of the first assistant
// turn that starts with one.
std::vector<tpl::ToolCall> calls_in(const ToolFormat& f, const std::string& text, const std::string& src) {
  if (f.name == "harmony") {  // each call is an assistant message of its own, read as a reply is
    tpl::ReplyOptions o = tpl::reply_options_for_template(src);
    o.tools = kTools;
    std::vector<tpl::ToolCall> out;
    const std::string start = "<|start|>assistant";
    for (size_t at = text.find(start); at != std::string::npos; at = text.find(start, at + 1)) {
      const size_t b = at + start.size(), e = text.find("<|start|>", b);
      for (const auto& c : tpl::parse_reply(text.substr(b, e == std::string::npos ? e : e - b), o).tool_calls)
        out.push_back(c);
    }
    return out;
  }
  std::string t = text;
  if (f.at_start) {
    const size_t at = t.find("{\"name\"");
    if (at == std::string::npos) return {};
    t = t.substr(at, t.find("<|", at) - at);
  }
  std::vector<tpl::ToolCall> all, out;
  tpl::parse_tool_calls(f, &t, &all, kTools);
  for (const auto& c : all)  // the prompt's own examples may parse too: keep the conversation's calls
    if (c.name == "get_weather") out.push_back(c);
  return out;
}

// A conversation with the calls (two, one where the template holds one), their results and a reply, rendered by
// kiln's engine. Templates differ in what they accept (null or "" content beside calls, arguments as a mapping or
// a JSON string, tools they can list), so the variants are tried until one renders the calls; "" when none does,
// with what was tried in *log.
std::string render_calls(const std::string& src, const ToolFormat& f, std::string* log) {
  const std::vector<Call> want = calls_for(f);
  for (int attempt = 0; attempt < 8; ++attempt) {
    const bool null_content = attempt & 1, string_args = attempt & 2, no_tools = attempt & 4;
    ojson msgs = ojson::array();
    msgs.push_back({{"role", "user"}, {"content", "Weather in Paris?"}});
    ojson a = {{"role", "assistant"}, {"content", null_content ? ojson(nullptr) : ojson("")}, {"tool_calls", ojson::array()}};
    for (size_t i = 0; i < want.size(); ++i)
      a["tool_calls"].push_back({{"id", id_for(f, i)}, {"type", "function"},
                                 {"function", {{"name", want[i].name},
                                               {"arguments", string_args ? ojson(py_json(want[i].args)) : want[i].args}}}});
    msgs.push_back(a);
    for (size_t i = 0; i < want.size(); ++i)
      msgs.push_back({{"role", "tool"}, {"tool_call_id", id_for(f, i)}, {"name", want[i].name}, {"content", "sunny"}});
    msgs.push_back({{"role", "assistant"}, {"content", "Sunny."}});
    msgs.push_back({{"role", "user"}, {"content", "Thanks"}});
    tpl::RenderOptions o;
    o.tools = no_tools ? ojson(nullptr) : kTools;
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    o.kwargs = {{"functions", "[]"}, {"datetime", "2025-01-01"}};  // firefunction's own variables
    auto text = tpl::render_chat(src, msgs, o);
    if (!text) {
      *log += " [" + text.status().message() + "]";
      continue;
    }
    const size_t n = calls_in(f, *text, src).size();
    *log += " [rendered, " + std::to_string(n) + " calls]";
    if (n == want.size()) return *text;
  }
  return "";
}

// Rendered by the template, the calls parse back; and the template writes the canonical text (whitespace aside:
// the grammar leaves it optional, and a template family differs in it).
TEST(ToolFormats, RenderedConversationsParseAndHoldTheCanonicalText) {
  int n = 0;
  for (const auto& [name, src] : templates()) {
    const ToolFormat* f = tpl::detect_tool_format(src);
    if (!f || kNoRendering.count(name)) continue;
    std::string log;
    const std::string text = render_calls(src, *f, &log);
    ASSERT_FALSE(text.empty()) << name << ":" << log;
    expect_calls(calls_in(*f, text, src), calls_for(*f), name);
    std::string c = no_ws(canonical(*f, calls_for(*f)));
    if (f->name == "functionary-v3.2") c = c.substr(3);  // the first ">>>" is the generation prompt's
    if (f->name == "harmony")  // gpt-oss's template writes the recipient in the role header, without <|constrain|>
      c = no_ws("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" +
                py_json(kCalls[0].args));
    EXPECT_NE(no_ws(text).find(c), std::string::npos) << name << ": no canonical text " << c << " in\n" << text;
    ++n;
  }
  std::printf("%d templates render their calls\n", n);
}

TEST(ToolFormats, CanonicalTextParsesAndTheGrammarAcceptsIt) {
  for (const ToolFormat& f : tpl::tool_formats()) {
    const std::vector<Call> want = calls_for(f);
    const std::string text = canonical(f, want), compact = canonical(f, want, true);
    expect_calls(parse(f, (f.at_start ? "" : "Sure. ") + text), want, f.name + ": " + text);
    expect_calls(parse(f, compact), want, f.name + ": " + compact);
    const Compiled any(gbnf(f, {"get_weather", "search"}, true));
    EXPECT_TRUE(any.accepts(text)) << f.name << "\n" << text;
    EXPECT_TRUE(any.accepts(compact)) << f.name << "\n" << compact;
    // one call, and a named function
    const std::string one = canonical(f, {kCalls[0]});
    EXPECT_TRUE(Compiled(gbnf(f, {"get_weather", "search"}, false)).accepts(one)) << f.name;
    const Compiled named(gbnf(f, {"get_weather"}, false));
    EXPECT_TRUE(named.accepts(one)) << f.name;
    EXPECT_TRUE(!f.parallel || !named.accepts(text)) << f.name;
  }
}

TEST(ToolFormats, TheGrammarRefusesMalformedCalls) {
  for (const ToolFormat& f : tpl::tool_formats()) {
    const Compiled g(gbnf(f, {"get_weather", "search"}, true));
    const std::string ok = canonical(f, {kCalls[0]});
    ASSERT_TRUE(g.accepts(ok)) << f.name;
    EXPECT_FALSE(g.accepts(canonical(f, {{"get_wether", kCalls[0].args}}))) << f.name;
    EXPECT_FALSE(g.accepts(canonical(f, {{"get_weather", {{"city", "Paris"}, {"days", "two"}}}}))) << f.name;
    EXPECT_FALSE(g.accepts(canonical(f, {{"get_weather", {{"days", 3}}}}))) << f.name;  // no city
    EXPECT_FALSE(g.accepts(canonical(f, {{"get_weather", {{"city", "Lima"}, {"days", 40}}}}))) << f.name;  // > maximum
    EXPECT_FALSE(g.accepts("Sure. " + ok)) << f.name;
    EXPECT_FALSE(g.accepts(ok.substr(0, ok.size() - 1))) << f.name;
    EXPECT_FALSE(Compiled(gbnf(f, {"search"}, true)).accepts(ok)) << f.name;  // not the named one
  }
}

// Calls sampled under the grammar (random choices over single bytes and the format's literals as tokens) parse
// into calls of an allowed function whose arguments the schema accepts.
TEST(ToolFormats, RandomCallsUnderTheGrammarParseAndValidate) {
  std::map<std::string, std::string> schema_gbnf;
  for (const ojson& t : kTools) {
    auto g = grammar::json_schema_to_gbnf(t["function"]["parameters"]);
    ASSERT_TRUE(g);
    schema_gbnf[t["function"]["name"].get<std::string>()] = *g;
  }
  std::mt19937_64 rng(7);
  for (const ToolFormat& f : tpl::tool_formats()) {
    grammar::Vocabulary voc;
    for (int b = 0; b < 256; ++b) voc.tokens.push_back(std::string(1, static_cast<char>(b)));
    for (const std::string& l : f.literals()) voc.tokens.push_back(l);  // a format's markers as whole tokens
    voc.tokens.push_back("");
    voc.eog_ids = {static_cast<int32_t>(voc.tokens.size() - 1)};
    const auto vocab = grammar::VocabIndex::build(std::move(voc));
    for (const bool parallel : {true, false}) {
      const std::vector<std::string> names = parallel ? std::vector<std::string>{"get_weather", "search"}
                                                      : std::vector<std::string>{"search"};
      const auto cg = grammar::test::compile(gbnf(f, names, parallel), vocab);
      ASSERT_TRUE(cg) << f.name;
      for (int round = 0; round < 3; ++round) {
        const grammar::test::Sample s = grammar::test::sample(cg, rng, 12 + 20 * round);
        ASSERT_EQ(s.error, "") << f.name;
        ASSERT_TRUE(s.complete) << f.name;
        const auto calls = parse(f, s.text);
        ASSERT_FALSE(calls.empty()) << f.name << ": " << s.text;
        EXPECT_TRUE(parallel || calls.size() == 1u) << f.name << ": " << s.text;
        for (const auto& c : calls) {
          EXPECT_TRUE(std::find(names.begin(), names.end(), c.name) != names.end()) << f.name << ": " << c.name;
          // The schema grammar is the validator: it wants the schema's key order (Gemma writes keys sorted) and DEL
          // escaped (JSON allows it raw).
          const ojson parsed = ojson::parse(c.arguments);
          ojson ordered = ojson::object();
          for (const ojson& t : kTools)
            if (t["function"]["name"] == c.name)
              for (auto it = t["function"]["parameters"]["properties"].begin();
                   it != t["function"]["parameters"]["properties"].end(); ++it)
                if (parsed.contains(it.key())) ordered[it.key()] = parsed[it.key()];
          for (auto it = parsed.begin(); it != parsed.end(); ++it)  // keys beyond the declared ones come after
            if (!ordered.contains(it.key())) ordered[it.key()] = it.value();
          std::string args = ordered.dump();
          for (size_t at = args.find('\x7f'); at != std::string::npos; at = args.find('\x7f', at)) args.replace(at, 1, "\\u007f");
          EXPECT_TRUE(grammar::test::matches(schema_gbnf[c.name], args))
              << f.name << ": " << c.arguments << "\nfrom: " << s.text;
        }
      }
    }
  }
}

// tool_choice "auto": each format's trigger (the table's, where a lazy grammar takes over) opens its canonical calls
// and is a prefix the grammar accepts, so the constrained part continues it; ambiguous openings have none.
TEST(ToolFormats, TriggersOpenTheCallsAndTheGrammarContinuesThem) {
  const std::map<std::string, std::string> kWant = {
      {"hermes", "<tool_call>"},          {"qwen3-coder", "<tool_call>"},     {"mistral", "[TOOL_CALLS]["},
      {"mistral-args", "[TOOL_CALLS]"},   {"llama3", "{\"name\""},          {"functionary-v3.1", "<function="},
      {"firefunction-v2", "functools["},  {"command-r7b", "<|START_ACTION|>["}, {"gemma4", "<|tool_call>call:"},
      {"command-r-plus", ""},             {"gigachat3", ""},                  {"functionary-v3.2", ""},
      {"muse-glimmer", ""}};
  for (const auto& [name, trigger] : kWant) {
    const ToolFormat* f = tpl::tool_format_by_name(name);
    ASSERT_TRUE(f) << name;
    EXPECT_EQ(f->trigger, trigger) << name;
  }
  for (const ToolFormat& f : tpl::tool_formats()) {
    if (f.trigger.empty()) {
      EXPECT_TRUE(kWant.count(f.name)) << f.name << ": no trigger, not listed as ambiguous";
      continue;
    }
    const std::string text = canonical(f, {kCalls[0]});
    const size_t at = text.find_first_not_of(" \n");
    EXPECT_EQ(text.compare(at, f.trigger.size(), f.trigger), 0) << f.name << ": " << text;
    const Compiled g(gbnf(f, {"get_weather", "search"}, true));
    ASSERT_TRUE(g.cg) << f.name;
    grammar::Matcher m(g.cg);
    EXPECT_TRUE(m.accept_bytes(f.trigger).is_ok()) << f.name;
    EXPECT_TRUE(m.accept_bytes(text.substr(at + f.trigger.size())).is_ok() && m.is_complete()) << f.name;
  }
}

TEST(ToolFormats, ReasoningAndOpenedCalls) {
  const ToolFormat* hermes = tpl::tool_format_by_name("hermes");
  ToolGrammarRequest rq;
  rq.names = {"get_weather"};
  rq.think_begin = "<think>";
  rq.think_end = "</think>";
  auto g = tool_call_gbnf(*hermes, kTools, rq);
  ASSERT_TRUE(g);
  const std::string call = canonical(*hermes, {kCalls[0]});
  EXPECT_TRUE(grammar::test::matches(*g, call));
  EXPECT_TRUE(grammar::test::matches(*g, "<think>\nplan: </thin> ok\n</think>\n\n" + call));
  EXPECT_FALSE(grammar::test::matches(*g, "<think>a</think>b</think>\n" + call));
  rq.opened_reasoning = true;
  g = tool_call_gbnf(*hermes, kTools, rq);
  ASSERT_TRUE(g);
  EXPECT_TRUE(grammar::test::matches(*g, "plan</think>\n" + call));
  EXPECT_FALSE(grammar::test::matches(*g, call));
  // functionary v3.2: the generation prompt wrote ">>>": the reply starts at the function name
  const ToolFormat* fv = tpl::tool_format_by_name("functionary-v3.2");
  ToolGrammarRequest r2;
  r2.names = {"get_weather"};
  r2.opened_tool_call = true;
  g = tool_call_gbnf(*fv, kTools, r2);
  ASSERT_TRUE(g);
  const std::string two = canonical(*fv, kCalls);
  EXPECT_TRUE(grammar::test::matches(*g, two.substr(3)));
  EXPECT_FALSE(grammar::test::matches(*g, two));
  expect_calls(parse(*fv, two.substr(3), /*opened=*/true), kCalls, "functionary opened");
}

// A prompt that ends with the opener less its trailing whitespace (a prefill "<tool_call>" where the opener is
// "<tool_call>\n") opened the call too: the first call may write that whitespace or leave it out, and the parser
// reads the reply as the continuation of the prompt's part. Every format whose opener ends in whitespace; the exact
// opener stays as it was (the first call starts after it, a repeated newline is refused).
TEST(ToolFormats, CallsOpenedWithoutTheOpenersTrailingWhitespace) {
  int n_formats = 0;
  for (const ToolFormat& f : tpl::tool_formats()) {
    const std::string& op = f.opener();
    const size_t core = op.find_last_not_of(" \n\t\r") + 1;
    if (f.at_start || core == 0 || core == op.size()) continue;
    ++n_formats;
    const std::string tail = op.substr(core), text = canonical(f, calls_for(f));
    ASSERT_EQ(text.compare(0, op.size(), op), 0) << f.name << ": " << text;
    const std::string reply = text.substr(core);       // starts with the opener's tail
    const std::string bare = text.substr(op.size());   // the model left the tail out
    ToolGrammarRequest rq;
    rq.names = {"get_weather"};
    rq.opened_tool_call = true;
    rq.opener_tail = tail;
    auto g = tool_call_gbnf(f, kTools, rq);
    ASSERT_TRUE(g) << f.name << ": " << g.status().message();
    EXPECT_TRUE(grammar::test::matches(*g, reply)) << f.name << ": " << reply;
    EXPECT_TRUE(grammar::test::matches(*g, bare)) << f.name << ": " << bare;
    EXPECT_FALSE(grammar::test::matches(*g, text)) << f.name << ": the opener again";
    expect_calls(parse(f, reply, true, tail), calls_for(f), f.name + " opened, tail written");
    expect_calls(parse(f, bare, true, tail), calls_for(f), f.name + " opened, tail left out");
    std::string content = reply;
    std::vector<tpl::ToolCall> calls;
    tpl::parse_tool_calls(f, &content, &calls, kTools, true, tail);
    EXPECT_EQ(content, "") << f.name;
    // Not opened: the first call, which has no opener in the reply, is not read.
    EXPECT_LT(parse(f, reply).size(), calls_for(f).size()) << f.name;
    // The exact opener: the reply starts after it, as before.
    rq.opener_tail.clear();
    g = tool_call_gbnf(f, kTools, rq);
    ASSERT_TRUE(g) << f.name;
    EXPECT_TRUE(grammar::test::matches(*g, bare)) << f.name << ": " << bare;
    expect_calls(parse(f, bare, true), calls_for(f), f.name + " opened exactly");
  }
  EXPECT_GE(n_formats, 10);  // hermes, minimax-m1, command-r-plus, deepseek-v3.2, ...
  // Hermes: the exact opener's call does not take a second newline; with the tail left out it takes one.
  const ToolFormat* hermes = tpl::tool_format_by_name("hermes");
  const std::string call = canonical(*hermes, {kCalls[0]}).substr(std::string("<tool_call>\n").size());
  ToolGrammarRequest rq;
  rq.names = {"get_weather"};
  rq.opened_tool_call = true;
  EXPECT_FALSE(grammar::test::matches(*tool_call_gbnf(*hermes, kTools, rq), "\n" + call));
  rq.opener_tail = "\n";
  EXPECT_TRUE(grammar::test::matches(*tool_call_gbnf(*hermes, kTools, rq), "\n" + call));
  EXPECT_FALSE(grammar::test::matches(*tool_call_gbnf(*hermes, kTools, rq), "\n\n" + call));
  // A reply that is no call stays the content as written.
  std::string prose = "\nI cannot call that.";
  std::vector<tpl::ToolCall> none;
  tpl::parse_tool_calls(*hermes, &prose, &none, kTools, true, "\n");
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(prose, "\nI cannot call that.");
}

TEST(ToolFormats, UnenforceableSchemasAndUnknownFunctionsAreErrors) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}}}}])");
  ToolGrammarRequest rq;
  rq.names = {"f"};
  auto g = tool_call_gbnf(*tpl::tool_format_by_name("qwen3-coder"), tools, rq);
  ASSERT_FALSE(g);
  EXPECT_EQ(g.status().message().rfind("tools[0].function.parameters: /properties/s/pattern", 0), 0u)
      << g.status().message();
  // the JSON formats enforce it
  EXPECT_TRUE(tool_call_gbnf(*tpl::tool_format_by_name("hermes"), tools, rq));
  rq.names = {"nope"};
  g = tool_call_gbnf(*tpl::tool_format_by_name("hermes"), tools, rq);
  ASSERT_FALSE(g);
  EXPECT_EQ(g.status().message().rfind("tool_choice: ", 0), 0u) << g.status().message();
}

TEST(ToolFormats, RawValuesTakeTheirTypeFromTheSchemaOrTheFormat) {
  const ToolFormat& q = *tpl::tool_format_by_name("qwen3-coder");
  // "123" is a string where the schema says so, a number where it says integer
  const std::string t = "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n"
                        "3\n</parameter>\n</function>\n</tool_call>";
  auto calls = parse(q, t);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(ojson::parse(calls[0].arguments), ojson::parse(R"({"city": "123", "days": 3})"));
  // DSML says it in the text
  const ToolFormat& d = *tpl::tool_format_by_name("deepseek-v3.2");
  calls = parse(d, "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"x\">\n<｜DSML｜parameter name=\"a\" string=\"true\">"
                   "[1]</｜DSML｜parameter>\n<｜DSML｜parameter name=\"b\" string=\"false\">[1]</｜DSML｜parameter>\n"
                   "</｜DSML｜invoke>\n</｜DSML｜function_calls>");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(ojson::parse(calls[0].arguments), ojson::parse(R"({"a": "[1]", "b": [1]})"));
  // MiniCPM's CDATA, Python literals, Gemma's quotes
  calls = parse(*tpl::tool_format_by_name("minicpm5"),
                "<function name=\"search\"><param name=\"query\"><![CDATA[a < b & c]]></param></function>");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(ojson::parse(calls[0].arguments), ojson::parse(R"({"query": "a < b & c"})"));
  calls = parse(*tpl::tool_format_by_name("lfm2"),
                "<|tool_call_start|>[search(query='it\\'s', exact=True), f(x=[1, None], y={'k': 2.5})]<|tool_call_end|>");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(ojson::parse(calls[0].arguments), ojson::parse(R"({"query": "it's", "exact": true})"));
  EXPECT_EQ(ojson::parse(calls[1].arguments), ojson::parse(R"({"x": [1, null], "y": {"k": 2.5}})"));
  calls = parse(*tpl::tool_format_by_name("gemma4"),
                "<|tool_call>call:f{a:<|\"|>x, y<|\"|>,b:{c:[1,true]}}<tool_call|>");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(ojson::parse(calls[0].arguments), ojson::parse(R"({"a": "x, y", "b": {"c": [1, true]}})"));
}

TEST(ToolFormats, MalformedCallsStayContentAndIdsAreFresh) {
  const ToolFormat& h = *tpl::tool_format_by_name("hermes");
  std::string text = "a <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}\n</tool_call> b";  // unbalanced
  std::vector<tpl::ToolCall> calls;
  tpl::parse_tool_calls(h, &text, &calls);
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(text, "a <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}\n</tool_call> b");
  // ids: fresh per call, in the format's style (Mistral: 9 letters and digits)
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i)
    for (const auto& c : parse(h, canonical(h, kCalls))) {
      EXPECT_EQ(c.id.rfind("call_", 0), 0u);
      EXPECT_TRUE(ids.insert(c.id).second) << c.id;
    }
  const auto m = parse(*tpl::tool_format_by_name("mistral-args"), "[TOOL_CALLS]f[ARGS]{}");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].id.size(), 9u);
  EXPECT_EQ(m[0].id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"), std::string::npos);
  // ids the model writes are kept
  const auto s = parse(*tpl::tool_format_by_name("mistral-call-id"), "[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{}");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].id, "a1B2c3D4e");
}

// gpt-oss's harmony format: a reply is headed messages after the generation prompt's "<|start|>assistant".
// Analysis messages are reasoning, final (and commentary preambles) content, a commentary message to
// functions.NAME a call, its recipient in the channel header (the model's form) or in the role header (the
// template's); header texts never reach the content, a malformed call stays there verbatim.
TEST(ToolFormats, HarmonyRepliesSplitIntoReasoningContentAndCalls) {
  const std::string src = test::slurp(test::data_path("templates/openai-gpt-oss-120b.jinja"));
  tpl::ReplyOptions o = tpl::reply_options_for_template(src);
  ASSERT_NE(o.tool_format, nullptr);
  EXPECT_EQ(o.tool_format->name, "harmony");
  EXPECT_EQ(o.think_begin, "<|channel|>analysis<|message|>");
  o.tools = kTools;
  const std::string think = "<|channel|>analysis<|message|>The user wants weather.<|end|>";
  const std::string call1 = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                            "{\"city\": \"Paris\", \"days\": 2}";
  const std::string call2 = " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Lima\", \"days\": 1}";
  // reasoning and the answer
  tpl::ParsedReply r = tpl::parse_reply(think + "<|start|>assistant<|channel|>final<|message|>It is sunny.", o);
  EXPECT_EQ(r.reasoning_content, "The user wants weather.");
  EXPECT_EQ(r.content, "It is sunny.");
  EXPECT_TRUE(r.tool_calls.empty());
  // two analysis messages, a preamble and the answer (ended by <|return|> where it is shown)
  r = tpl::parse_reply(think + "<|start|>assistant<|channel|>analysis<|message|>More.<|end|><|start|>assistant"
                               "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final"
                               "<|message|>Done.<|return|>", o);
  EXPECT_EQ(r.reasoning_content, "The user wants weather.\n\nMore.");
  EXPECT_EQ(r.content, "Let me look.\n\nDone.");
  // one call after reasoning, either header order, <|call|> shown or not
  for (const std::string& c : {call1, call1 + "<|call|>"}) {
    r = tpl::parse_reply(think + "<|start|>assistant" + c, o);
    EXPECT_EQ(r.reasoning_content, "The user wants weather.");
    EXPECT_EQ(r.content, "");
    expect_calls(r.tool_calls, {kCalls[0]}, c);
  }
  r = tpl::parse_reply("<|channel|>commentaryto=functions.get_weather<|constrain|>json<|message|>{\"city\": \"Paris\", "
                       "\"days\": 2}", o);  // the header's whitespace left out, as the grammar allows
  expect_calls(r.tool_calls, {kCalls[0]}, "compact");
  r = tpl::parse_reply(call2 + "<|call|>", o);
  expect_calls(r.tool_calls, {kCalls[1]}, call2);
  EXPECT_EQ(r.content, "");
  // two calls; parallel_tool_calls false keeps the first
  r = tpl::parse_reply(think + "<|start|>assistant" + call1 + "<|call|><|start|>assistant" + call2, o);
  expect_calls(r.tool_calls, kCalls, "two calls");
  EXPECT_EQ(r.content, "");
  expect_calls(parse(*o.tool_format, call1 + "<|call|><|start|>assistant" + call1), {kCalls[0], kCalls[0]}, "table");
  o.parallel_tool_calls = false;
  r = tpl::parse_reply(call1 + "<|call|><|start|>assistant" + call2, o);
  expect_calls(r.tool_calls, {kCalls[0]}, "parallel false");
  o.parallel_tool_calls = true;
  // malformed: unbalanced arguments, text that is no message: content, never a failure
  const std::string bad = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":";
  r = tpl::parse_reply(think + "<|start|>assistant" + bad, o);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, bad);
  EXPECT_EQ(r.reasoning_content, "The user wants weather.");
  // a builtin tool's message (browser.*, python: not a client function) is dropped, in either header order, with
  // the messages around it kept; also without tools
  for (const std::string& b : {std::string("<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}"),
                               std::string(" to=python<|channel|>analysis code<|message|>print(1)<|call|>")}) {
    r = tpl::parse_reply(think + "<|start|>assistant" + b, o);
    EXPECT_TRUE(r.tool_calls.empty()) << b;
    EXPECT_EQ(r.content, "") << b;
    EXPECT_EQ(r.reasoning_content, "The user wants weather.") << b;
    r = tpl::parse_reply(b + "<|start|>assistant<|channel|>final<|message|>Done.", o);
    EXPECT_EQ(r.content, "Done.") << b;
    const tpl::ToolFormat* keep = o.tool_format;
    o.tool_format = nullptr;
    r = tpl::parse_reply(b, o);
    EXPECT_EQ(r.content, "") << b;
    o.tool_format = keep;
  }
  r = tpl::parse_reply("Hello there.", o);
  EXPECT_EQ(r.content, "Hello there.");
  EXPECT_EQ(r.reasoning_content, "");
  // cut off while thinking: all reasoning
  r = tpl::parse_reply("<|channel|>analysis<|message|>Hmm, the", o);
  EXPECT_EQ(r.reasoning_content, "Hmm, the");
  EXPECT_EQ(r.content, "");
  // without tools (no format) a call message stays content
  o.tool_format = nullptr;
  r = tpl::parse_reply(think + "<|start|>assistant" + call1, o);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, call1);
}

// The forced call's grammar: an analysis message may come first and must then start the next message; the call is
// the model's header form with arguments valid against the schema.
TEST(ToolFormats, HarmonyGrammarWritesTheCommentaryHeader) {
  const ToolFormat& f = *tpl::tool_format_by_name("harmony");
  ToolGrammarRequest rq;
  rq.names = {"get_weather", "search"};
  rq.parallel = false;
  rq.think_begin = "<|channel|>analysis<|message|>";
  rq.think_end = "<|end|>";
  rq.think_after = "<|start|>assistant";
  auto g = tool_call_gbnf(f, kTools, rq);
  ASSERT_TRUE(g) << g.status().message();
  const Compiled c(*g);
  const std::string call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
  EXPECT_TRUE(c.accepts(call));
  EXPECT_TRUE(c.accepts("<|channel|>analysis<|message|>plan <|en d|><|end|><|start|>assistant" + call));
  EXPECT_TRUE(c.accepts("<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"query\": \"kiln\"}"));
  EXPECT_FALSE(c.accepts("<|channel|>analysis<|message|>plan<|end|>" + call));  // no next message
  EXPECT_FALSE(c.accepts("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                         "{\"city\": \"Paris\", \"days\": \"two\"}"));
  EXPECT_FALSE(c.accepts("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}"));
  EXPECT_FALSE(c.accepts("<|channel|>final<|message|>Sunny."));
  EXPECT_FALSE(c.accepts(call + "<|call|><|start|>assistant" + call));  // one call
  // what the grammar writes, the reply parser reads
  tpl::ReplyOptions o = tpl::reply_options_for_template(test::slurp(test::data_path("templates/openai-gpt-oss-120b.jinja")));
  const auto r = tpl::parse_reply("<|channel|>analysis<|message|>plan<|end|><|start|>assistant" + call, o);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.reasoning_content, "plan");
}

// A vocabulary where a format's markers are control tokens (as Mistral's [TOOL_CALLS] and [ARGS] are, and most
// families' markers): a request with tools shows them as text, the forced call's grammar may write each as its one
// token, and the parser then reads them.
TEST(ToolFormats, ControlTokenMarkersAreShownAsTextAndWritable) {
  const std::string path = test::temp_dir() + "kiln_toolmarkers_" + std::to_string(::getpid()) + ".gguf";
  {
    auto src = gguf::File::open(test::data_path("models/fixture-llama-f16.gguf"));
    ASSERT_TRUE(src) << src.status().to_string();
    gguf::Writer w;
    for (const auto& kv : src->kvs()) {
      gguf::Value v = kv.value;
      if (kv.key == "tokenizer.ggml.tokens") {
        auto& a = std::get<gguf::Array>(v.v);
        a.items[990] = std::string("[TOOL_CALLS]");
        a.items[991] = std::string("[ARGS]");
      } else if (kv.key == "tokenizer.ggml.token_type") {
        auto& a = std::get<gguf::Array>(v.v);
        a.items[990] = int32_t{3};  // control
        a.items[991] = int32_t{3};
      }
      w.set(kv.key, v);
    }
    ASSERT_TRUE(w.write(path).is_ok());
  }
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file) << file.status().to_string();
  auto tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  const Tokenizer& t = **tok;
  ASSERT_EQ(t.token_to_piece(990, false), "");  // a control token: no text in an ordinary reply
  ChatPromptOptions o;
  o.template_source = "{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}"
                      "{# the model calls tools as [TOOL_CALLS]name[ARGS]{...} #}";
  auto cp = ChatPrompt::create(t, o);
  ASSERT_TRUE(cp) << cp.status().to_string();
  ASSERT_NE(cp->tool_format(), nullptr);
  EXPECT_EQ(cp->tool_format()->name, "mistral-args");
  const std::vector<int32_t> ids = cp->tool_marker_tokens();
  EXPECT_EQ(ids, (std::vector<int32_t>{990, 991}));
  StreamDecoder dec(t);
  dec.render_as_text(ids);
  const std::string open = dec.push(990), args = dec.push(991);
  EXPECT_EQ(open, "[TOOL_CALLS]");
  EXPECT_EQ(args, "[ARGS]");
  // The grammar: over the ordinary vocabulary the marker can only be spelled in pieces; with the text tokens it
  // is also the one token, and a call written with both tokens is complete.
  ToolGrammarRequest rq;
  rq.names = {"search"};
  auto g = tool_call_gbnf(*cp->tool_format(), kTools, rq);
  ASSERT_TRUE(g) << g.status().message();
  GrammarCache cache(t);
  auto plain = cache.get(*g), marked = cache.get(*g, ids);
  ASSERT_TRUE(plain && marked);
  grammar::Matcher m0(*plain), m(*marked);
  EXPECT_FALSE(m0.can_accept(990));
  ASSERT_TRUE(m.can_accept(990));
  ASSERT_TRUE(m.accept_token(990).is_ok());
  ASSERT_TRUE(m.accept_bytes("search").is_ok());
  ASSERT_TRUE(m.can_accept(991));
  ASSERT_TRUE(m.accept_token(991).is_ok());
  ASSERT_TRUE(m.accept_bytes(R"({"query": "kiln"})").is_ok());
  EXPECT_TRUE(m.is_complete());
  // the reply as the request shows it parses
  const auto calls = cp->parse_reply(open + "search" + args + "{\"query\": \"kiln\"}", /*want_tools=*/true);
  ASSERT_EQ(calls.tool_calls.size(), 1u);
  EXPECT_EQ(calls.tool_calls[0].name, "search");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
