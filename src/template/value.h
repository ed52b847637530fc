// The value model of the template interpreter: Python's object model as far as chat templates can observe it.
//
// Invariants:
//  - Values are immutable once built, except Namespace objects (which `{% set ns.x = ... %}` writes) and
//    iterator positions (a generator is consumed by iterating it, as in Python). Lists and dicts are shared by
//    pointer; the sandbox (like jinja2's ImmutableSandboxedEnvironment) forbids every mutating method, so
//    sharing is never observable.
//  - Strings are UTF-8 bytes; Python counts and indexes code points, so length/indexing/slicing decode.
//  - Integers are int64 (Python's are unbounded): overflow is an error, never wraparound.
//  - bool is a separate kind but behaves as Python's int subclass (True + 1 == 2, True == 1, 1 and True are the
//    same dict key).
//  - Undefined is jinja2's default Undefined: prints as "", iterates as empty, is falsy, has length 0, and raises
//    (an error value, with its hint) on attribute access, arithmetic, comparison, calls and JSON serialization.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/status.h"
#include "util/utf8.h"

namespace kiln::tpl {

class Value;
using List = std::vector<Value>;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,       // list or tuple (flag)
  kDict,
  kNamespace,  // jinja2 namespace(): a mutable attribute bag
  kCallable,   // macro, builtin function, bound method
  kIterator,   // a one-shot iterator (generator, list_reverseiterator)
  kObject,     // other read-only objects with attributes (loop, cycler, joiner)
};

// Heap part of a value; one subclass per kind that has one.
struct Object {
  virtual ~Object() = default;
  // Drops references to other values. Objects that can sit in a reference cycle (a macro and the scope that
  // holds it, a namespace holding itself, a loop object stored in an outer namespace) are registered with the
  // interpreter, which calls this when a render ends so shared_ptr cycles never leak.
  virtual void clear_refs() {}
};

struct Dict;
struct NamespaceObj;
struct IteratorObj;
struct CallableObj;
struct AttrObject;

class Value {
 public:
  Value() = default;  // Undefined with no hint
  static Value undefined(std::string hint);
  static Value none() { Value v; v.kind_ = Kind::kNone; return v; }
  static Value boolean(bool b) { Value v; v.kind_ = Kind::kBool; v.i_ = b; return v; }
  static Value integer(int64_t i) { Value v; v.kind_ = Kind::kInt; v.i_ = i; return v; }
  static Value number(double f) { Value v; v.kind_ = Kind::kFloat; v.f_ = f; return v; }
  static Value string(std::string s, bool safe = false);
  static Value list(List items, bool tuple = false);
  static Value dict(Dict d);
  static Value from_object(Kind kind, std::shared_ptr<Object> obj) { Value v; v.kind_ = kind; v.obj_ = std::move(obj); return v; }
  // Insertion order of objects is kept (Python dicts are ordered): callers parse with ordered_json.
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_safe() const { return kind_ == Kind::kString && safe_; }  // Markup (from |safe)

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }                   // kInt and kBool
  double as_float() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }  // any number
  const std::string& str() const;                         // kString (or the Undefined hint)
  const List& items() const;                              // kList
  const Dict& dict() const;                               // kDict
  const std::shared_ptr<Object>& obj() const { return obj_; }
  template <class T> T* as() const { return static_cast<T*>(obj_.get()); }

  // Python truthiness.
  bool truthy() const;
  // Python type name, for error messages ("str", "int", "dict", "NoneType", "Undefined", ...).
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool safe_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<Object> obj_;
};

// Insertion-ordered dict with Python key equality (1 == 1.0 == True); linear lookup: template dicts are small.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces an equal key in place, else appends
};

struct StringObj : Object {
  explicit StringObj(std::string s) : s(std::move(s)) {}
  std::string s;
};
struct ListObj : Object {
  explicit ListObj(List l) : items(std::move(l)) {}
  List items;
};
struct DictObj : Object {
  explicit DictObj(Dict d) : d(std::move(d)) {}
  Dict d;
};
struct NamespaceObj : Object {
  Dict attrs;
  void clear_refs() override { attrs.entries.clear(); }
};
// One-shot iterator: the items are computed eagerly (filters here have no side effects other than errors),
// `pos` advances as Python's iterator would, so a second iteration of a consumed generator is empty.
struct IteratorObj : Object {
  List items;
  size_t pos = 0;
  std::string type_name;  // "generator", "list_reverseiterator", ...
};
// Objects with read-only attributes (loop, cycler, joiner); methods are returned as callables.
struct AttrObject : Object {
  virtual std::string type_name() const = 0;
  // Undefined when absent.
  virtual Value getattr(const std::string& name) = 0;
};

// ---- conversions and operators (Python semantics) ----

// str(v): what {{ v }} prints. Undefined -> "".
std::string to_str(const Value& v);
// repr(v) (used inside containers: str([1, 'a']) == "[1, 'a']").
std::string repr(const Value& v);
std::string py_repr_string(std::string_view s);
std::string py_float_repr(double d);

// ==, with Python semantics (numbers across int/float/bool, deep for lists/dicts). Undefined == Undefined.
bool equals(const Value& a, const Value& b);
// Python's a < b for the comparable pairs; error for the rest ("'<' not supported between ...").
Result<int> compare(const Value& a, const Value& b);  // -1, 0, 1

// json.dumps with transformers' defaults (ensure_ascii=False); error for values JSON cannot hold (Undefined,
// generators, functions, namespaces), with Python's message.
struct JsonOptions {
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;  // the per-level indent string when has_indent
  std::string item_sep = ", ", key_sep = ": ";
};
Status to_json(const Value& v, const JsonOptions& opt, std::string* out, int depth = 0);
// Values back to nlohmann json (for the callers of render: kwargs defaults etc.). Errors as to_json.
Result<nlohmann::ordered_json> to_nlohmann(const Value& v, int depth = 0);

// ---- UTF-8 helpers (Python indexes by code point) ----
// (decoding and encoding: util/utf8.h)
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);  // cps[begin, end) as UTF-8
size_t utf8_length(std::string_view s);  // in code points
bool is_ascii(std::string_view s);
// Python's str.isspace() for one code point, and the byte bounds of s.strip() (whitespace by that rule).
bool py_isspace(uint32_t cp);
size_t py_lstrip_begin(std::string_view s);
size_t py_rstrip_end(std::string_view s);

}  // namespace kiln::tpl
