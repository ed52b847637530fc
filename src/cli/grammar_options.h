// The output-constraint flags of `kiln run` and `kiln chat`, as llama.cpp names them: --grammar TEXT,
// --grammar-file FILE (GBNF), -j/--json-schema SCHEMA, -jf/--json-schema-file FILE (a JSON schema, converted to
// GBNF as the server's response_format is). At most one; docs/GRAMMAR.md says what each accepts.
//   grammar_option   before the model loads: reads the file, converts the schema, parses the GBNF (errors name the
//                    flag and, for GBNF, the line and column)
//   grammar_hooks    after it loads: the grammar compiled for the model's vocabulary, as the hooks of each request
//                    (a chat compiles once and reuses it every turn)
#pragma once

#include <memory>
#include <string>

#include "cli/args.h"
#include "grammar/grammar.h"
#include "runtime/hooks.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln::cli {

struct GrammarArgs {
  std::string grammar, grammar_file, schema, schema_file;
};

void add_grammar_options(ArgParser& args, GrammarArgs* a);

struct GrammarOption {
  std::string flag;                                // the flag it came from ("" when none was given)
  std::shared_ptr<const grammar::Grammar> parsed;  // null when none was given
};
Result<GrammarOption> grammar_option(const ArgParser& args, const GrammarArgs& a);

// The hooks that constrain a request's output to the grammar; null (no hooks) when no flag was given.
Result<SequenceHooksFactory> grammar_hooks(const GrammarOption& g, const Tokenizer& tok);

}  // namespace kiln::cli
