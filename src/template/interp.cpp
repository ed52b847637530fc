// Statements, expressions, macros and loops (see interp.h for the scoping rules and bounds).
// Error positions: an error is located at the innermost node whose own operation failed (children that
// evaluated fine are done by then), by prefixing "NAME: line L, column C: " once.
#include "template/interp.h"

#include <algorithm>
#include <cstdarg>
#if defined(__linux__)
#include <pthread.h>
#endif

namespace kiln::tpl {

const Value* CallArgs::get(size_t index, const char* name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  if (index < pos.size()) return &pos[index];
  return nullptr;
}

Value make_builtin(std::string name, Builtin f) {
  return Value::from_object(Kind::kCallable, std::make_shared<BuiltinFn>(std::move(name), std::move(f)));
}

namespace {

// jinja2's LoopContext.
struct LoopObj : AttrObject {
  List items;  // the (filtered) items, for previtem/nextitem
  size_t index = 0;
  int depth = 1;
  bool has_last_changed = false;
  Value last_changed;
  std::function<Result<Value>(Interp&, CallArgs&)> recurse;  // set for `recursive` loops
  std::string type_name() const override { return "LoopContext"; }
  void clear_refs() override {
    items.clear();
    recurse = nullptr;
    last_changed = Value();
  }
  Value getattr(const std::string& n) override {
    const int64_t len = static_cast<int64_t>(items.size()), i = static_cast<int64_t>(index);
    if (n == "index") return Value::integer(i + 1);
    if (n == "index0") return Value::integer(i);
    if (n == "revindex") return Value::integer(len - i);
    if (n == "revindex0") return Value::integer(len - i - 1);
    if (n == "first") return Value::boolean(i == 0);
    if (n == "last") return Value::boolean(i == len - 1);
    if (n == "length") return Value::integer(len);
    if (n == "depth") return Value::integer(depth);
    if (n == "depth0") return Value::integer(depth - 1);
    if (n == "previtem") return i > 0 ? items[index - 1] : Value::undefined("there is no previous item");
    if (n == "nextitem") return i + 1 < len ? items[index + 1] : Value::undefined("there is no next item");
    if (n == "cycle") {
      const int64_t at = i;
      return make_builtin("cycle", [at](Interp& in, CallArgs& a) -> Result<Value> {
        if (a.pos.empty()) return in.error("no items for cycling given");
        return a.pos[static_cast<size_t>(at % static_cast<int64_t>(a.pos.size()))];
      });
    }
    if (n == "changed") {
      LoopObj* self = this;
      return make_builtin("changed", [self](Interp&, CallArgs& a) -> Result<Value> {
        Value v = Value::list(a.pos);
        if (self->has_last_changed && equals(v, self->last_changed)) return Value::boolean(false);
        self->has_last_changed = true;
        self->last_changed = v;
        return Value::boolean(true);
      });
    }
    return Value::undefined("'LoopContext' object has no attribute '" + n + "'");
  }
};

}  // namespace

// A macro, or the caller of a call block: the defining node and the frame it closes over.
struct MacroObj : CallableObj {
  const Node* def;
  ScopePtr closure;
  std::string n;
  MacroObj(const Node* d, ScopePtr c, std::string name) : def(d), closure(std::move(c)), n(std::move(name)) {}
  std::string name() const override { return n; }
  void clear_refs() override { closure.reset(); }

  Result<Value> call(Interp& in, CallArgs& args) override {
    if (!closure) return in.error("macro '%s' called after its template finished rendering", n.c_str());
    if (in.call_depth >= in.limits().max_call_depth)
      return make_error(ErrorCode::kOutOfRange, "maximum recursion depth exceeded (%d nested macro calls)",
                        in.limits().max_call_depth);
    auto scope = std::make_shared<Scope>();
    scope->parent = closure;
    const size_t np = def->params.size();
    std::vector<bool> consumed(args.kw.size(), false);
    for (size_t i = 0; i < np; ++i) {
      const std::string& p = def->params[i];
      const Value* kwv = nullptr;
      for (size_t k = 0; k < args.kw.size(); ++k)
        if (args.kw[k].first == p) {
          kwv = &args.kw[k].second;
          consumed[k] = true;
        }
      if (i < args.pos.size()) {
        if (kwv) return in.error("macro '%s' got multiple values for argument '%s'", n.c_str(), p.c_str());
        scope->set(p, args.pos[i]);
      } else if (kwv) {
        scope->set(p, *kwv);
      } else if (def->defaults[i]) {
        auto d = in.eval(*def->defaults[i], scope);
        if (!d) return d.status();
        scope->set(p, std::move(d).value());
      } else {
        scope->set(p, Value::undefined("parameter '" + p + "' was not provided"));
      }
    }
    if (args.pos.size() > np) {
      if (!def->uses_varargs)
        return in.error("macro '%s' takes not more than %zu argument(s)", n.c_str(), np);
      scope->set("varargs", Value::list(List(args.pos.begin() + static_cast<long>(np), args.pos.end()), true));
    } else if (def->uses_varargs) {
      scope->set("varargs", Value::list({}, true));
    }
    Dict extra;
    bool have_caller = false;
    for (size_t k = 0; k < args.kw.size(); ++k) {
      if (consumed[k]) continue;
      if (args.kw[k].first == "caller" && def->uses_caller) {
        scope->set("caller", args.kw[k].second);
        have_caller = true;
        continue;
      }
      if (!def->uses_kwargs)
        return in.error("macro '%s' takes no keyword argument '%s'", n.c_str(), args.kw[k].first.c_str());
      extra.set(Value::string(args.kw[k].first), args.kw[k].second);
    }
    if (def->uses_kwargs) scope->set("kwargs", Value::dict(std::move(extra)));
    if (def->uses_caller && !have_caller && def->kind == NK::kMacro) scope->set("caller", Value::undefined("No caller defined"));
    std::string out;
    ++in.call_depth;
    Status st = in.exec_body(def->body, scope, &out);
    --in.call_depth;
    in.flow_ = Interp::Flow::kNormal;
    KILN_TRY(st);
    return Value::string(std::move(out));
  }
};

Interp::~Interp() {
  for (auto& o : arena_) o->clear_refs();
}

Status Interp::step() {
  if (++steps_ > lim_.max_steps)
    return make_error(ErrorCode::kOutOfRange, "template exceeded %lld evaluation steps (a loop or recursion too large)",
                      static_cast<long long>(lim_.max_steps));
  return Status::ok();
}
Status Interp::check_string(size_t bytes) const {
  if (bytes > lim_.max_string_bytes)
    return make_error(ErrorCode::kOutOfRange, "string of %zu bytes exceeds the template limit of %zu", bytes,
                      lim_.max_string_bytes);
  return Status::ok();
}
Status Interp::check_list(size_t items) const {
  if (items > lim_.max_list_items)
    return make_error(ErrorCode::kOutOfRange, "list of %zu items exceeds the template limit of %zu", items,
                      lim_.max_list_items);
  return Status::ok();
}
Status Interp::error(const char* fmt, ...) const {
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vstrprintf(fmt, ap);
  va_end(ap);
  return Status(ErrorCode::kInvalidArgument, std::move(msg));
}

Status Interp::located(Status st) const {
  if (st.is_ok()) return st;
  const std::string prefix = prog_.name + ": line ";
  if (st.message().compare(0, prefix.size(), prefix) == 0) return st;
  return Status(st.code(), strprintf("%s: line %d, column %d: ", prog_.name.c_str(), line_, col_) + st.message());
}

Status Interp::emit(std::string* out, std::string_view s) {
  output_bytes_ += s.size();
  if (output_bytes_ > lim_.max_output_bytes)
    return make_error(ErrorCode::kOutOfRange, "template output exceeds %zu bytes", lim_.max_output_bytes);
  out->append(s);
  return Status::ok();
}

namespace {

// The lowest address of this thread's stack (nullptr: unknown). Asked once per thread: for the main thread glibc
// reads /proc/self/maps to answer.
const char* thread_stack_low() {
#if defined(__linux__)
  thread_local const char* low = [] {
    const char* p = nullptr;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &addr, &size) == 0) p = static_cast<const char*>(addr);
      pthread_attr_destroy(&attr);
    }
    return p;
  }();
  return low;
#else
  return nullptr;
#endif
}

}  // namespace

Result<std::string> Interp::render() {
  stack_base_ = static_cast<const char*>(__builtin_frame_address(0));
  stack_budget_ = lim_.max_stack_bytes;
  if (const char* low = thread_stack_low(); low && stack_base_ > low) {
    constexpr size_t kMargin = 256u << 10;  // for what runs below the deepest check (allocation, formatting)
    const size_t left = static_cast<size_t>(stack_base_ - low);
    stack_budget_ = std::min(stack_budget_, left > kMargin ? left - kMargin : 0);
  }
  auto root = std::make_shared<Scope>();
  root->parent = globals_;
  std::string out;
  KILN_TRY(exec_body(prog_.body, root, &out));
  return out;
}

Value Interp::lookup(const std::string& name, const ScopePtr& scope) {
  for (Scope* s = scope.get(); s; s = s->parent.get())
    if (Value* v = s->find_local(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Result<List> Interp::iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return List{};
    case Kind::kList: return v.items();
    case Kind::kDict: {
      List keys;
      for (const auto& [k, x] : v.dict().entries) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      const std::string& s = v.str();
      if (is_ascii(s)) {
        for (char c : s) chars.push_back(Value::string(std::string(1, c), v.is_safe()));
      } else {
        for (uint32_t cp : decode_utf8_all(s)) {
          std::string c;
          append_utf8(&c, cp);
          chars.push_back(Value::string(std::move(c), v.is_safe()));
        }
      }
      return chars;
    }
    case Kind::kIterator: {
      auto* it = v.as<IteratorObj>();
      List rest(it->items.begin() + static_cast<long>(std::min(it->pos, it->items.size())), it->items.end());
      it->pos = it->items.size();
      return rest;
    }
    default: return error("'%s' object is not iterable", v.type_name().c_str());
  }
}

Status Interp::exec_body(const Body& body, const ScopePtr& scope, std::string* out) {
  for (const auto& n : body) {
    KILN_TRY(exec(*n, scope, out));
    if (flow_ != Flow::kNormal) return Status::ok();
  }
  return Status::ok();
}

namespace {
// Binds for/set targets: one name, or several unpacked from an iterable of exactly that many items.
Status bind_targets(Interp& in, const Node& n, const Value& v, Scope* scope) {
  if (n.targets.size() == 1 && !n.target_tuple) {
    scope->set(n.targets[0], v);
    return Status::ok();
  }
  auto items = in.iterate(v);
  if (!items) return items.status();
  if (items->size() < n.targets.size())
    return in.error("not enough values to unpack (expected %zu, got %zu)", n.targets.size(), items->size());
  if (items->size() > n.targets.size()) return in.error("too many values to unpack (expected %zu)", n.targets.size());
  for (size_t i = 0; i < n.targets.size(); ++i) scope->set(n.targets[i], (*items)[i]);
  return Status::ok();
}
}  // namespace

Status Interp::check_stack() const {
  const char* here = static_cast<const char*>(__builtin_frame_address(0));
  if (stack_base_ && stack_base_ > here && static_cast<size_t>(stack_base_ - here) > stack_budget_)
    return make_error(ErrorCode::kOutOfRange, "template nested too deeply at run time (over %zu KiB of stack)",
                      stack_budget_ >> 10);
  return Status::ok();
}

// Any error that leaves a node without a position gets the node's (the innermost failing node locates first).
Status Interp::exec(const Node& n, const ScopePtr& scope, std::string* out) {
  Status st = check_stack();
  if (st.is_ok()) st = exec_node(n, scope, out);
  if (st.is_ok()) return st;
  at(n.line, n.col);
  return located(std::move(st));
}

Result<Value> Interp::eval(const Expr& e, const ScopePtr& scope) {
  if (Status st = check_stack(); !st.is_ok()) {
    at(e.line, e.col);
    return located(std::move(st));
  }
  auto r = eval_expr(e, scope);
  if (r.is_ok()) return r;
  at(e.line, e.col);
  return located(r.status());
}

Status Interp::exec_node(const Node& n, const ScopePtr& scope, std::string* out) {
  KILN_TRY(located((at(n.line, n.col), step())));
  switch (n.kind) {
    case NK::kData: return emit(out, n.text);
    case NK::kOutput: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*n.expr, scope));
      at(n.line, n.col);
      return located(emit(out, to_str(v)));
    }
    case NK::kIf:
      for (size_t i = 0; i < n.tests.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(Value t, eval(*n.tests[i], scope));
        if (t.truthy()) return exec_body(n.bodies[i], scope, out);
      }
      return exec_body(n.else_body, scope, out);
    case NK::kFor: return exec_for(n, scope, out);
    case NK::kSet: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*n.expr, scope));
      at(n.line, n.col);
      if (!n.attr_of.empty()) {
        Value ns = lookup(n.targets[0], scope);
        if (ns.kind() != Kind::kNamespace) return located(error("cannot assign attribute on non-namespace object"));
        ns.as<NamespaceObj>()->attrs.set(Value::string(n.attr_of), std::move(v));
        return Status::ok();
      }
      return located(bind_targets(*this, n, v, scope.get()));
    }
    case NK::kSetBlock:
    case NK::kFilterBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      std::string buf;
      KILN_TRY(exec_body(n.body, inner, &buf));
      Value v = Value::string(std::move(buf));
      if (n.filter) {
        KILN_ASSIGN_OR_RETURN(v, eval_filter(*n.filter, scope, &v));
      }
      if (n.kind == NK::kSetBlock) {
        scope->set(n.targets[0], std::move(v));
        return Status::ok();
      }
      at(n.line, n.col);
      return located(emit(out, to_str(v)));
    }
    case NK::kMacro: {
      auto m = std::make_shared<MacroObj>(&n, scope, n.name);
      track(m);
      scope->set(n.name, Value::from_object(Kind::kCallable, std::move(m)));
      return Status::ok();
    }
    case NK::kCallBlock: {
      const Expr& call = *n.expr;
      KILN_ASSIGN_OR_RETURN(Value fn, eval(*call.a, scope));
      CallArgs args;
      KILN_TRY(eval_args(call, scope, &args));
      auto caller = std::make_shared<MacroObj>(&n, scope, "caller");
      track(caller);
      args.kw.emplace_back("caller", Value::from_object(Kind::kCallable, std::move(caller)));
      at(call.line, call.col);
      auto r = call_value(fn, args);
      if (!r) return located(r.status());
      return located(emit(out, to_str(*r)));
    }
    case NK::kWith: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      for (size_t i = 0; i < n.targets.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(Value v, eval(*n.with_values[i], scope));
        inner->set(n.targets[i], std::move(v));
      }
      return exec_body(n.body, inner, out);
    }
    case NK::kBreak: flow_ = Flow::kBreak; return Status::ok();
    case NK::kContinue: flow_ = Flow::kContinue; return Status::ok();
    case NK::kGeneration: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      return exec_body(n.body, inner, out);
    }
  }
  return Status::ok();
}

Result<List> Interp::loop_items(const Node& n, const ScopePtr& scope, const Value& seq) {
  at(n.expr->line, n.expr->col);
  auto items_r = iterate(seq);
  if (!items_r) return located(items_r.status());
  List items = std::move(items_r).value();
  if (!n.filter) return items;
  // `for x in xs if cond`: filtered first, so loop.length counts what is kept.
  List kept;
  for (const Value& it : items) {
    KILN_TRY(located(step()));
    auto tmp = std::make_shared<Scope>();
    tmp->parent = scope;
    at(n.line, n.col);
    KILN_TRY(located(bind_targets(*this, n, it, tmp.get())));
    KILN_ASSIGN_OR_RETURN(Value keep, eval(*n.filter, tmp));
    if (keep.truthy()) kept.push_back(it);
  }
  return kept;
}

Status Interp::exec_for(const Node& n, const ScopePtr& scope, std::string* out) {
  KILN_ASSIGN_OR_RETURN(Value seq, eval(*n.expr, scope));
  KILN_ASSIGN_OR_RETURN(List items, loop_items(n, scope, seq));
  return run_loop(n, scope, std::move(items), 1, out);
}

Status Interp::run_loop(const Node& n, const ScopePtr& scope, List items, int depth, std::string* out) {
  auto loop = std::make_shared<LoopObj>();
  track(loop);
  loop->items = std::move(items);
  loop->depth = depth;
  if (n.recursive) {
    // loop(children) renders this loop's body over `children` (one level deeper) and returns the text.
    const Node* node = &n;
    ScopePtr sc = scope;
    loop->recurse = [this, node, sc, depth](Interp&, CallArgs& a) -> Result<Value> {
      if (a.pos.size() != 1) return error("loop() takes exactly one argument");
      if (call_depth >= lim_.max_call_depth)
        return make_error(ErrorCode::kOutOfRange, "maximum recursion depth exceeded in a recursive loop");
      KILN_ASSIGN_OR_RETURN(List sub, loop_items(*node, sc, a.pos[0]));
      std::string buf;
      ++call_depth;
      Status st = run_loop(*node, sc, std::move(sub), depth + 1, &buf);
      --call_depth;
      KILN_TRY(st);
      return Value::string(std::move(buf));
    };
  }
  const Value loop_value = Value::from_object(Kind::kObject, loop);
  const size_t count = loop->items.size();
  for (size_t i = 0; i < count; ++i) {
    at(n.line, n.col);
    KILN_TRY(located(step()));
    loop->index = i;
    auto iter_scope = std::make_shared<Scope>();
    iter_scope->parent = scope;
    KILN_TRY(located(bind_targets(*this, n, loop->items[i], iter_scope.get())));
    iter_scope->set("loop", loop_value);
    KILN_TRY(exec_body(n.body, iter_scope, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  if (count == 0) {
    auto else_scope = std::make_shared<Scope>();
    else_scope->parent = scope;
    KILN_TRY(exec_body(n.else_body, else_scope, out));
  }
  return Status::ok();
}

Status Interp::eval_args(const Expr& e, const ScopePtr& scope, CallArgs* args) {
  for (const auto& a : e.args) {
    KILN_ASSIGN_OR_RETURN(Value v, eval(*a, scope));
    args->pos.push_back(std::move(v));
  }
  for (const auto& [k, a] : e.kwargs) {
    KILN_ASSIGN_OR_RETURN(Value v, eval(*a, scope));
    args->kw.emplace_back(k, std::move(v));
  }
  if (e.star) {
    KILN_ASSIGN_OR_RETURN(Value v, eval(*e.star, scope));
    at(e.star->line, e.star->col);
    auto items = iterate(v);
    if (!items) return located(items.status());
    for (auto& x : *items) args->pos.push_back(x);
  }
  if (e.dstar) {
    KILN_ASSIGN_OR_RETURN(Value v, eval(*e.dstar, scope));
    if (!v.is_dict()) {
      at(e.dstar->line, e.dstar->col);
      return located(error("argument after ** must be a mapping, not %s", v.type_name().c_str()));
    }
    for (const auto& [k, x] : v.dict().entries) args->kw.emplace_back(to_str(k), x);
  }
  return Status::ok();
}

Result<Value> Interp::call_value(const Value& fn, CallArgs& args) {
  KILN_TRY(step());
  if (fn.is_undefined()) return Status(ErrorCode::kInvalidArgument, fn.str().empty() ? "undefined value called" : fn.str());
  if (fn.kind() == Kind::kCallable) return fn.as<CallableObj>()->call(*this, args);
  if (fn.kind() == Kind::kObject)
    if (auto* l = dynamic_cast<LoopObj*>(fn.as<AttrObject>()); l && l->recurse) return l->recurse(*this, args);
  return error("'%s' object is not callable", fn.type_name().c_str());
}

Result<Value> Interp::eval_call(const Expr& e, const ScopePtr& scope) {
  KILN_ASSIGN_OR_RETURN(Value fn, eval(*e.a, scope));
  CallArgs args;
  KILN_TRY(eval_args(e, scope, &args));
  at(e.line, e.col);
  auto r = call_value(fn, args);
  if (!r) return located(r.status());
  return r;
}

Result<Value> Interp::eval_filter(const Expr& e, const ScopePtr& scope, const Value* input) {
  Value v;
  if (!e.a) {
    v = input ? *input : Value::string("");
  } else if (input && e.a->kind == EK::kFilter) {
    KILN_ASSIGN_OR_RETURN(v, eval_filter(*e.a, scope, input));
  } else {
    KILN_ASSIGN_OR_RETURN(v, eval(*e.a, scope));
  }
  CallArgs args;
  KILN_TRY(eval_args(e, scope, &args));
  at(e.line, e.col);
  if (e.unknown) return located(error("No filter named '%s' found.", e.name.c_str()));
  auto r = apply_filter(e.name, v, args);
  if (!r) return located(r.status());
  return r;
}

namespace {
Result<Value> slice_value(Interp& in, const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  auto as_index = [](const Value& v, bool* none, int64_t* out) {
    if (v.is_none() || v.is_undefined()) {
      *none = true;
      return true;
    }
    *none = false;
    if (v.is_int() || v.is_bool()) {
      *out = v.as_int();
      return true;
    }
    return false;
  };
  bool n0, n1, n2;
  int64_t a = 0, b = 0, st = 1;
  if (!as_index(start, &n0, &a) || !as_index(stop, &n1, &b) || !as_index(step_v, &n2, &st))
    return Value::undefined("slice indices must be integers or None");  // jinja2 turns the TypeError into Undefined
  if (n2) st = 1;
  if (st == 0) return in.error("slice step cannot be zero");
  std::vector<uint32_t> cps;
  const bool is_str = obj.is_string();
  int64_t len;
  if (is_str) {
    cps = decode_utf8_all(obj.str());
    len = static_cast<int64_t>(cps.size());
  } else if (obj.is_list()) {
    len = static_cast<int64_t>(obj.items().size());
  } else if (obj.is_undefined()) {
    return Status(ErrorCode::kInvalidArgument, obj.str());
  } else {
    return Value::undefined("'" + obj.type_name() + "' object is not subscriptable");
  }
  // Python's slice.indices()
  auto norm = [&](bool none, int64_t v, int64_t def_pos, int64_t def_neg) {
    if (none) return st > 0 ? def_pos : def_neg;
    if (v < 0) {
      v += len;
      if (v < 0) v = st > 0 ? 0 : -1;
    } else if (v >= len) {
      v = st > 0 ? len : len - 1;
    }
    return v;
  };
  const int64_t lo = norm(n0, a, 0, len - 1), hi = norm(n1, b, len, -1);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t i = lo; i < hi; i += st) idx.push_back(i);
  else
    for (int64_t i = lo; i > hi; i += st) idx.push_back(i);
  if (is_str) {
    std::string s;
    for (int64_t i : idx) append_utf8(&s, cps[static_cast<size_t>(i)]);
    return Value::string(std::move(s), obj.is_safe());
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.is_tuple());
}
}  // namespace

Result<Value> Interp::eval_expr(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case EK::kConst: return e.value;
    case EK::kName: return lookup(e.name, scope);
    case EK::kList:
    case EK::kTuple: {
      List l;
      for (const auto& x : e.args) {
        KILN_ASSIGN_OR_RETURN(Value v, eval(*x, scope));
        l.push_back(std::move(v));
      }
      return Value::list(std::move(l), e.kind == EK::kTuple);
    }
    case EK::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        KILN_ASSIGN_OR_RETURN(Value k, eval(*e.args[i], scope));
        KILN_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1], scope));
        if ((k.is_list() && !k.is_tuple()) || k.is_dict() || k.is_undefined()) {
          at(e.args[i]->line, e.args[i]->col);
          return located(error("unhashable type: '%s'", k.type_name().c_str()));
        }
        d.set(std::move(k), std::move(v));
      }
      return Value::dict(std::move(d));
    }
    case EK::kGetAttr: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.a, scope));
      at(e.line, e.col);
      auto r = getattr(obj, e.name);
      if (!r) return located(r.status());
      return r;
    }
    case EK::kGetItem: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.a, scope));
      KILN_ASSIGN_OR_RETURN(Value key, eval(*e.b, scope));
      at(e.line, e.col);
      auto r = getitem(obj, key);
      if (!r) return located(r.status());
      return r;
    }
    case EK::kSlice: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.a, scope));
      Value parts[3] = {Value::none(), Value::none(), Value::none()};
      const Expr* pe[3] = {e.b.get(), e.c.get(), e.args.empty() ? nullptr : e.args[0].get()};
      for (int i = 0; i < 3; ++i)
        if (pe[i]) {
          KILN_ASSIGN_OR_RETURN(parts[i], eval(*pe[i], scope));
        }
      at(e.line, e.col);
      auto r = slice_value(*this, obj, parts[0], parts[1], parts[2]);
      if (!r) return located(r.status());
      return r;
    }
    case EK::kCall: return eval_call(e, scope);
    case EK::kFilter: return eval_filter(e, scope, nullptr);
    case EK::kTest: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.a, scope));
      CallArgs args;
      KILN_TRY(eval_args(e, scope, &args));
      at(e.line, e.col);
      if (e.unknown) return located(error("No test named '%s' found.", e.name.c_str()));
      auto r = apply_test(e.name, v, args);
      if (!r) return located(r.status());
      return Value::boolean(*r);
    }
    case EK::kNeg:
    case EK::kPos: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.a, scope));
      at(e.line, e.col);
      if (v.is_undefined()) return located(Status(ErrorCode::kInvalidArgument, v.str()));
      if (!v.is_number())
        return located(error("bad operand type for unary %s: '%s'", e.kind == EK::kNeg ? "-" : "+", v.type_name().c_str()));
      if (e.kind == EK::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::number(-v.as_float());
      if (v.as_int() == INT64_MIN) return located(error("integer overflow"));
      return Value::integer(-v.as_int());
    }
    case EK::kNot: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.a, scope));
      return Value::boolean(!v.truthy());
    }
    case EK::kBinary: {
      KILN_ASSIGN_OR_RETURN(Value a, eval(*e.a, scope));
      KILN_ASSIGN_OR_RETURN(Value b, eval(*e.b, scope));
      at(e.line, e.col);
      auto r = binary_op(*this, e.name, a, b);
      if (!r) return located(r.status());
      return r;
    }
    case EK::kAnd: {
      KILN_ASSIGN_OR_RETURN(Value a, eval(*e.a, scope));
      if (!a.truthy()) return a;
      return eval(*e.b, scope);
    }
    case EK::kOr: {
      KILN_ASSIGN_OR_RETURN(Value a, eval(*e.a, scope));
      if (a.truthy()) return a;
      return eval(*e.b, scope);
    }
    case EK::kCompare: {
      KILN_ASSIGN_OR_RETURN(Value left, eval(*e.a, scope));
      for (size_t i = 0; i < e.ops.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(Value right, eval(*e.args[i], scope));
        at(e.line, e.col);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") {
          r = equals(left, right);
        } else if (op == "!=") {
          r = !equals(left, right);
        } else if (op == "in" || op == "notin") {
          auto c = contains(*this, right, left);
          if (!c) return located(c.status());
          r = op == "in" ? *c : !*c;
        } else {
          auto c = compare(left, right);
          if (!c) {
            if (!left.is_undefined() && !right.is_undefined())
              return located(error("'%s' not supported between instances of '%s' and '%s'", op.c_str(),
                                   left.type_name().c_str(), right.type_name().c_str()));
            return located(c.status());
          }
          r = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
        }
        if (!r) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::kConcat: {
      std::string s;
      for (const auto& x : e.args) {
        KILN_ASSIGN_OR_RETURN(Value v, eval(*x, scope));
        s += to_str(v);
        at(e.line, e.col);
        KILN_TRY(located(check_string(s.size())));
      }
      return Value::string(std::move(s));
    }
    case EK::kCond: {
      KILN_ASSIGN_OR_RETURN(Value t, eval(*e.a, scope));
      if (t.truthy()) return eval(*e.b, scope);
      if (e.c) return eval(*e.c, scope);
      return Value::undefined(strprintf("the inline if-expression on line %d evaluated to false and no else section was defined.", e.line));
    }
  }
  return Value();
}

Result<Value> Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::kUndefined: return Status(ErrorCode::kInvalidArgument, obj.str());
    case Kind::kNamespace: {
      if (const Value* v = obj.as<NamespaceObj>()->attrs.find(name)) return *v;
      return Value::undefined("'Namespace' object has no attribute '" + name + "'");
    }
    case Kind::kObject: return obj.as<AttrObject>()->getattr(name);
    case Kind::kDict: {
      // Python attribute first (dict methods), then the key, as jinja2's getattr does.
      KILN_ASSIGN_OR_RETURN(Value m, builtin_attr(*this, obj, name));
      if (!m.is_undefined() || !m.str().empty()) return m;
      if (const Value* v = obj.dict().find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    default: {
      KILN_ASSIGN_OR_RETURN(Value m, builtin_attr(*this, obj, name));
      if (!m.is_undefined() || !m.str().empty()) return m;
      return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
    }
  }
}

Result<Value> Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined: return Status(ErrorCode::kInvalidArgument, obj.str());
    case Kind::kDict: {
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    }
    case Kind::kList:
    case Kind::kString: {
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.as_int();
        if (obj.is_list()) {
          const int64_t n = static_cast<int64_t>(obj.items().size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
        } else {
          const auto cps = decode_utf8_all(obj.str());
          const int64_t n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) {
            std::string c;
            append_utf8(&c, cps[static_cast<size_t>(i)]);
            return Value::string(std::move(c), obj.is_safe());
          }
        }
        return Value::undefined("'" + obj.type_name() + " object' has no element " + std::to_string(key.as_int()));
      }
      break;
    }
    default: break;
  }
  // jinja2: obj[key] failed; a string key falls back to the attribute.
  if (key.is_string()) {
    if (obj.kind() == Kind::kNamespace || obj.kind() == Kind::kObject) return getattr(obj, key.str());
    KILN_ASSIGN_OR_RETURN(Value m, builtin_attr(*this, obj, key.str()));
    if (!m.is_undefined() || !m.str().empty()) return m;
    return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + key.str() + "'");
  }
  return Value::undefined("'" + obj.type_name() + " object' has no element " + repr(key));
}

}  // namespace kiln::tpl
