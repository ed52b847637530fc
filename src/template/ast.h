// Template AST: jinja2's node set as far as chat templates use it (jinja2/nodes.py). One fat node struct per
// category keeps the parser and evaluator short; which fields a node uses is listed per kind.
// Every node carries the line and column of the token it starts at, for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"
#include "util/status.h"

namespace kiln::tpl {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

enum class EK : uint8_t {
  kConst,     // value
  kName,      // name
  kList,      // args
  kTuple,     // args
  kDict,      // args = key0, value0, key1, value1, ...
  kGetAttr,   // a.name
  kGetItem,   // a[b]
  kSlice,     // a[b:c:d] (b/c/d may be null)
  kCall,      // a(args, kwargs, *star, **dstar)
  kFilter,    // a|name(args, kwargs); a is null inside {% filter %} blocks (the body text)
  kTest,      // a is name(args, kwargs)
  kNeg,       // -a
  kPos,       // +a
  kNot,       // not a
  kBinary,    // a op b: + - * / // % **
  kAnd,       // a and b
  kOr,        // a or b
  kCompare,   // a (ops[i] rest[i])...: == != < <= > >= in notin
  kConcat,    // args joined with ~
  kCond,      // b if a else c  (c may be null: Undefined)
};

struct Expr {
  EK kind;
  int line = 0, col = 0;
  Value value;
  std::string name;  // kName, kGetAttr, kFilter, kTest; kBinary: the operator
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star, dstar;            // kCall: *args, **kwargs
  std::vector<std::string> ops;   // kCompare
  bool unknown = false;           // kFilter/kTest: no such filter/test (an error when evaluated)
};

enum class NK : uint8_t {
  kData,       // text
  kOutput,     // {{ expr }}
  kIf,         // tests[i] -> bodies[i]; else_body
  kFor,        // target (names), iter, filter (may be null), body, else_body, recursive
  kSet,        // target = expr  (names, or ns_name.attr)
  kSetBlock,   // {% set target [| filters] %}body{% endset %}; filter = chain applied to the body (a == null)
  kMacro,      // name(params = defaults) body
  kCallBlock,  // {% call(params) expr %}body{% endcall %}
  kFilterBlock,  // {% filter chain %}body{% endfilter %}
  kWith,       // {% with targets = values %}body{% endwith %}
  kBreak,
  kContinue,
  kGeneration,  // transformers' {% generation %}body{% endgeneration %}: the body, in its own scope
};

struct Node {
  NK kind;
  int line = 0, col = 0;
  std::string text;                  // kData
  ExprPtr expr;                      // kOutput, kSet value, kFor iter, kCallBlock call
  ExprPtr filter;                    // kFor filter; kSetBlock/kFilterBlock chain
  std::vector<ExprPtr> tests;        // kIf
  std::vector<Body> bodies;          // kIf
  Body body, else_body;
  std::vector<std::string> targets;  // kFor/kSet/kWith names (several: unpacking); kSet "ns.attr": attr_of
  std::string attr_of;               // kSet: namespace attribute assignment "target[0].attr_of"
  bool target_tuple = false;         // for a, b in ... (unpack even a single name written "a,")
  std::string name;                  // kMacro
  std::vector<std::string> params;   // kMacro, kCallBlock caller params
  std::vector<ExprPtr> defaults;     // aligned to the last params (null where none)
  std::vector<ExprPtr> with_values;  // kWith
  bool recursive = false;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;  // kMacro / kCallBlock body
};

// A parsed template (owns its AST).
struct Program {
  Body body;
  std::string name;  // for error messages
};

struct ParseLimits {
  int max_nesting = 100;  // nested expressions/blocks; deeper templates are rejected, not stack-overflowed
};

// Lexes and parses; errors name the line and column. `name` prefixes messages ("template: line 3 ...").
Result<std::shared_ptr<Program>> parse_template(const std::string& source, const std::string& name,
                                                const ParseLimits& limits = {});

// Whether a filter/test name exists (defined in builtins.cpp; the parser checks names against them as jinja2's
// compiler does).
bool have_filter(const std::string& name);
bool have_test(const std::string& name);

}  // namespace kiln::tpl
