// Fuzz target: arbitrary bytes as the JSON body of POST /v1/chat/completions or /v1/completions, through the
// server's request checks (server/openai.h parse_chat / parse_completion), exactly as server.cpp calls them: the
// body parsed by nlohmann (a parse error is the 400 server.cpp answers before this point), then the checks, with
// a JSON type exception the checks missed caught as server.cpp does (a 400 naming it).
// Input: byte 0 bit 1 clear: bit 0 = chat (1) or completions (0); bit 1 set: bit 0 = Responses (1) or Anthropic
// Messages (0), whose bodies become chat bodies (server/dialects.h) that parse_chat checks; the rest = the body.
// Checks: nothing crashes, hangs or grows without bound; an error is a 4xx with a message; an accepted request has
// every prompt token id inside the vocabulary, every prompt within the context, n and the choice count bounded, the
// sampling fields valid for the sampler (logit_bias ids in the vocabulary, ranges).
// The tokenizer is the committed gpt-2 vocabulary (tests/data/tokenizer.tar.xz), the chat template the corpus's qwen3.jinja (tools,
// reasoning); found through $KILN_TEST_DATA_DIR, else relative to this source file.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_data.h"
#include "runtime/prompt.h"
#include "runtime/sampler.h"
#include "server/dialects.h"
#include "server/openai.h"
#include "tokenizer/tokenizer.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz_server: %s\n", what.c_str());
  std::abort();
}

void check(bool ok, const char* what, const std::string& detail) {
  if (!ok) die(std::string("check failed: ") + what + ": " + detail);
}

struct Env {
  std::unique_ptr<kiln::Tokenizer> tok;
  std::unique_ptr<kiln::ChatPrompt> chat;
  kiln::server::ParseContext ctx;
};

const Env& env() {
  static const Env e = [] {
    Env e;
    e.tok = kiln::fuzz::load_vocab("gpt-2", "fuzz_server");
    std::ifstream in(kiln::fuzz::fuzz_dir() + "/corpus/template/qwen3.jinja");
    std::stringstream src;
    src << in.rdbuf();
    if (src.str().empty()) die("corpus/template/qwen3.jinja not found");
    kiln::ChatPromptOptions opts;
    opts.template_source = src.str();
    opts.template_name = "qwen3.jinja";
    auto cp = kiln::ChatPrompt::create(*e.tok, opts);
    if (!cp) die(cp.status().to_string());
    e.chat = std::make_unique<kiln::ChatPrompt>(std::move(cp).value());
    e.ctx.tok = e.tok.get();
    e.ctx.chat = e.chat.get();
    e.ctx.max_seq_ctx = 2048;
    e.ctx.model_id = "kiln-fuzz";
    return e;
  }();
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 64 * 1024) return 0;
  const Env& e = env();
  const bool chat = data[0] & 1;
  const std::string body_text(reinterpret_cast<const char*>(data + 1), size - 1);
  const nlohmann::json body = nlohmann::json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;  // server.cpp answers 400 "invalid JSON" before the checks
  kiln::server::ParsedRequest pr;
  std::optional<kiln::server::ApiError> err;
  const bool dialect = data[0] & 2;
  try {
    if (dialect) {
      const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body_text);
      nlohmann::ordered_json converted;
      if (chat) {
        kiln::server::ResponsesOptions o;
        err = kiln::server::responses_to_chat(ordered, &converted, &o);
      } else {
        kiln::server::MessagesOptions o;
        err = kiln::server::messages_to_chat(ordered, false, &converted, &o);
      }
      if (!err) err = kiln::server::parse_chat(nlohmann::json::parse(converted.dump()), e.ctx, &pr, &converted);
    } else if (chat) {
      const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body_text);
      err = kiln::server::parse_chat(body, e.ctx, &pr, &ordered);
    } else {
      err = kiln::server::parse_completion(body, e.ctx, &pr);
    }
  } catch (const std::exception&) {  // server.cpp: a 400 "bad request: ..."
    return 0;
  }
  static const bool verbose = std::getenv("KILN_FUZZ_VERBOSE") != nullptr;  // seed authoring: what each input got
  if (verbose)
    std::fprintf(stderr, "fuzz_server: %s\n", err ? (err->param + ": " + err->message).c_str() : "accepted");
  if (err) {
    check(err->status >= 400 && err->status < 500, "an error is a 4xx", std::to_string(err->status));
    check(!err->message.empty(), "an error has a message", err->param);
    (void)kiln::server::dump(kiln::server::error_body(*err));
    return 0;
  }
  check(!pr.prompts.empty(), "an accepted request has a prompt", body_text);
  for (const auto& p : pr.prompts) {
    check(static_cast<int64_t>(p.size()) <= e.ctx.max_seq_ctx, "prompt within the context", std::to_string(p.size()));
    for (int32_t id : p) check(id >= 0 && id < e.tok->n_vocab(), "prompt ids in the vocabulary", std::to_string(id));
  }
  check(pr.n >= 1 && pr.n <= 16, "n in range", std::to_string(pr.n));
  check(pr.prompts.size() * static_cast<size_t>(pr.n) <= 64, "choices per request bounded", std::to_string(pr.n));
  check(pr.gen.max_new_tokens >= -1, "max_tokens is -1 (until the context is full) or a count",
        std::to_string(pr.gen.max_new_tokens));
  // What the checks accept the sampler accepts (the engine loop would not refuse it at submit).
  const kiln::Status st = kiln::Sampler(pr.gen.sampling, e.tok->n_vocab()).validate();
  check(st.is_ok(), "accepted sampling fields are valid sampler parameters", st.message());
  return 0;
}
