// kiln: one binary, many subcommands (cli/<name>.cpp each registers one).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/args.h"

namespace {

void print_help() {
  std::printf("kiln %s: inference engine for GGUF language models\n\nusage: kiln <command> [options]\n\ncommands:\n",
              KILN_VERSION);
  auto cmds = kiln::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto* a, auto* b) { return std::strcmp(a->name, b->name) < 0; });
  for (auto* c : cmds) std::printf("  %-12s %s\n", c->name, c->summary);
  std::printf("\n'kiln <command> -h' shows a command's options.\n");
}

int run_main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? 1 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("kiln %s\n", KILN_VERSION);
    return 0;
  }
  for (auto* c : kiln::cli::commands())
    if (!std::strcmp(c->name, argv[1])) return c->fn(argc - 2, argv + 2);
  std::fprintf(stderr, "kiln: error: unknown command '%s' (see 'kiln --help')\n", argv[1]);
  return 1;
}

}  // namespace

// Errors are values throughout kiln; this is the last line for what escapes anyway (bad_alloc from a size nothing
// checked, system_error from thread creation): a message naming the command and exit status 1, never an abort.
int main(int argc, char** argv) {
  const char* cmd = argc >= 2 ? argv[1] : "";
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kiln %s: error: out of memory (an allocation failed; a size given or read is too large?)\n",
                 cmd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln %s: error: %s\n", cmd, e.what());
  } catch (...) {
    std::fprintf(stderr, "kiln %s: error: unexpected exception\n", cmd);
  }
  return 1;
}
