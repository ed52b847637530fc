#include "grammar/grammar.h"

#include "grammar/automaton.h"
#include "grammar/gbnf.h"

namespace kiln::grammar {

Result<std::shared_ptr<const Grammar>> Grammar::from_gbnf(std::string_view text, const Limits& limits) {
  KILN_ASSIGN_OR_RETURN(Ast ast, parse_gbnf(text, limits));
  KILN_ASSIGN_OR_RETURN(Automaton a, build_automaton(ast, limits));
  std::shared_ptr<Grammar> g(new Grammar());
  g->automaton_ = std::make_unique<Automaton>(std::move(a));
  g->limits_ = limits;
  return std::shared_ptr<const Grammar>(std::move(g));
}

Grammar::~Grammar() = default;

size_t Grammar::num_rules() const { return automaton_->rule_names.size(); }
size_t Grammar::num_positions() const { return automaton_->num_positions; }

}  // namespace kiln::grammar
