// The grammar of a forced tool call (tool_choice "required" or a named function): GBNF whose every sentence is a
// reply of tool calls in the template's format (template/tool_formats.h), each naming an allowed function with
// arguments that validate against its `parameters` schema. Built from the same format table the reply parser reads,
// so what the grammar writes the parser reads back.
//
//   root ::= [reasoning block] calls        the calls inside the format's section, when it has one
//                                           (harmony: the analysis message, then "<|start|>assistant")
//   calls ::= call (call_sep call)*         one call only without `parallel` (or when the format holds one)
//   call ::= call-0 | call-1 | ...          one alternative per allowed function
//
// Arguments: JSON formats use the JSON-schema compiler (grammar/grammar.h, every keyword docs/GRAMMAR.md lists);
// parameter formats write each declared property in the schema's order (Gemma 4: key order), the required ones
// always, the optional ones optionally, no others. A raw-text string parameter (XML-like formats) is enforced as to
// its `enum` / `const`; its length, pattern and format cannot be (refused). Python and Gemma values support type,
// enum, const, anyOf / oneOf, properties, required and items (other keywords refused).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "template/tool_formats.h"
#include "util/status.h"

namespace kiln {

struct ToolGrammarRequest {
  std::vector<std::string> names;  // the functions a call may name (each defined in `tools`)
  bool parallel = true;            // more than one call allowed
  // A reasoning block that may (or, when opened, must) come first: the template's markers ("" none).
  std::string think_begin, think_end;
  // What follows the closed block instead of whitespace: the next message's start where a reply is headed messages
  // (harmony's "<|start|>assistant", tpl::ReplyOptions::message_start); "" none.
  std::string think_after;
  bool opened_reasoning = false;   // the prompt opened the block: the reply starts inside it
  bool opened_tool_call = false;   // the prompt wrote the format's opener: the reply continues the first call
  // opened_tool_call: the opener's trailing whitespace the prompt left out (ChatPrompt::prompt_opens_tool_call),
  // which the first call may then write ("" none).
  std::string opener_tail;
};

// Errors (InvalidArgument) start with the field at fault: "tools[i].function.parameters: ..." (a schema keyword the
// format cannot enforce), or "tool_choice: ..." (a function not in tools).
Result<std::string> tool_call_gbnf(const tpl::ToolFormat& f, const nlohmann::ordered_json& tools,
                                   const ToolGrammarRequest& rq);

}  // namespace kiln
