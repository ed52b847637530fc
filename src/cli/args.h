// Declarative argument parser for the subcommands. Flag names follow llama.cpp where one exists, including its
// multi-letter single-dash forms (-ngl). Every subcommand gets -h/--help. Errors name the offending argument.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace kiln::cli {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);

  // names: e.g. {"-m", "--model"}. Values are written when the option is seen.
  void flag(std::vector<std::string> names, bool* out, std::string help);
  void option(std::vector<std::string> names, std::string* out, std::string metavar, std::string help);
  void option(std::vector<std::string> names, int64_t* out, std::string metavar, std::string help);
  void option(std::vector<std::string> names, int* out, std::string metavar, std::string help);
  void option(std::vector<std::string> names, float* out, std::string metavar, std::string help);
  void option(std::vector<std::string> names, uint64_t* out, std::string metavar, std::string help);
  // An option parsed by `set` (called with the name as written and the value); e.g. -s, where -1 means random.
  void option(std::vector<std::string> names, std::function<Status(const std::string& name, const std::string& value)> set,
              std::string metavar, std::string help);
  // An option whose value may be left out (llama.cpp's `-fa [on|off|auto]`): the next argument is its value when
  // it is one of `values`, else `absent` is stored.
  void optional_value(std::vector<std::string> names, std::string* out, std::vector<std::string> values,
                      std::string absent, std::string metavar, std::string help);
  // A repeatable option: every occurrence is appended.
  void multi(std::vector<std::string> names, std::vector<std::string>* out, std::string metavar, std::string help);
  void positional(std::string name, std::string* out, std::string help, bool required = true);

  // Parses argv[0..argc) (the arguments after the subcommand name).
  Status parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  std::string usage() const;
  // Whether an option (by any of its names) appeared on the command line.
  bool seen(const std::string& name) const;

 private:
  struct Opt {
    std::vector<std::string> names;
    std::string metavar, help;
    bool takes_value = true;
    bool seen = false;
    std::function<Status(const std::string& name, const std::string& value)> set;
    bool value_optional = false;        // optional_value(): the value may be left out
    std::vector<std::string> values;    // ... the values it takes when given
    std::string absent;                 // ... what is stored when it is left out
  };
  struct Pos {
    std::string name, help;
    std::string* out;
    bool required;
  };
  Opt* find(const std::string& name);
  static Opt make_opt(std::vector<std::string> names, std::string metavar, std::string help, bool takes_value,
                      std::function<Status(const std::string&, const std::string&)> set);

  std::string command_, summary_;
  std::vector<Opt> opts_;
  std::vector<Pos> pos_;
  bool help_ = false;
};

// Subcommand registry: each cli/<name>.cpp registers itself with a static Command object.
struct Command {
  using Fn = int (*)(int argc, char** argv);
  Command(const char* name, const char* summary, Fn fn);
  const char* name;
  const char* summary;
  Fn fn;
};
const std::vector<const Command*>& commands();

// Prints "kiln <cmd>: error: <status>" to stderr and returns the exit code 1.
int fail(const char* command, const Status& status);

// Parses "1,2,3" / "[1, 2, 3]" / "1 2 3" into ids; error names the bad element.
Result<std::vector<int32_t>> parse_id_list(const std::string& text);

}  // namespace kiln::cli

#define KILN_REGISTER_COMMAND(name, summary, fn) \
  static const ::kiln::cli::Command KILN_CONCAT(kiln_command_, __LINE__)(name, summary, fn)
