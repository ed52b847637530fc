// The table of tool-call formats (tool_formats.h): one entry per way of writing calls, in detection order (the
// first entry whose markers the template source holds wins, so the more specific formats come first). Each
// pattern is the text the family's template renders for an assistant turn with tool calls (checked against every
// template of the fixture collection by tests/unit/test_tool_formats.cpp).
#include "template/tool_formats.h"

#include <mutex>
#include <random>

namespace kiln::tpl {

namespace {

using V = ValueSyntax;

// A table row as written below; compiled into a ToolFormat (patterns parsed) once.
struct Spec {
  const char* name;
  const char* families;
  std::vector<std::vector<std::string>> markers;
  std::vector<std::string> unless = {};
  const char* section = "";
  const char* call = "";
  const char* param = "";
  const char* call_sep = "";
  const char* param_sep = "";
  ValueSyntax values = V::kRaw;
  bool sorted_keys = false;
  JsonShape json = {};
  CallIds ids = CallIds::kOpenAI;
  bool parallel = true;
  bool at_start = false;
  const char* lead = "";
  const char* content_marker = "";
  const char* trigger = nullptr;  // null: the opener's first run of non-whitespace; "": none (ambiguous)
};

const Spec kSpecs[] = {
    // ---- Mistral: [TOOL_CALLS] in three generations
    {.name = "mistral-call-id",
     .families = "Mistral Small 3.2, Magistral Small 2506",
     .markers = {{"[TOOL_CALLS]", "[CALL_ID]"}},
     .call = "[TOOL_CALLS]${NAME}[CALL_ID]${ID}[ARGS]${ARGS}",
     .ids = CallIds::kMistral},
    {.name = "mistral-args",
     .families = "Ministral 3, Devstral Small 2507, Magistral",
     .markers = {{"[TOOL_CALLS]", "[ARGS]"}},
     .call = "[TOOL_CALLS]${NAME}[ARGS]${ARGS}",
     .ids = CallIds::kMistral},
    {.name = "mistral",
     .families = "Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo",
     .markers = {{"[TOOL_CALLS]"}},
     .section = "[TOOL_CALLS][${CALLS}]",
     .call = "${JSON}",
     .call_sep = ", ",
     .json = {.id_key = "id"},
     .ids = CallIds::kMistral},
    // ---- XML-like parameters
    {.name = "seed-oss",
     .families = "ByteDance Seed-OSS",
     .markers = {{"<seed:tool_call>"}},
     .call = "<seed:tool_call>\n<function=${NAME}>\n${PARAMS}</function>\n</seed:tool_call>",
     .param = "<parameter=${KEY}>${VALUE}</parameter>\n",
     .call_sep = "\n"},
    {.name = "hy3",
     .families = "Tencent Hy3",
     .markers = {{"':opensource'", "<tool_call{}>"}},
     .section = "<tool_calls:opensource>\n${CALLS}</tool_calls:opensource>",
     .call = "<tool_call:opensource>${NAME}<tool_sep:opensource>\n${PARAMS}</tool_call:opensource>\n",
     .param = "<arg_key:opensource>${KEY}</arg_key:opensource>\n"
              "<arg_value:opensource>${VALUE}</arg_value:opensource>\n"},
    {.name = "glm",
     .families = "GLM 4.5 / 4.6, Ling 3.0, Spark 2.5, Laguna",
     .markers = {{"<tool_call>", "<arg_key>"}},
     .call = "<tool_call>${NAME}\n${PARAMS}</tool_call>",
     .param = "<arg_key>${KEY}</arg_key>\n<arg_value>${VALUE}</arg_value>\n",
     .call_sep = "\n"},
    {.name = "qwen3-coder",
     .families = "Qwen3-Coder, Nemotron 3 Nano, Step 3.5 Flash",
     .markers = {{"<tool_call>", "<function=", "<parameter="}},
     .call = "<tool_call>\n<function=${NAME}>\n${PARAMS}</function>\n</tool_call>",
     .param = "<parameter=${KEY}>\n${VALUE}\n</parameter>\n",
     .call_sep = "\n"},
    {.name = "deepseek-v3.2",
     .families = "DeepSeek V3.2 (DSML)",
     .markers = {{"DSML", "function_calls>"}},
     .section = "<｜DSML｜function_calls>\n${CALLS}</｜DSML｜function_calls>",
     .call = "<｜DSML｜invoke name=\"${NAME}\">\n${PARAMS}</｜DSML｜invoke>\n",
     .param = "<｜DSML｜parameter name=\"${KEY}\" string=\"${ISSTR}\">${VALUE}</｜DSML｜parameter>\n"},
    {.name = "deepseek-v4",
     .families = "DeepSeek V4 (DSML)",
     .markers = {{"DSML", "tool_calls>"}},
     .section = "<｜DSML｜tool_calls>\n${CALLS}</｜DSML｜tool_calls>",
     .call = "<｜DSML｜invoke name=\"${NAME}\">\n${PARAMS}</｜DSML｜invoke>\n",
     .param = "<｜DSML｜parameter name=\"${KEY}\" string=\"${ISSTR}\">${VALUE}</｜DSML｜parameter>\n"},
    {.name = "minimax-m2",
     .families = "MiniMax M2",
     .markers = {{"<minimax:tool_call>"}},
     .section = "<minimax:tool_call>\n${CALLS}</minimax:tool_call>",
     .call = "<invoke name=\"${NAME}\">\n${PARAMS}</invoke>\n",
     .param = "<parameter name=\"${KEY}\">${VALUE}</parameter>\n"},
    {.name = "minimax-m3",
     .families = "MiniMax M3",
     .markers = {{"]<]minimax[>[", "<invoke name="}},
     .section = "]<]minimax[>[<tool_call>\n${CALLS}]<]minimax[>[</tool_call>",
     .call = "]<]minimax[>[<invoke name=\"${NAME}\">${PARAMS}]<]minimax[>[</invoke>\n",
     .param = "]<]minimax[>[<${KEY}>${VALUE}]<]minimax[>[</${KEY}>"},
    {.name = "harmony",
     .families = "gpt-oss (OpenAI's harmony format)",
     .markers = {{"<|channel|>", "<|message|>", "to=functions."}, {"<|channel|>", "<|message|>", "\"functions.\""}},
     // The model's own form: the recipient in the channel header. The template renders earlier calls with it in the
     // role header (" to=functions.NAME<|channel|>commentary json<|message|>"); parse_reply reads both (reply.cpp).
     // <|call|> ends generation, so a reply holds one call.
     .call = "<|channel|>commentary to=functions.${NAME} <|constrain|>json<|message|>${ARGS}",
     .call_sep = "<|call|><|start|>assistant",
     .parallel = false,
     .trigger = "<|channel|>commentary to="},  // "<|channel|>commentary" alone opens a preamble too
    {.name = "muse-glimmer",
     .families = "Muse Glimmer (ATEM)",
     .markers = {{"<atem:function_calls>"}},
     .call = " to=${NAME}<|message|><atem:function_calls>\n<atem:invoke name=\"${NAME}\">\n${PARAMS}"
             "</atem:invoke>\n</atem:function_calls>",
     .param = "<atem:parameter name=\"${KEY}\">${VALUE}</atem:parameter>\n",
     .parallel = false,
     .trigger = ""},  // " to=": prose writes it
    {.name = "minicpm5",
     .families = "MiniCPM 5",
     .markers = {{"<function name=\"", "<param name=\""}},
     .call = "<function name=\"${NAME}\">${PARAMS}</function>",
     .param = "<param name=\"${KEY}\">${VALUE}</param>",
     .call_sep = "\n"},
    {.name = "kimi-k3",
     .families = "Kimi K3",
     .markers = {{"<|open|>", "'argument'"}},
     .section = "<|open|>tools<|sep|>${CALLS}<|close|>tools<|sep|>",
     .call = "<|open|>call tool=\"${NAME}\" index=\"${INDEX1}\"<|sep|>${PARAMS}<|close|>call<|sep|>",
     .param = "<|open|>argument key=\"${KEY}\" type=\"${TYPE}\"<|sep|>${VALUE}<|close|>argument<|sep|>"},
    // ---- a name, then the arguments as one JSON object
    {.name = "deepseek-v3.1",
     .families = "DeepSeek V3.1",
     .markers = {{"<｜tool▁call▁begin｜>", "['name'] + '<｜tool▁sep｜>'"}},
     .section = "<｜tool▁calls▁begin｜>${CALLS}<｜tool▁calls▁end｜>",
     .call = "<｜tool▁call▁begin｜>${NAME}<｜tool▁sep｜>${ARGS}<｜tool▁call▁end｜>"},
    {.name = "deepseek-r1",
     .families = "DeepSeek R1 and its distills",
     .markers = {{"<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"}},
     .section = "<｜tool▁calls▁begin｜>${CALLS}<｜tool▁calls▁end｜>",
     .call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>${NAME}\n"
             "```json\n${ARGS}\n```<｜tool▁call▁end｜>",
     .call_sep = "\n"},
    {.name = "kimi-k2",
     .families = "Kimi K2, Kimi K2 Thinking",
     .markers = {{"<|tool_calls_section_begin|>"}},
     .section = "<|tool_calls_section_begin|>${CALLS}<|tool_calls_section_end|>",
     .call = "<|tool_call_begin|>functions.${NAME}:${INDEX}<|tool_call_argument_begin|>${ARGS}<|tool_call_end|>"},
    {.name = "solar-open",
     .families = "Solar Open",
     .markers = {{"<|tool_call:begin|>"}},
     .section = "<|tool_calls|>${CALLS}<|calls|>",
     .call = "<|tool_call:begin|>${ID}<|tool_call:name|>${NAME}<|tool_call:args|>${ARGS}<|tool_call:end|>",
     .ids = CallIds::kSolar},
    {.name = "functionary-v3.2",
     .families = "functionary v3.2",
     .markers = {{">>>", "<|start_header_id|>"}},
     .call = ">>>${NAME}\n${ARGS}",
     .content_marker = ">>>all\n",
     .trigger = ""},  // ">>>" opens plain content too (">>>all")
    {.name = "functionary-v3.1",
     .families = "functionary v3.1 (Llama 3.1)",
     .markers = {{"<function=", "<|start_header_id|>"}},
     .call = "<function=${NAME}>${ARGS}</function>"},
    // ---- Python calls, Gemma's own syntax
    {.name = "lfm2",
     .families = "LFM2, LFM2.5",
     .markers = {{"<|tool_call_start|>"}, {"<|tool_list_start|>"}},
     .section = "<|tool_call_start|>[${CALLS}]<|tool_call_end|>",
     .call = "${NAME}(${PARAMS})",
     .param = "${KEY}=${VALUE}",
     .call_sep = ", ",
     .param_sep = ", ",
     .values = V::kPython},
    {.name = "gemma4",
     .families = "Gemma 4",
     .markers = {{"<|tool_call>call:"}},
     .call = "<|tool_call>call:${NAME}{${PARAMS}}<tool_call|>",
     .param = "${KEY}:${VALUE}",
     .param_sep = ",",
     .values = V::kGemma,
     .sorted_keys = true},
    // ---- whole calls as JSON objects
    {.name = "apertus",
     .families = "Apertus",
     .markers = {{"<|tools_prefix|>"}},
     .section = "<|tools_prefix|>[${CALLS}]<|tools_suffix|>",
     .call = "${JSON}",
     .call_sep = ", ",
     .json = {.name_is_key = true}},
    {.name = "command-r7b",
     .families = "Command R7B, Command A (Cohere 2)",
     .markers = {{"<|START_ACTION|>"}},
     .section = "<|START_ACTION|>[\n    ${CALLS}\n]<|END_ACTION|>",
     .call = "${JSON}",
     .call_sep = ",\n    ",
     .json = {.name_key = "tool_name", .args_key = "parameters", .counter_key = "tool_call_id"}},
    {.name = "command-r-plus",
     .families = "Command R, Command R+",
     .markers = {{"Action:", "```json"}},
     .section = "Action:\n```json\n[\n    ${CALLS}\n]\n```",
     .call = "${JSON}",
     .call_sep = ",\n    ",
     .json = {.name_key = "tool_name", .args_key = "parameters"},
     .trigger = ""},  // "Action:": prose writes it
    {.name = "granite-3",
     .families = "Granite 3.x",
     .markers = {{"<|tool_call|>"}},
     .section = "<|tool_call|>[${CALLS}]",
     .call = "${JSON}",
     .call_sep = ", "},
    {.name = "nemotron-v2",
     .families = "Nemotron Nano v2",
     .markers = {{"<TOOLCALL>"}},
     .section = "<TOOLCALL>[${CALLS}]</TOOLCALL>",
     .call = "${JSON}",
     .call_sep = ", "},
    {.name = "apriel",
     .families = "Apriel 1.5 / 1.6",
     .markers = {{"<tool_calls>["}},
     .section = "<tool_calls>[${CALLS}]</tool_calls>",
     .call = "${JSON}",
     .call_sep = ", ",
     .json = {.id_key = "id"}},
    {.name = "minimax-m1",
     .families = "MiniMax M1",
     .markers = {{"<tool_calls>", "<beginning_of_sentence>"}},
     .section = "<tool_calls>\n${CALLS}</tool_calls>",
     .call = "${JSON}\n"},
    {.name = "gigachat3.1",
     .families = "GigaChat 3.1",
     .markers = {{"<|function_call|>"}},
     .call = "<|function_call|>${JSON}",
     .parallel = false},
    {.name = "gigachat3",
     .families = "GigaChat 3",
     .markers = {{"function call", "<|role_sep|>"}},
     .call = "function call<|role_sep|>\n${JSON}",
     .parallel = false,
     .trigger = ""},  // "function call": prose writes it
    {.name = "firefunction-v2",
     .families = "FireFunction v2",
     .markers = {{"functools["}},
     .section = " functools[${CALLS}]",
     .call = "${JSON}",
     .call_sep = ", "},
    {.name = "hermes",
     .families = "Qwen 2.5 / 3, QwQ, Hermes 2 / 3 Pro, Granite 4, MiMo-VL, Bielik, Reka Edge",
     .markers = {{"<tool_call>"}},
     .call = "<tool_call>\n${JSON}\n</tool_call>",
     .call_sep = "\n"},
    {.name = "llama3",
     .families = "Llama 3.1 / 3.2 / 3.3",
     .markers = {{"<|python_tag|>"}, {"\"parameters\""}},
     .call = "${JSON}",
     .call_sep = "; ",
     .json = {.args_key = "parameters"},
     .parallel = false,
     .at_start = true,
     .lead = "<|python_tag|>",
     .trigger = "{\"name\""},
};

// "${NAME}" etc. -> slots; everything else literal text.
Pattern compile(const char* text) {
  static const struct {
    const char* name;
    Slot slot;
  } kSlots[] = {{"NAME", Slot::kName},     {"ID", Slot::kId},         {"INDEX1", Slot::kIndex1},
                {"INDEX", Slot::kIndex},   {"ARGS", Slot::kArgs},     {"JSON", Slot::kJson},
                {"CALLS", Slot::kCalls},   {"PARAMS", Slot::kParams}, {"KEY", Slot::kKey},
                {"VALUE", Slot::kValue},   {"TYPE", Slot::kType},     {"ISSTR", Slot::kIsString}};
  Pattern p;
  const std::string s = text;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t at = s.find("${", pos);
    const size_t end = at == std::string::npos ? std::string::npos : s.find('}', at);
    if (at == std::string::npos || end == std::string::npos) {
      p.push_back({Slot::kText, s.substr(pos)});
      break;
    }
    if (at > pos) p.push_back({Slot::kText, s.substr(pos, at - pos)});
    const std::string name = s.substr(at + 2, end - at - 2);
    bool found = false;
    for (const auto& k : kSlots)
      if (name == k.name) {
        p.push_back({k.slot, ""});
        found = true;
      }
    if (!found) p.push_back({Slot::kText, s.substr(at, end + 1 - at)});
    pos = end + 1;
  }
  return p;
}

std::vector<ToolFormat> build() {
  std::vector<ToolFormat> out;
  for (const Spec& s : kSpecs) {
    ToolFormat f;
    f.name = s.name;
    f.families = s.families;
    f.markers = s.markers;
    f.unless = s.unless;
    f.section = compile(s.section);
    f.call = compile(s.call);
    f.param = compile(s.param);
    f.call_sep = s.call_sep;
    f.param_sep = s.param_sep;
    f.values = s.values;
    f.sorted_keys = s.sorted_keys;
    f.json = s.json;
    f.ids = s.ids;
    f.parallel = s.parallel;
    f.at_start = s.at_start;
    f.lead = s.lead;
    f.content_marker = s.content_marker;
    if (s.trigger) {
      f.trigger = s.trigger;
    } else {
      const std::string& o = f.opener();
      const size_t b = o.find_first_not_of(" \n\t\r");
      if (b != std::string::npos) f.trigger = o.substr(b, o.find_first_of(" \n\t\r", b) - b);
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace

const std::vector<ToolFormat>& tool_formats() {
  static const std::vector<ToolFormat> table = build();
  return table;
}

const ToolFormat* tool_format_by_name(std::string_view name) {
  for (const ToolFormat& f : tool_formats())
    if (f.name == name) return &f;
  return nullptr;
}

const ToolFormat* detect_tool_format(const std::string& src) {
  const auto has = [&](const std::string& m) { return src.find(m) != std::string::npos; };
  for (const ToolFormat& f : tool_formats()) {
    bool unless = false;
    for (const std::string& u : f.unless) unless = unless || has(u);
    if (unless) continue;
    for (const auto& all : f.markers) {
      bool ok = !all.empty();
      for (const std::string& m : all) ok = ok && has(m);
      if (ok) return &f;
    }
  }
  return nullptr;
}

const std::string& ToolFormat::opener() const {
  static const std::string none;
  const Pattern& p = section.empty() ? call : section;
  return !p.empty() && p[0].slot == Slot::kText ? p[0].text : none;
}

std::vector<std::string> ToolFormat::literals() const {
  std::vector<std::string> out;
  for (const Pattern* p : {&section, &call, &param})
    for (const Piece& x : *p)
      if (x.slot == Slot::kText) out.push_back(x.text);
  for (const std::string* s : {&call_sep, &param_sep, &lead})
    if (!s->empty()) out.push_back(*s);
  return out;
}

std::string new_call_id(CallIds style) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const bool lower = style == CallIds::kSolar;
  const size_t n = style == CallIds::kOpenAI ? 24 : style == CallIds::kMistral ? 9 : 10;
  std::string id = style == CallIds::kOpenAI ? "call_" : "";
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < n; ++i) {
    const size_t k = lower ? (rng() % 36) : (rng() % 62);
    id += lower ? (k < 26 ? kAlnum[k] : kAlnum[52 + (k - 26)]) : kAlnum[k];
  }
  return id;
}

}  // namespace kiln::tpl
