#include "cli/grammar_options.h"

#include <thread>

#include "cli/model_source.h"
#include "runtime/grammar_mask.h"

namespace kiln::cli {

void add_grammar_options(ArgParser& args, GrammarArgs* a) {
  args.option({"--grammar"}, &a->grammar, "TEXT", "GBNF grammar the output must follow (docs/GRAMMAR.md)");
  args.option({"--grammar-file"}, &a->grammar_file, "FILE", "read the GBNF grammar from a file");
  args.option({"-j", "--json-schema"}, &a->schema, "SCHEMA",
              "JSON schema the output must follow, e.g. '{\"type\": \"object\"}' (docs/GRAMMAR.md)");
  args.option({"-jf", "--json-schema-file"}, &a->schema_file, "FILE", "read the JSON schema from a file");
}

Result<GrammarOption> grammar_option(const ArgParser& args, const GrammarArgs& a) {
  const char* flags[] = {"--grammar", "--grammar-file", "--json-schema", "--json-schema-file"};
  std::string given;
  for (const char* f : flags) {
    if (!args.seen(f)) continue;
    if (!given.empty())
      return make_error(ErrorCode::kInvalidArgument, "pass only one of %s and %s (each constrains the whole output)",
                        given.c_str(), f);
    given = f;
  }
  GrammarOption out;
  if (given.empty()) return out;
  out.flag = given;
  const size_t max_bytes = grammar::Limits{}.max_text_bytes;
  std::string text;
  if (given == "--grammar" || given == "--json-schema") {
    text = given == "--grammar" ? a.grammar : a.schema;
  } else {
    KILN_ASSIGN_OR_RETURN(text, read_bounded(given == "--grammar-file" ? a.grammar_file : a.schema_file, max_bytes,
                                             given, "the limit of a grammar's text"));
  }
  if (text.empty()) return make_error(ErrorCode::kInvalidArgument, "%s: empty", given.c_str());
  if (given == "--json-schema" || given == "--json-schema-file") {
    auto gbnf = grammar::json_schema_to_gbnf(std::string_view(text));
    if (!gbnf) return gbnf.status().with_context(given);
    text = std::move(gbnf).value();
  }
  auto parsed = grammar::Grammar::from_gbnf(text);
  if (!parsed) return parsed.status().with_context(given);
  out.parsed = std::move(parsed).value();
  return out;
}

Result<SequenceHooksFactory> grammar_hooks(const GrammarOption& g, const Tokenizer& tok) {
  if (!g.parsed) return SequenceHooksFactory{};
  auto vocab = grammar::VocabIndex::build(grammar_vocabulary(tok));
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto compiled = grammar::CompiledGrammar::compile(g.parsed, std::move(vocab), threads);
  if (!compiled) return compiled.status().with_context(g.flag);
  return ::kiln::grammar_hooks(std::move(compiled).value());
}

}  // namespace kiln::cli
