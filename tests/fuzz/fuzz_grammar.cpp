// Fuzz target: arbitrary bytes as GBNF text, compiled (parser, automaton, token-mask cache over a small
// vocabulary of single bytes and multi-byte pieces) and matched for a few steps chosen by the input.
// Checks: nothing crashes, hangs or aborts (small limits keep one input fast); an error names "grammar: "; every
// mask bit equals the token-by-token check (the cache's context-independent split loses nothing); a masked token
// is always accepted; rollback restores the mask. Links only kiln_grammar.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_grammar_check.h"
#include "grammar/grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto g = kiln::grammar::Grammar::from_gbnf(text, kiln::fuzz::small_limits());
  if (!g) {
    kiln::fuzz::check(g.status().message().rfind("grammar: ", 0) == 0, "error names the grammar", g.status().message());
    return 0;
  }
  kiln::fuzz::exercise(*g, data, size);
  return 0;
}
