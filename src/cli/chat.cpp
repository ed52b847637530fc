// kiln chat: an interactive conversation on stdin/stdout through the model's chat template. The conversation stays
// in the KV cache between turns: each turn re-renders the whole conversation and Generator::sync feeds only what
// differs from the cached tokens (the new turn). Works with piped stdin: one user message per line.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/model_source.h"
#include "runtime/generate.h"
#include "runtime/prompt.h"
#include "tokenizer/chat_template.h"

namespace kiln::cli {
namespace {

// The format: --chat-template NAME, else detected from the model's template, else ChatML (with a notice).
Result<ChatFormat> choose_format(const Tokenizer& tok, const std::string& override_name) {
  if (!override_name.empty()) {
    auto f = chat_format_from_name(override_name);
    if (!f) return f.status().with_context("--chat-template");
    return f;
  }
  if (tok.chat_template().empty()) {
    std::fprintf(stderr, "kiln chat: the model has no chat template; using chatml (override with --chat-template NAME)\n");
    return ChatFormat::kChatML;
  }
  auto f = detect_chat_format(tok.chat_template());
  if (!f) {
    std::fprintf(stderr, "kiln chat: %s; using chatml (override with --chat-template NAME)\n",
                 f.status().message().c_str());
    return ChatFormat::kChatML;
  }
  return f;
}

int chat_main(int argc, char** argv) {
  ArgParser args("chat", "Chat with a model on stdin/stdout (one message per line; EOF or /exit quits).");
  ModelSource src;
  CacheOptions cache_opt;
  GenerateOptions gen;
  std::string system_prompt, template_name;
  int n_batch = defaults::kBatch;
  add_model_options(args, &src);
  args.option({"-sys", "--system-prompt"}, &system_prompt, "TEXT", "system message");
  args.option({"--chat-template"}, &template_name, "NAME",
              "chat format: llama3, chatml, mistral, gemma, phi3, llama2 (default: the model's)");
  args.option({"-n", "--n-predict"}, &gen.seq.n_predict, "N", "most tokens per reply; -1: until EOG or context full");
  add_cache_options(args, &cache_opt);
  args.option({"-b", "--batch-size"}, &n_batch, "N",
              "prompt tokens per forward pass (default " + std::to_string(defaults::kBatch) + ")");
  add_sampling_options(args, &gen.seq.sampling);
  if (Status st = args.parse(argc, argv); !st) return fail("chat", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  gen.n_batch = n_batch;

  auto loaded = load_model(src, /*show_progress=*/true);
  if (!loaded) return fail("chat", loaded.status());
  Model& model = *loaded->model;
  const Tokenizer& tok = model.tokenizer();
  auto format = choose_format(tok, template_name);
  if (!format) return fail("chat", format.status());
  auto engine = make_engine(model, cache_opt, 1, n_batch);
  if (!engine) return fail("chat", engine.status());
  const int64_t n_ctx = effective_ctx(model, cache_opt.n_ctx);
  Generator g(**engine, 0, gen, n_ctx);
  if (Status st = g.validate(); !st) return fail("chat", st);

  std::vector<ChatMessage> messages;
  if (!system_prompt.empty()) messages.push_back({"system", system_prompt});
  const bool interactive = isatty(STDIN_FILENO);
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit" || line == "/quit") break;
    if (line.empty()) continue;
    messages.push_back({"user", line});

    std::vector<int32_t> ids = encode_chat(tok, *format, messages);
    if (Status st = g.sync(ids); !st) return fail("chat", st);

    std::string reply;
    auto stop = g.generate([&](int32_t, const std::string& piece) {
      reply += piece;
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    if (!stop) return fail("chat", stop.status());
    std::fputs("\n", stdout);
    std::fflush(stdout);
    messages.push_back({"assistant", reply});
    if (*stop == StopReason::kContextFull) {
      std::fprintf(stderr, "kiln chat: context full (%lld tokens): ending the conversation; raise -c for more\n",
                   (long long)n_ctx);
      break;
    }
  }
  const Timings& t = g.timings();
  std::fprintf(stderr, "kiln chat: prompt %lld tokens in %.3f s (%.2f tok/s), generated %lld tokens in %.3f s (%.2f tok/s)\n",
               (long long)t.n_prompt, t.prompt_s, t.prompt_tps(), (long long)t.n_gen, t.gen_s, t.gen_tps());
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("chat", "interactive chat through the model's chat template", chat_main);

}  // namespace kiln::cli
