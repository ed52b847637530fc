// Template::parse/render and render_chat (see template.h).
#include "template/template.h"

#include "template/interp.h"

namespace kiln::tpl {

Result<Template> Template::parse(const std::string& source, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Program> prog, parse_template(source, name));
  Template t;
  t.prog_ = std::move(prog);
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& variables, std::time_t now,
                                     const RenderLimits& limits) const {
  if (!prog_) return make_error(ErrorCode::kInvalidArgument, "template not parsed");
  if (!variables.is_object() && !variables.is_null())
    return make_error(ErrorCode::kInvalidArgument, "template variables must be a JSON object");
  // Builtin globals below the render variables (a variable named `range` shadows the global, as in jinja2).
  auto builtins = std::make_shared<Scope>();
  add_builtin_globals(builtins.get());
  auto globals = std::make_shared<Scope>();
  globals->parent = builtins;
  if (variables.is_object())
    for (auto it = variables.begin(); it != variables.end(); ++it) globals->set(it.key(), Value::from_json(it.value()));
  Limits lim;
  lim.max_steps = limits.max_steps;
  lim.max_call_depth = limits.max_call_depth;
  lim.max_output_bytes = limits.max_output_bytes;
  lim.max_string_bytes = limits.max_string_bytes;
  lim.max_stack_bytes = limits.max_stack_bytes;
  Interp in(*prog_, lim, globals);
  in.now = now;
  return in.render();
}

Result<std::string> render_chat(const std::string& template_source, const nlohmann::ordered_json& messages,
                                const RenderOptions& opts) {
  if (!messages.is_array()) return make_error(ErrorCode::kInvalidArgument, "messages must be a JSON array");
  if (!opts.kwargs.is_object() && !opts.kwargs.is_null())
    return make_error(ErrorCode::kInvalidArgument, "chat template kwargs must be a JSON object");
  KILN_ASSIGN_OR_RETURN(Template t, Template::parse(template_source, opts.template_name));
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  // transformers: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  //                      **{**special_tokens_map, **kwargs})
  vars["bos_token"] = opts.bos_token;
  vars["eos_token"] = opts.eos_token;
  if (opts.kwargs.is_object())
    for (auto it = opts.kwargs.begin(); it != opts.kwargs.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
        return make_error(ErrorCode::kInvalidArgument,
                          "chat template kwargs may not set '%s' (it is a render argument of its own)", k.c_str());
      vars[k] = it.value();
    }
  vars["messages"] = messages;
  vars["tools"] = opts.tools;
  vars["documents"] = opts.documents;
  vars["add_generation_prompt"] = opts.add_generation_prompt;
  return t.render(vars, opts.now, opts.limits);
}

}  // namespace kiln::tpl
