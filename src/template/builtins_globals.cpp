// Python methods of builtin values (str, list, dict: CPython's semantics, as jinja2's sandbox exposes them) and the
// template globals (range, dict, namespace, cycler, joiner, self, lipsum, transformers' raise_exception and
// strftime_now). Operators, filters and tests: builtins.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <unordered_set>

#include "template/interp.h"
#include "template/strings.h"

namespace kiln::tpl {

// ---------------------------------------------------------------- methods of builtin values

Result<Value> builtin_attr(Interp& in, const Value& obj, const std::string& name) {
  (void)in;
  auto unsafe = [&]() {
    return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  };
  if (!name.empty() && name[0] == '_') return unsafe();
  auto method = [&](Builtin f) { return make_builtin(name, std::move(f)); };
  if (obj.is_string()) {
    if (!is_str_method(name)) return Value();
    Value self = obj;
    std::string n = name;
    return method([self, n](Interp& i, CallArgs& a) { return call_str_method(i, self, n, a); });
  }
  if (obj.is_dict()) {
    static const std::unordered_set<std::string> mutating = {"pop", "popitem", "setdefault", "update", "clear"};
    if (mutating.count(name)) return unsafe();
    Value self = obj;
    if (name == "get")
      return method([self](Interp& i, CallArgs& a) -> Result<Value> {
        if (a.pos.empty() || a.pos.size() > 2 || !a.kw.empty()) return i.error("get expected 1 or 2 arguments");
        if (const Value* v = self.dict().find(a.pos[0])) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    if (name == "items" || name == "keys" || name == "values") {
      std::string n = name;
      return method([self, n](Interp& i, CallArgs& a) -> Result<Value> {
        if (!a.pos.empty() || !a.kw.empty()) return i.error("%s() takes no arguments", n.c_str());
        List out;
        for (const auto& [k, v] : self.dict().entries)
          out.push_back(n == "items" ? Value::list({k, v}, true) : n == "keys" ? k : v);
        return Value::list(std::move(out));
      });
    }
    if (name == "copy") return method([self](Interp&, CallArgs&) -> Result<Value> { return Value::dict(self.dict()); });
    return Value();
  }
  if (obj.is_list()) {
    static const std::unordered_set<std::string> mutating = {"append", "extend", "insert", "pop", "remove",
                                                            "reverse", "sort", "clear"};
    if (mutating.count(name) && !obj.is_tuple()) return unsafe();
    Value self = obj;
    if (name == "index" || name == "count") {
      std::string n = name;
      return method([self, n](Interp& i, CallArgs& a) -> Result<Value> {
        if (a.pos.size() != 1) return i.error("%s() takes exactly one argument", n.c_str());
        int64_t c = 0;
        for (size_t k = 0; k < self.items().size(); ++k)
          if (equals(self.items()[k], a.pos[0])) {
            if (n == "index") return Value::integer(static_cast<int64_t>(k));
            ++c;
          }
        if (n == "index") return i.error("%s is not in list", repr(a.pos[0]).c_str());
        return Value::integer(c);
      });
    }
    if (name == "copy" && !obj.is_tuple())
      return method([self](Interp&, CallArgs&) -> Result<Value> { return Value::list(self.items()); });
    return Value();
  }
  return Value();
}

// ---------------------------------------------------------------- globals

namespace {
// jinja2's `self` (the template's blocks); chat templates have no blocks, so it has no attributes.
struct TemplateRefObj : AttrObject {
  std::string type_name() const override { return "TemplateReference"; }
  Value getattr(const std::string& n) override { return Value::undefined("there is no block named '" + n + "'"); }
};

struct CyclerObj : AttrObject {
  List items;
  size_t pos = 0;
  void clear_refs() override { items.clear(); }
  std::string type_name() const override { return "Cycler"; }
  Value getattr(const std::string& n) override {
    if (n == "current") return items.empty() ? Value::undefined("empty cycler") : items[pos];
    if (n == "next") {
      CyclerObj* self = this;
      return make_builtin("next", [self](Interp& in, CallArgs&) -> Result<Value> {
        if (self->items.empty()) return in.error("cycler has no items");
        Value v = self->items[self->pos];
        self->pos = (self->pos + 1) % self->items.size();
        return v;
      });
    }
    if (n == "reset") {
      CyclerObj* self = this;
      return make_builtin("reset", [self](Interp&, CallArgs&) -> Result<Value> {
        self->pos = 0;
        return Value::none();
      });
    }
    return Value::undefined("'Cycler' object has no attribute '" + n + "'");
  }
};
}  // namespace

void add_builtin_globals(Scope* s) {
  s->set("range", make_builtin("range", [](Interp& in, CallArgs& a) -> Result<Value> {
    if (!a.kw.empty()) return in.error("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) return in.error("range expected 1 to 3 arguments, got %zu", a.pos.size());
    for (const Value& v : a.pos)
      if (!v.is_int() && !v.is_bool())
        return in.error("'%s' object cannot be interpreted as an integer", v.type_name().c_str());
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].as_int();
    } else {
      start = a.pos[0].as_int();
      stop = a.pos[1].as_int();
      if (a.pos.size() == 3) step = a.pos[2].as_int();
    }
    if (step == 0) return in.error("range() arg 3 must not be zero");
    const __int128 span = step > 0 ? (static_cast<__int128>(stop) - start + step - 1) / step
                                   : (static_cast<__int128>(start) - stop - step - 1) / -step;
    const int64_t n = span > 0 ? static_cast<int64_t>(std::min<__int128>(span, INT64_MAX)) : 0;
    if (n > in.limits().max_range)
      return in.error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%lld).",
                      static_cast<long long>(in.limits().max_range));
    List out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out.push_back(Value::integer(start + i * step));
    return Value::list(std::move(out));
  }));
  auto make_dict = [](Interp& in, CallArgs& a, Dict* d) -> Status {
    if (a.pos.size() > 1) return in.error("expected at most 1 positional argument, got %zu", a.pos.size());
    if (!a.pos.empty()) {
      if (!a.pos[0].is_dict()) return in.error("cannot convert %s to a mapping", a.pos[0].type_name().c_str());
      *d = a.pos[0].dict();
    }
    for (auto& [k, v] : a.kw) d->set(Value::string(k), v);
    return Status::ok();
  };
  s->set("dict", make_builtin("dict", [make_dict](Interp& in, CallArgs& a) -> Result<Value> {
    Dict d;
    KILN_TRY(make_dict(in, a, &d));
    return Value::dict(std::move(d));
  }));
  s->set("namespace", make_builtin("namespace", [make_dict](Interp& in, CallArgs& a) -> Result<Value> {
    auto ns = std::make_shared<NamespaceObj>();
    in.track(ns);
    KILN_TRY(make_dict(in, a, &ns->attrs));
    return Value::from_object(Kind::kNamespace, ns);
  }));
  s->set("cycler", make_builtin("cycler", [](Interp& in, CallArgs& a) -> Result<Value> {
    auto c = std::make_shared<CyclerObj>();
    in.track(c);
    c->items = a.pos;
    return Value::from_object(Kind::kObject, c);
  }));
  s->set("joiner", make_builtin("joiner", [](Interp&, CallArgs& a) -> Result<Value> {
    const std::string sep = a.pos.empty() ? ", " : to_str(a.pos[0]);
    auto used = std::make_shared<bool>(false);
    return make_builtin("joiner", [sep, used](Interp&, CallArgs&) -> Result<Value> {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  }));
  s->set("self", Value::from_object(Kind::kObject, std::make_shared<TemplateRefObj>()));
  // jinja2's lipsum() is random text: defined (as in jinja2) but refused.
  s->set("lipsum", make_builtin("lipsum", [](Interp& in, CallArgs&) -> Result<Value> {
    return in.error("lipsum() (random text) is not supported by kiln's template engine");
  }));
  // transformers' globals
  s->set("raise_exception", make_builtin("raise_exception", [](Interp& in, CallArgs& a) -> Result<Value> {
    return Status(ErrorCode::kInvalidArgument,
                  "raise_exception: " + (a.pos.empty() ? std::string() : to_str(a.pos[0])));
    (void)in;
  }));
  s->set("strftime_now", make_builtin("strftime_now", [](Interp& in, CallArgs& a) -> Result<Value> {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) return in.error("strftime_now(format) takes one string");
    const std::time_t t = in.now ? in.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    const std::string& fmt = a.pos[0].str();
    if (fmt.empty()) return Value::string("");
    std::vector<char> buf(fmt.size() * 8 + 256);
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    return Value::string(std::string(buf.data(), n));
  }));
}

}  // namespace kiln::tpl
