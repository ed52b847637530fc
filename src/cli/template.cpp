// kiln template: renders a conversation with a chat template, as transformers' apply_chat_template does, to
// stdout (for scripts and checks):
//   kiln template (-m MODEL | --chat-template-file FILE) --messages FILE.json [--tools FILE.json]
//                 [--no-generation-prompt] [--chat-template-kwargs JSON] [--bos TEXT] [--eos TEXT]
// With -m the template is the GGUF's `tokenizer.chat_template` and bos/eos default to the text of the model's
// BOS/EOS tokens; --chat-template-file overrides the model's template (bos/eos then default to empty unless -m is
// also given). A template error (including raise_exception) exits 1 with the message, which names the template
// line and column. `--parse-reply FILE` instead splits a generated reply into content / reasoning_content /
// tool_calls and prints it as JSON.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "gguf/gguf.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {

namespace {

Result<std::string> read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "%s: cannot open '%s'", what, path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<nlohmann::ordered_json> read_json(const std::string& path, const char* what) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_text(path, what));
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, "%s: '%s' is not valid JSON: %s", what, path.c_str(), e.what());
  }
}

int run_template(int argc, char** argv) {
  ArgParser args("template", "render a conversation with a chat template (like transformers' apply_chat_template)");
  std::string model, template_file, messages_file, tools_file, kwargs_text, bos, eos, reply_file;
  bool no_gen = false;
  args.option({"-m", "--model"}, &model, "FILE", "GGUF whose tokenizer.chat_template and BOS/EOS tokens to use");
  args.option({"--chat-template-file"}, &template_file, "FILE", "Jinja chat template file (overrides the model's)");
  args.option({"--messages"}, &messages_file, "FILE", "JSON array of messages (OpenAI format)");
  args.option({"--tools"}, &tools_file, "FILE", "JSON array of tool definitions (OpenAI format)");
  args.flag({"--no-generation-prompt"}, &no_gen, "do not add the assistant generation prompt");
  args.option({"--chat-template-kwargs"}, &kwargs_text, "JSON", "extra template variables, e.g. '{\"enable_thinking\": false}'");
  args.option({"--bos"}, &bos, "TEXT", "bos_token text (default: the model's BOS token, or empty)");
  args.option({"--eos"}, &eos, "TEXT", "eos_token text (default: the model's EOS token, or empty)");
  args.option({"--parse-reply"}, &reply_file, "FILE", "parse a generated reply instead; prints JSON");
  if (Status st = args.parse(argc, argv); !st) return fail("template", st);
  if (args.help_requested()) {
    std::printf("%s", args.usage().c_str());
    return 0;
  }
  if (model.empty() && template_file.empty())
    return fail("template", make_error(ErrorCode::kInvalidArgument, "give -m MODEL or --chat-template-file FILE"));

  std::string source, name;
  tpl::RenderOptions opts;
  if (!model.empty()) {
    auto gf = gguf::File::open(model);
    if (!gf) return fail("template", gf.status().with_context("-m"));
    if (template_file.empty()) {
      auto t = gf->get_str_or("tokenizer.chat_template", "");
      if (!t) return fail("template", t.status().with_context(model));
      if (t->empty())
        return fail("template", make_error(ErrorCode::kNotFound,
                                           "%s has no tokenizer.chat_template; give --chat-template-file FILE",
                                           model.c_str()));
      source = *t;
      name = model + ": tokenizer.chat_template";
    }
    auto tok = Tokenizer::from_gguf(*gf);
    if (!tok) return fail("template", tok.status().with_context(model));
    if ((*tok)->bos() >= 0) opts.bos_token = (*tok)->token_text((*tok)->bos());
    if ((*tok)->eos() >= 0) opts.eos_token = (*tok)->token_text((*tok)->eos());
  }
  if (!template_file.empty()) {
    auto t = read_text(template_file, "--chat-template-file");
    if (!t) return fail("template", t.status());
    source = *t;
    name = template_file;
  }

  if (args.seen("--parse-reply")) {
    auto text = read_text(reply_file, "--parse-reply");
    if (!text) return fail("template", text.status());
    const tpl::ParsedReply r = tpl::parse_reply(*text, tpl::reply_options_for_template(source));
    nlohmann::ordered_json j;
    j["content"] = r.content;
    j["reasoning_content"] = r.reasoning_content;
    j["tool_calls"] = nlohmann::ordered_json::array();
    for (const auto& c : r.tool_calls)
      j["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }

  if (messages_file.empty()) return fail("template", make_error(ErrorCode::kInvalidArgument, "--messages FILE is required"));
  auto messages = read_json(messages_file, "--messages");
  if (!messages) return fail("template", messages.status());
  if (!tools_file.empty()) {
    auto tools = read_json(tools_file, "--tools");
    if (!tools) return fail("template", tools.status());
    opts.tools = std::move(tools).value();
  }
  if (!kwargs_text.empty()) {
    try {
      opts.kwargs = nlohmann::ordered_json::parse(kwargs_text);
    } catch (const nlohmann::json::exception& e) {
      return fail("template", make_error(ErrorCode::kInvalidArgument, "--chat-template-kwargs: not valid JSON: %s", e.what()));
    }
    if (!opts.kwargs.is_object())
      return fail("template", make_error(ErrorCode::kInvalidArgument, "--chat-template-kwargs must be a JSON object"));
  }
  if (args.seen("--bos")) opts.bos_token = bos;
  if (args.seen("--eos")) opts.eos_token = eos;
  opts.add_generation_prompt = !no_gen;
  opts.template_name = name;
  // KILN_TEMPLATE_NOW pins strftime_now's clock (seconds since the epoch), for reproducible comparisons.
  if (const char* now = std::getenv("KILN_TEMPLATE_NOW")) opts.now = static_cast<std::time_t>(std::strtoll(now, nullptr, 10));

  auto out = tpl::render_chat(source, *messages, opts);
  if (!out) return fail("template", out.status());
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("template", "render a conversation with a chat template", run_template);

}  // namespace kiln::cli
