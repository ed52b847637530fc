#include "cli/args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace kiln::cli {

namespace {

Status bad_value(const std::string& name, const std::string& value, const char* what) {
  return make_error(ErrorCode::kInvalidArgument, "%s: '%s' is not %s", name.c_str(), value.c_str(), what);
}

Result<int64_t> parse_int(const std::string& name, const std::string& v) {
  if (v.empty()) return bad_value(name, v, "an integer");
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return bad_value(name, v, "an integer");
  return static_cast<int64_t>(x);
}

}  // namespace

ArgParser::Opt ArgParser::make_opt(std::vector<std::string> names, std::string metavar, std::string help,
                                  bool takes_value,
                                  std::function<Status(const std::string&, const std::string&)> set) {
  Opt o;
  o.names = std::move(names);
  o.metavar = std::move(metavar);
  o.help = std::move(help);
  o.takes_value = takes_value;
  o.set = std::move(set);
  return o;
}

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void ArgParser::flag(std::vector<std::string> names, bool* out, std::string help) {
  Opt o = make_opt(std::move(names), "", std::move(help), false, nullptr);
  o.set = [out](const std::string&, const std::string&) {
    *out = true;
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::option(std::vector<std::string> names, std::string* out, std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, nullptr);
  o.set = [out](const std::string&, const std::string& v) {
    *out = v;
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::option(std::vector<std::string> names, int64_t* out, std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, nullptr);
  o.set = [out](const std::string& n, const std::string& v) -> Status {
    auto r = parse_int(n, v);
    if (!r) return r.status();
    *out = *r;
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::option(std::vector<std::string> names, int* out, std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, nullptr);
  o.set = [out](const std::string& n, const std::string& v) -> Status {
    auto r = parse_int(n, v);
    if (!r) return r.status();
    if (*r < std::numeric_limits<int>::min() || *r > std::numeric_limits<int>::max())
      return bad_value(n, v, "a 32-bit integer");
    *out = static_cast<int>(*r);
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::option(std::vector<std::string> names, uint64_t* out, std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, nullptr);
  o.set = [out](const std::string& n, const std::string& v) -> Status {
    if (v.empty() || v[0] == '-') return bad_value(n, v, "a non-negative integer");
    errno = 0;
    char* end = nullptr;
    unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return bad_value(n, v, "a non-negative integer");
    *out = x;
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::option(std::vector<std::string> names, float* out, std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, nullptr);
  o.set = [out](const std::string& n, const std::string& v) -> Status {
    errno = 0;
    char* end = nullptr;
    float x = std::strtof(v.c_str(), &end);
    if (v.empty() || errno != 0 || *end != '\0') return bad_value(n, v, "a number");
    *out = x;
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::option(std::vector<std::string> names,
                       std::function<Status(const std::string& name, const std::string& value)> set,
                       std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, std::move(set));
  opts_.push_back(std::move(o));
}

void ArgParser::optional_value(std::vector<std::string> names, std::string* out, std::vector<std::string> values,
                               std::string absent, std::string metavar, std::string help) {
  Opt o = make_opt(std::move(names), "[" + std::move(metavar) + "]", std::move(help), true, nullptr);
  o.value_optional = true;
  o.values = values;
  o.absent = std::move(absent);
  o.set = [out, values](const std::string& n, const std::string& v) -> Status {
    for (const auto& x : values)
      if (x == v) {
        *out = v;
        return Status::ok();
      }
    std::string list;
    for (size_t i = 0; i < values.size(); ++i) list += (i ? ", " : "") + values[i];
    return make_error(ErrorCode::kInvalidArgument, "%s: '%s' is not one of %s", n.c_str(), v.c_str(), list.c_str());
  };
  opts_.push_back(std::move(o));
}

void ArgParser::multi(std::vector<std::string> names, std::vector<std::string>* out, std::string metavar,
                      std::string help) {
  Opt o = make_opt(std::move(names), std::move(metavar), std::move(help), true, nullptr);
  o.set = [out](const std::string&, const std::string& v) {
    out->push_back(v);
    return Status::ok();
  };
  opts_.push_back(std::move(o));
}

void ArgParser::positional(std::string name, std::string* out, std::string help, bool required) {
  pos_.push_back({std::move(name), std::move(help), out, required});
}

ArgParser::Opt* ArgParser::find(const std::string& name) {
  for (auto& o : opts_)
    for (auto& n : o.names)
      if (n == name) return &o;
  return nullptr;
}

bool ArgParser::seen(const std::string& name) const {
  for (auto& o : opts_)
    for (auto& n : o.names)
      if (n == name) return o.seen;
  return false;
}

Status ArgParser::parse(int argc, char** argv) {
  size_t next_pos = 0;
  bool only_positional = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (!only_positional && (a == "-h" || a == "--help")) {
      help_ = true;
      return Status::ok();
    }
    if (!only_positional && a == "--") {
      only_positional = true;
      continue;
    }
    if (!only_positional && a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (isdigit(a[1]) || a[1] == '.'))) {
      std::string name = a, value;
      bool has_inline = false;
      if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_inline = true;
      }
      Opt* o = find(name);
      if (!o)
        return make_error(ErrorCode::kInvalidArgument, "unknown option '%s' (see 'kiln %s -h')", name.c_str(),
                          command_.c_str());
      if (o->value_optional && !has_inline) {
        value = o->absent;
        if (i + 1 < argc)
          for (const auto& x : o->values)
            if (x == argv[i + 1]) {
              value = argv[++i];
              break;
            }
      } else if (o->takes_value && !has_inline) {
        if (i + 1 >= argc)
          return make_error(ErrorCode::kInvalidArgument, "option '%s' needs a value (%s)", name.c_str(),
                            o->metavar.c_str());
        value = argv[++i];
      } else if (!o->takes_value && has_inline) {
        return make_error(ErrorCode::kInvalidArgument, "option '%s' takes no value", name.c_str());
      }
      o->seen = true;
      KILN_TRY(o->set(name, value));
      continue;
    }
    if (next_pos >= pos_.size())
      return make_error(ErrorCode::kInvalidArgument, "unexpected argument '%s' (see 'kiln %s -h')", a.c_str(),
                        command_.c_str());
    *pos_[next_pos++].out = a;
  }
  for (size_t p = next_pos; p < pos_.size(); ++p)
    if (pos_[p].required)
      return make_error(ErrorCode::kInvalidArgument, "missing argument %s (see 'kiln %s -h')", pos_[p].name.c_str(),
                        command_.c_str());
  return Status::ok();
}

std::string ArgParser::usage() const {
  std::string s = "usage: kiln " + command_ + " [options]";
  for (auto& p : pos_) s += p.required ? " " + p.name : " [" + p.name + "]";
  s += "\n\n" + summary_ + "\n";
  if (!pos_.empty()) {
    s += "\narguments:\n";
    for (auto& p : pos_) s += strprintf("  %-28s %s\n", p.name.c_str(), p.help.c_str());
  }
  s += "\noptions:\n";
  for (auto& o : opts_) {
    std::string n;
    for (size_t i = 0; i < o.names.size(); ++i) n += (i ? ", " : "") + o.names[i];
    if (o.takes_value) n += " " + o.metavar;
    s += strprintf("  %-28s %s\n", n.c_str(), o.help.c_str());
  }
  s += strprintf("  %-28s %s\n", "-h, --help", "show this help");
  return s;
}

static std::vector<const Command*>& registry() {
  static std::vector<const Command*> r;
  return r;
}

Command::Command(const char* n, const char* s, Fn f) : name(n), summary(s), fn(f) { registry().push_back(this); }

const std::vector<const Command*>& commands() { return registry(); }

int fail(const char* command, const Status& status) {
  std::fprintf(stderr, "kiln %s: error: %s\n", command, status.to_string().c_str());
  return 1;
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  const size_t n = text.size();
  auto is_sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']'; };
  while (i < n) {
    while (i < n && is_sep(text[i])) ++i;
    if (i >= n) break;
    size_t j = i;
    while (j < n && !is_sep(text[j])) ++j;
    std::string tok = text.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v > std::numeric_limits<int32_t>::max())
      return make_error(ErrorCode::kInvalidArgument, "token id list: element %zu '%s' is not a token id", ids.size(),
                        tok.c_str());
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

}  // namespace kiln::cli
