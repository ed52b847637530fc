// kiln serve: the OpenAI-compatible HTTP server (src/server) over the continuous-batching scheduler
// (runtime/scheduler.h). It listens first (/health says 503 while the model loads), then opens the endpoints.
// SIGINT/SIGTERM: stop accepting (503), let running requests finish for --shutdown-timeout seconds, cancel the
// rest, exit 0 (a second signal cancels at once).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>

#include "cli/args.h"
#include "cli/chat_cli.h"
#include "cli/engine_options.h"
#include "cli/model_source.h"
#include "model/embedding.h"
#include "runtime/scheduler.h"
#include "server/server.h"

namespace kiln::cli {
namespace {

std::atomic<int> g_signals{0};
void on_signal(int) { g_signals.fetch_add(1); }

std::string basename_of(const std::string& p) {
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

int serve_main(int argc, char** argv) {
  ArgParser args("serve", "OpenAI-compatible HTTP server with continuous batching over a shared paged KV cache.");
  ModelSource src;
  EngineArgs eng;
  eng.server = true;
  server::ServerConfig sc;
  bool quiet = false;
  int64_t body_limit = 8 << 20;
  float timeout_s = 600, shutdown_s = 10;
  std::string alias;
  add_model_options(args, &src);
  add_engine_options(args, &eng);
  args.option({"--host"}, &sc.host, "ADDR", "address to listen on (default 127.0.0.1)");
  args.option({"--port"}, &sc.port, "PORT", "port to listen on; 0: any free one (default 8080)");
  args.option({"--api-key"}, &sc.api_key, "KEY", "require 'Authorization: Bearer KEY' (all but /health)");
  args.option({"-a", "--alias"}, &alias, "NAME", "model id in /v1/models and responses (default: the file name)");
  ChatTemplateArgs tpl_args;
  add_chat_template_options(args, &tpl_args);
  args.option({"-n", "--n-predict"}, &sc.default_max_new_tokens, "N",
              "max_tokens of requests that name none; -1: until EOG or the context is full (default -1)");
  args.option({"--timeout"}, &timeout_s, "S", "per-request limit in seconds: generation stops there (default 600)");
  args.option({"--body-limit"}, &body_limit, "BYTES", "request body limit, 413 above (default 8388608)");
  args.option({"--shutdown-timeout"}, &shutdown_s, "S",
              "on SIGINT/SIGTERM, seconds running requests may take to finish before they are cancelled (default 10)");
  args.option({"--threads-http"}, &sc.http_threads, "N", "HTTP worker threads (default max(64, 4 x parallel + 16))");
  args.flag({"--no-log"}, &quiet, "no log line per request");
  args.flag({"--strict-model"}, &sc.strict_model,
            "a request naming another model than the served one gets 404 (default: any name is accepted)");
  args.option({"--cors-origin"}, &sc.cors_origin, "ORIGIN",
              "allow browsers from ORIGIN ('*' for any) to call the API: CORS headers, preflight OPTIONS (default: none)");
  args.flag({"--slots"}, &sc.slots, "serve GET /slots (the state of each sequence slot; off by default)");
  bool no_webui = false;
  args.flag({"--no-webui"}, &no_webui, "no chat page at / (default: served)");
  bool embedding = false, reranking = false;
  std::string pooling_arg;
  args.flag({"--embedding", "--embeddings"}, &embedding,
            "serve POST /v1/embeddings and /embedding (on by default for a model whose file declares a pooling type, "
            "which then serves only embeddings)");
  args.option({"--pooling"}, &pooling_arg, "TYPE",
              "none|mean|cls|last|rank: how embeddings pool the tokens' final hidden states (implies --embedding; "
              "default: the file's pooling_type, else none)");
  args.flag({"--reranking", "--rerank"}, &reranking, "serve POST /v1/rerank (the same as --pooling rank)");
  add_sampling_options(args, &sc.sampling);
  if (Status st = args.parse(argc, argv); !st) return fail("serve", st);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    std::fputs("\n-c is the KV capacity in tokens shared by all sequences (default: the model's context, at most 4096, "
               "times --parallel, at most 65536); one sequence holds at most min(-c, max(the model's training "
               "context, -c / --parallel)).\n",
               stdout);
    return 0;
  }
  if (Status st = check_engine_options(eng); !st) return fail("serve", st);
  std::optional<Pooling> pooling;
  if (!pooling_arg.empty()) {
    auto p = parse_pooling(pooling_arg, "--pooling");
    if (!p) return fail("serve", p.status());
    pooling = *p;
  }
  if (reranking && pooling && *pooling != Pooling::kRank)
    return fail("serve", make_error(ErrorCode::kInvalidArgument, "--reranking: conflicts with --pooling %s",
                                    pooling_arg.c_str()));
  if (reranking) pooling = Pooling::kRank;
  if (sc.port < 0 || sc.port > 65535)
    return fail("serve", make_error(ErrorCode::kInvalidArgument, "--port: must be in [0, 65535] (got %d)", sc.port));
  if (body_limit < 1024 || body_limit > (int64_t{1} << 30))
    return fail("serve", make_error(ErrorCode::kInvalidArgument, "--body-limit: must be in [1024, 2^30] bytes"));
  if (!(timeout_s > 0) || !(shutdown_s >= 0))
    return fail("serve", make_error(ErrorCode::kInvalidArgument, "--timeout / --shutdown-timeout: must be > 0"));
  if (!sc.cors_origin.empty() && sc.cors_origin != "*" &&
      ((sc.cors_origin.rfind("http://", 0) != 0 && sc.cors_origin.rfind("https://", 0) != 0) ||
       sc.cors_origin.find_first_of(" \t\r\n,") != std::string::npos))
    return fail("serve", make_error(ErrorCode::kInvalidArgument,
                                    "--cors-origin: '*' or one origin such as http://localhost:3000 (got '%s')",
                                    sc.cors_origin.c_str()));
  if (sc.http_threads < 0 || sc.http_threads > 4096)
    return fail("serve", make_error(ErrorCode::kInvalidArgument, "--threads-http: must be in [0, 4096]"));
  if (sc.default_max_new_tokens < -1 || sc.default_max_new_tokens == 0)
    return fail("serve", make_error(ErrorCode::kInvalidArgument, "-n: must be -1 or >= 1 (got %d)", sc.default_max_new_tokens));
  {
    auto o = chat_prompt_options(tpl_args);
    if (!o) return fail("serve", o.status());
    sc.chat = std::move(o).value();
    sc.reasoning_budget = tpl_args.reasoning_budget;
    sc.reasoning_budget_message = tpl_args.reasoning_budget_message;
    sc.chat.model_name = src.path.empty() ? kEmbeddedModelName : src.path;
  }
  if (Status st = check_sampling_options(sc.sampling); !st) return fail("serve", st);
  if (Status st = check_model_options(src); !st) return fail("serve", st);
  sc.max_body = static_cast<size_t>(body_limit);
  sc.timeout_s = timeout_s;
  sc.parallel = eng.max_seqs;
  sc.log_requests = !quiet;
  sc.build = KILN_VERSION;
  sc.webui = !no_webui;
  sc.model_id = !alias.empty() ? alias : !src.path.empty() ? basename_of(src.path) : "kiln-demo";

  // SIGINT/SIGTERM only count (async-signal-safe); the main thread polls the count.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hung up is a failed write, not the end of the server

  server::Server srv(sc);
  if (Status st = srv.bind(); !st) return fail("serve", st);
  std::thread http([&] { srv.run(); });
  std::fprintf(stderr, "kiln serve: listening on http://%s:%d (loading the model)\n", sc.host.c_str(), srv.port());
  auto quit = [&](int rc) {
    srv.stop();
    http.join();
    return rc;
  };

  auto loaded = load_model(src, /*show_progress=*/true);
  if (!loaded) return quit(fail("serve", loaded.status()));
  if (Status st = check_sampling_vocab(sc.sampling, loaded->model->tokenizer().n_vocab()); !st)
    return quit(fail("serve", st));
  auto cfg = engine_config(*loaded->model, eng);
  if (!cfg) return quit(fail("serve", cfg.status()));
  {
    // An embedding (or reranker) model, by its file's pooling type, and an encoder: embeddings on, generation off.
    auto info = read_embedding_info(*loaded->model);
    if (!info) return quit(fail("serve", info.status()));
    const bool embedding_model = info->pooling_type >= 0 || !loaded->model->hparams().causal;
    cfg->embeddings = embedding || pooling.has_value() || embedding_model;
    cfg->pooling = pooling;
    cfg->generation = !embedding_model;
  }
  if (!quiet) cfg->on_prefill = prefill_printer("kiln serve: ", /*per_slot=*/true);  // long prompts' progress
  auto draft = load_draft_model(src, eng);
  if (!draft) return quit(fail("serve", draft.status()));
  auto sched = Scheduler::create(std::move(loaded->model), *cfg, std::move(draft).value());
  if (!sched) return quit(fail("serve", sched.status()));
  if (Status st = srv.set_ready(sched->get()); !st) return quit(fail("serve", st));
  const EngineConfig& ec = (*sched)->config();
  const uint64_t ckpt_bytes = (*sched)->checkpoint_bytes();
  const std::string cache = !ec.prefix_cache ? "off"
                            : ckpt_bytes == 0 ? "on"
                                              : strprintf("on (%d recurrent-state checkpoints, %.1f MiB)",
                                                          ec.ctx_checkpoints * ec.max_seqs,
                                                          static_cast<double>(ckpt_bytes) / (1 << 20));
  const char* pname = pooling_name((*sched)->embedding().pooling);
  const std::string embeddings = !cfg->embeddings ? std::string("embeddings off")
                                 : cfg->generation ? strprintf("embeddings on (pooling %s)", pname)
                                                   : strprintf("embedding model (pooling %s; no generation)", pname);
  if (ec.spec.type != SpecConfig::Type::kNone)
    std::fprintf(stderr, "kiln serve: speculative decoding: %s, up to %d drafts per step and sequence%s\n",
                 spec_type_name(ec.spec.type), ec.spec.draft_max,
                 (*sched)->draft_model() ? strprintf(", draft model %s (%s)", eng.draft_path.c_str(),
                                                     (*sched)->draft_model()->placement().describe().c_str()).c_str()
                                         : "");
  std::fprintf(stderr,
               "kiln serve: ready: model '%s' (%s), KV %lld tokens shared by %d sequences (at most %lld each), "
               "budget %d tokens per step, prefix cache %s, %s, http://%s:%d/v1\n",
               sc.model_id.c_str(), (*sched)->model_description().c_str(), (long long)cfg->n_ctx, cfg->max_seqs,
               (long long)(*sched)->max_seq_ctx(), cfg->batch_tokens, cache.c_str(), embeddings.c_str(), sc.host.c_str(),
               srv.port());

  while (g_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::fprintf(stderr, "kiln serve: shutting down: %lld requests in flight\n", (long long)srv.in_flight());
  srv.begin_shutdown();
  (*sched)->shutdown(/*cancel=*/false);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(shutdown_s * 1000));
  while (std::chrono::steady_clock::now() < end && g_signals.load() < 2 &&
         !(*sched)->wait_idle(std::chrono::milliseconds(50))) {
  }
  (*sched)->shutdown(/*cancel=*/true);
  (*sched)->wait_idle(std::chrono::seconds(5));
  // Streams write their last chunk, then the listener closes.
  for (int i = 0; i < 100 && srv.in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int rc = quit(0);
  std::fprintf(stderr, "kiln serve: stopped\n");
  return rc;
}

}  // namespace

KILN_REGISTER_COMMAND("serve", "OpenAI-compatible HTTP server (continuous batching, prefix cache, /metrics)",
                      serve_main);

}  // namespace kiln::cli
