// Tool-call formats: how each chat-template family writes an assistant's tool calls (the text its model emits),
// detected from the template source. One table (tool_formats.cpp) is the home of every format; the reply parser
// (parse_tool_calls, here) and the grammar that enforces tool_choice (runtime/tool_grammar.h) both read it.
//
// A format is a pattern of literal text and slots, written with ${SLOT} placeholders:
//   section  the block that holds all calls of a reply, with ${CALLS} where they go ("" when calls stand alone)
//   call     one call: ${NAME} and its arguments, either ${ARGS} (one JSON object), ${JSON} (the whole call as a
//            JSON object, keys per JsonShape) or ${PARAMS} (key/value parameters, each written by `param`)
//   param    one parameter: ${KEY}, ${VALUE} (in the format's ValueSyntax), optionally ${TYPE} (its JSON type name)
//            or ${ISSTR} ("true" for a raw string value, else "false")
// and ${ID} (a call id the model writes), ${INDEX} (a call counter the model writes: 0-based, or 1-based as
// ${INDEX1}). Literal text holds special tokens written out (e.g. "<|tool_call_begin|>"). Whitespace in literals
// is the template's canonical form: the parser tolerates other whitespace there, the grammar writes it exactly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::tpl {

struct ToolCall;

enum class Slot : uint8_t {
  kText,     // literal text
  kName,     // the function name
  kId,       // a call id the model writes
  kIndex,    // a call counter the model writes (0-based)
  kIndex1,   // the same, 1-based
  kArgs,     // the arguments: one JSON object
  kJson,     // the whole call: one JSON object (JsonShape)
  kCalls,    // (section) the calls, call_sep between them
  kParams,   // the arguments as parameters (the param pattern), param_sep between them
  kKey,      // (param) the parameter's name
  kValue,    // (param) its value (ValueSyntax)
  kType,     // (param) its JSON type: string, number, boolean, object, array, null
  kIsString, // (param) "true" when the value is written as a raw string, else "false"
};

struct Piece {
  Slot slot = Slot::kText;
  std::string text;  // kText: the literal
};
using Pattern = std::vector<Piece>;

// How ${VALUE} is written.
enum class ValueSyntax : uint8_t {
  kRaw,     // a string-typed parameter as raw text; every other value as JSON (XML-like formats)
  kPython,  // Python literals: 'text', 1, 2.5, True, False, None, [..], {'k': v}
  kGemma,   // <|"|>text<|"|>, 1, true, false, [..], {k:v} (Gemma 4)
};

// How a ${JSON} call object is keyed.
struct JsonShape {
  std::string name_key = "name", args_key = "arguments";
  std::string id_key = "";       // the model's call id ("" none)
  std::string counter_key = "";  // a call counter written first, as a string ("tool_call_id": "0"; "" none)
  bool name_is_key = false;  // {"NAME": {arguments}} (Apertus)
};

enum class CallIds : uint8_t {
  kOpenAI,   // call_ + 24 letters and digits
  kMistral,  // 9 letters and digits (Mistral templates refuse other ids in the conversation)
  kSolar,    // 10 lowercase letters and digits (what Solar Open's template asks its model for)
};

struct ToolFormat {
  std::string name;      // "hermes", "qwen3-coder", ...
  std::string families;  // the model families that write it (documentation)
  // Detection: the template source holds every marker of one of these lists, and none of `unless`.
  std::vector<std::vector<std::string>> markers;
  std::vector<std::string> unless;
  Pattern section, call, param;
  std::string call_sep, param_sep;  // canonical text between calls / parameters
  ValueSyntax values = ValueSyntax::kRaw;
  bool sorted_keys = false;  // parameters are written in key order (Gemma 4: dictsort), else the schema's order
  JsonShape json;
  CallIds ids = CallIds::kOpenAI;
  bool parallel = true;   // the template writes several calls in one reply
  bool at_start = false;  // a call only at the start of the reply (Llama 3's bare JSON), optionally after `lead`
  std::string lead;       // at_start: a marker that may come first ("<|python_tag|>")
  std::string content_marker;  // text that opens plain content and is not part of it (functionary's ">>>all\n")
  // tool_choice "auto": the text that opens a call in otherwise free output, where the call's grammar takes over
  // (a lazy grammar, runtime/grammar_mask.h); a prefix of what the grammar writes. By default the opener's first
  // run of non-whitespace; at_start formats: only at the start of the reply (after `lead`). "" where the opening is
  // ambiguous (plain words that prose writes too): "auto" then leaves the reply free.
  std::string trigger;

  // The text that starts the first call of a reply: the section's (or the call's) first literal.
  const std::string& opener() const;
  // Every literal of the patterns (the texts whose special tokens a reply must show as text).
  std::vector<std::string> literals() const;
};

// The format a template writes tool calls in; null when it writes none (or none the table knows). Detection reads
// the template source only.
const ToolFormat* detect_tool_format(const std::string& template_source);
// The table, in detection order.
const std::vector<ToolFormat>& tool_formats();
const ToolFormat* tool_format_by_name(std::string_view name);

// The tool calls of a reply in format f: each well-formed call (or section of calls) is taken out of *content and
// appended to *calls; everything else stays (malformed call text included). `tools`: the OpenAI tool definitions
// of the request (null: unknown): a raw-string format reads a parameter as a string exactly when its schema says
// "type": "string". `opened`: the prompt ended with f.opener() less `opener_tail` (a suffix of its trailing
// whitespace, which the reply may write): the reply continues it. Content is trimmed when a call was found. Call ids:
// as the model wrote them, else fresh random ones in the format's style.
void parse_tool_calls(const ToolFormat& f, std::string* content, std::vector<ToolCall>* calls,
                      const nlohmann::ordered_json& tools = nullptr, bool opened = false,
                      const std::string& opener_tail = {});

// A fresh call id in the given style (random; unique in practice).
std::string new_call_id(CallIds style);

}  // namespace kiln::tpl
