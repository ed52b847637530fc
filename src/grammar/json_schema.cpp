#include "grammar/grammar.h"
#include <nlohmann/json.hpp>
namespace kiln::grammar {
Result<std::string> json_schema_to_gbnf(const nlohmann::json&, const SchemaOptions&, const Limits&) { return make_error(ErrorCode::kUnsupported, "todo"); }
}
