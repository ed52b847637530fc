// Fuzz target: arbitrary bytes as a JSON schema, compiled to GBNF and on through the grammar layer, then matched
// for a few steps as fuzz_grammar does. Checks: nothing crashes, hangs or aborts; a schema error starts with
// "json schema: "; the GBNF the schema compiler writes always parses, and compiles unless a limit is hit or the
// schema refers to itself without matching anything ({"$ref": "#"}: left recursion, a rule that never finishes);
// masks equal the token-by-token check. Links only kiln_grammar.
#include <cstdint>
#include <string>

#include "fuzz_grammar_check.h"
#include "grammar/grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const kiln::grammar::Limits limits = kiln::fuzz::small_limits();
  auto gbnf = kiln::grammar::json_schema_to_gbnf(std::string_view(text), {}, limits);
  if (!gbnf) {
    kiln::fuzz::check(gbnf.status().message().rfind("json schema: ", 0) == 0, "error names the schema",
                      gbnf.status().message());
    return 0;
  }
  auto g = kiln::grammar::Grammar::from_gbnf(*gbnf, limits);
  if (!g) {
    const std::string& m = g.status().message();
    const bool expected = m.find("more than") != std::string::npos || m.find("deeper than") != std::string::npos ||
                          m.find("left-recursive") != std::string::npos || m.find("never finish") != std::string::npos;
    kiln::fuzz::check(expected, "the schema compiler writes GBNF that compiles", m + "\n" + *gbnf);
    return 0;
  }
  kiln::fuzz::exercise(*g, data, size);
  return 0;
}
