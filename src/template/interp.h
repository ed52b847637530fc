// The evaluator's internals, shared by interp.cpp (statements, expressions, calls) and builtins.cpp (filters,
// tests, methods, globals). Not part of the public API (template/template.h is).
//
// Scoping follows jinja2's compiled code: `if` shares its frame; every `for` iteration gets a fresh child frame
// of the loop's frame (so `set` inside a loop is invisible after it, and each iteration starts from the outer
// values); a macro call gets a child of the frame the macro was defined in (late binding: it sees that frame's
// current values); call-block bodies, `{% generation %}`, `{% set %}` blocks and `with` get child frames.
//
// Bounds (hostile templates): every statement, expression call and loop iteration spends one "step"; macro
// nesting, total output bytes and the size of any one string or list are capped (Limits); hitting a cap is an
// error naming the template position, never a crash or a hang.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "template/ast.h"
#include "template/value.h"

namespace kiln::tpl {

struct Limits {
  int64_t max_steps = 20'000'000;        // statements + calls + loop iterations
  int max_call_depth = 100;              // nested macro calls
  size_t max_output_bytes = 32u << 20;   // bytes written to all output buffers together
  size_t max_string_bytes = 32u << 20;   // any one string value
  size_t max_list_items = 4'000'000;     // any one list
  int64_t max_range = 100'000;           // range() size (jinja2's sandbox MAX_RANGE)
  // Native stack the evaluator may use below render()'s frame. Parse-time nesting is bounded (max_nesting), but a
  // macro re-enters its body, so the run-time depth is nesting x calls; this bounds it in bytes, whatever the frame
  // sizes of the build (a debug + ASan build spends ~10 KiB per nested macro call, a release build ~1 KiB). render()
  // lowers it to what the thread's stack has left below its frame minus 256 KiB (Linux: pthread_getattr_np).
  size_t max_stack_bytes = 4u << 20;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find_local(const std::string& n) {
    for (auto& [k, v] : vars)
      if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    if (Value* x = find_local(n)) *x = std::move(v);
    else vars.emplace_back(n, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Keyword or positional argument `name` at `index`; Undefined-kind "missing" when absent.
  const Value* get(size_t index, const char* name) const;
  bool has(size_t index, const char* name) const { return get(index, name) != nullptr; }
};

class Interp;
using Builtin = std::function<Result<Value>(Interp&, CallArgs&)>;

struct CallableObj : Object {
  virtual ~CallableObj() = default;
  virtual Result<Value> call(Interp& in, CallArgs& args) = 0;
  virtual std::string name() const = 0;
};
struct BuiltinFn : CallableObj {
  BuiltinFn(std::string n, Builtin f) : n(std::move(n)), f(std::move(f)) {}
  std::string n;
  Builtin f;
  Result<Value> call(Interp& in, CallArgs& args) override { return f(in, args); }
  std::string name() const override { return n; }
};
Value make_builtin(std::string name, Builtin f);

class Interp {
 public:
  Interp(const Program& prog, const Limits& lim, ScopePtr globals) : prog_(prog), lim_(lim), globals_(std::move(globals)) {}
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;
  // Registers an object that may end up in a reference cycle (see Object::clear_refs).
  void track(std::shared_ptr<Object> obj) { arena_.push_back(std::move(obj)); }

  Result<std::string> render();

  // ---- used by builtins
  const Limits& limits() const { return lim_; }
  Status step();                                   // spends one step
  Status check_string(size_t bytes) const;         // a string result of this size is allowed?
  Status check_list(size_t items) const;
  Status error(const char* fmt, ...) const __attribute__((format(printf, 2, 3)));  // at the current position
  Result<Value> call_value(const Value& fn, CallArgs& args);
  Result<Value> apply_filter(const std::string& name, const Value& v, CallArgs& args);
  Result<bool> apply_test(const std::string& name, const Value& v, CallArgs& args);
  Result<Value> getattr(const Value& obj, const std::string& name);
  Result<Value> getitem(const Value& obj, const Value& key);
  // Python iteration (list items, dict keys, string characters, an iterator's rest); error for non-iterables.
  Result<List> iterate(const Value& v);
  std::time_t now = 0;  // strftime_now's clock (0: the real local time)

  // ---- used by macros (interp.cpp)
  Status exec_body(const Body& body, const ScopePtr& scope, std::string* out);
  Result<Value> eval(const Expr& e, const ScopePtr& scope);
  int call_depth = 0;

 private:
  Status exec(const Node& n, const ScopePtr& scope, std::string* out);
  Status exec_node(const Node& n, const ScopePtr& scope, std::string* out);
  Result<Value> eval_expr(const Expr& e, const ScopePtr& scope);
  Status exec_for(const Node& n, const ScopePtr& scope, std::string* out);
  Result<List> loop_items(const Node& n, const ScopePtr& scope, const Value& seq);
  Status run_loop(const Node& n, const ScopePtr& scope, List items, int depth, std::string* out);
  Status emit(std::string* out, std::string_view s);
  Result<Value> eval_call(const Expr& e, const ScopePtr& scope);
  Result<Value> eval_filter(const Expr& e, const ScopePtr& scope, const Value* input);
  Status eval_args(const Expr& e, const ScopePtr& scope, CallArgs* args);
  Value lookup(const std::string& name, const ScopePtr& scope);
  void at(int line, int col) {
    line_ = line;
    col_ = col;
  }
  Status located(Status st) const;
  Status check_stack() const;  // error once the evaluator's native stack exceeds stack_budget_

  const Program& prog_;
  Limits lim_;
  ScopePtr globals_;
  std::vector<std::shared_ptr<Object>> arena_;
  int64_t steps_ = 0;
  const char* stack_base_ = nullptr;  // render()'s frame address (the stack grows down from it)
  size_t stack_budget_ = 0;           // bytes below stack_base_ the evaluator may use (render() sets it)
  size_t output_bytes_ = 0;
  int line_ = 0, col_ = 0;
  enum class Flow { kNormal, kBreak, kContinue } flow_ = Flow::kNormal;
  friend struct MacroObj;
};

// builtins.cpp
Result<Value> binary_op(Interp& in, const std::string& op, const Value& a, const Value& b);
Result<bool> contains(Interp& in, const Value& container, const Value& item);
// The globals every template sees (range, namespace, dict, cycler, joiner, raise_exception, strftime_now).
void add_builtin_globals(Scope* s);
// Markup escaping (jinja2's escape: & < > " ').
std::string html_escape(std::string_view s);
// The attribute/method of a builtin value (str, dict, list methods). Not found: an Undefined with an empty hint
// (the caller then tries keys and builds its own message); a forbidden method (the immutable sandbox's list.append,
// dict.update, ...): an Undefined whose hint is the security message, raised when it is called.
Result<Value> builtin_attr(Interp& in, const Value& obj, const std::string& name);

}  // namespace kiln::tpl
