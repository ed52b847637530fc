// Python str semantics the templates rely on: the methods (strip, split, startswith, format, ...), "%" formatting,
// and jinja2's title/indent filters. Case mapping covers ASCII, Latin-1, Greek and Cyrillic (what chat content
// realistically uppercases); other scripts pass through unchanged.
#pragma once

#include <string>
#include <vector>

#include "template/interp.h"

namespace kiln::tpl {

std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);    // str.title()
std::string jinja_title(const std::string& s); // the |title filter (splits on [-\s({\[<]+)
bool py_islower(const std::string& s);
bool py_isupper(const std::string& s);
// strip/lstrip/rstrip; chars == nullptr: whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit); sep == nullptr: runs of whitespace.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
Status py_replace(Interp& in, const std::string& s, const std::string& old, const std::string& rep, int64_t count,
                  std::string* out);
int64_t py_word_count(const std::string& s);
// str.center/ljust/rjust (align 'c', 'l', 'r').
std::string py_pad(const std::string& s, int64_t width, char fill, char align);
Result<Value> jinja_indent(Interp& in, const Value& v, CallArgs& a);
// "fmt" % args (args: a tuple, a dict for %(name)s, or one value).
Result<Value> percent_format(Interp& in, const Value& fmt, const Value& args);

bool is_str_method(const std::string& name);
Result<Value> call_str_method(Interp& in, const Value& self, const std::string& name, CallArgs& a);

}  // namespace kiln::tpl
