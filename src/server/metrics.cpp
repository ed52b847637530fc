#include "server/metrics.h"

#include <cstdio>

namespace kiln::server {

void HttpCounters::count(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++by_status_[{endpoint, status}];
}

std::map<std::pair<std::string, int>, uint64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  return by_status_;
}

namespace {

void head(std::string& o, const char* name, const char* type, const char* help) {
  o += "# HELP ";
  o += name;
  o += " ";
  o += help;
  o += "\n# TYPE ";
  o += name;
  o += " ";
  o += type;
  o += "\n";
}

void line(std::string& o, const std::string& name, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  o += name;
  o += buf;
}

void metric(std::string& o, const char* name, const char* type, const char* help, double v) {
  head(o, name, type, help);
  line(o, name, v);
}

void histogram(std::string& o, const char* name, const char* help, const Histogram& h) {
  head(o, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    char le[48];
    std::snprintf(le, sizeof le, "%g", h.bounds[i]);
    line(o, std::string(name) + "_bucket{le=\"" + le + "\"}", static_cast<double>(cum));
  }
  cum += h.counts.back();
  line(o, std::string(name) + "_bucket{le=\"+Inf\"}", static_cast<double>(cum));
  line(o, std::string(name) + "_sum", h.sum);
  line(o, std::string(name) + "_count", static_cast<double>(h.count));
}

}  // namespace

std::string render_metrics(const HttpCounters& http, const SchedulerStats* s, int64_t in_flight, double uptime_s) {
  std::string o;
  o.reserve(4096);
  head(o, "kiln_requests_total", "counter", "HTTP requests by endpoint and status code");
  for (const auto& [k, n] : http.snapshot())
    line(o, "kiln_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"}",
         static_cast<double>(n));
  metric(o, "kiln_http_requests_in_flight", "gauge", "HTTP requests being handled (streams included)",
         static_cast<double>(in_flight));
  metric(o, "kiln_uptime_seconds", "gauge", "seconds since the server started", uptime_s);
  metric(o, "kiln_model_loaded", "gauge", "1 once the model is loaded", s ? 1 : 0);
  if (!s) return o;
  metric(o, "kiln_prompt_tokens_total", "counter", "prompt tokens of admitted requests",
         static_cast<double>(s->prompt_tokens));
  metric(o, "kiln_prompt_tokens_computed_total", "counter",
         "prompt tokens run through the model (prefix-cache hits excluded, recomputation after preemption included)",
         static_cast<double>(s->prompt_tokens_computed));
  metric(o, "kiln_generated_tokens_total", "counter", "generated tokens", static_cast<double>(s->generated_tokens));
  metric(o, "kiln_prefix_cache_hit_tokens_total", "counter", "prompt tokens attached from the prefix cache",
         static_cast<double>(s->prefix_hit_tokens));
  metric(o, "kiln_prompt_tokens_per_second", "gauge", "prompt tokens computed per second over the last 10 s",
         s->prompt_tps);
  metric(o, "kiln_generated_tokens_per_second", "gauge", "generated tokens per second over the last 10 s", s->gen_tps);
  histogram(o, "kiln_time_to_first_token_seconds", "from submission to the first generated token", s->ttft);
  histogram(o, "kiln_inter_token_latency_seconds", "between consecutive tokens of a request", s->itl);
  metric(o, "kiln_queue_depth", "gauge", "requests waiting for a sequence slot or KV blocks",
         static_cast<double>(s->queue_depth));
  metric(o, "kiln_running_sequences", "gauge", "sequences holding a slot", static_cast<double>(s->running));
  metric(o, "kiln_kv_blocks_total", "gauge", "KV cache blocks in the pool", static_cast<double>(s->kv_blocks_total));
  metric(o, "kiln_kv_blocks_used", "gauge", "KV blocks held by sequences", static_cast<double>(s->kv_blocks_used));
  metric(o, "kiln_kv_blocks_free", "gauge", "KV blocks free (never indexed)", static_cast<double>(s->kv_blocks_free));
  metric(o, "kiln_kv_blocks_cached", "gauge", "KV blocks kept unreferenced by the prefix cache (reclaimable)",
         static_cast<double>(s->kv_blocks_cached));
  metric(o, "kiln_kv_block_size_tokens", "gauge", "token slots per KV block", s->block_size);
  metric(o, "kiln_kv_checkpoints_total", "gauge", "hybrid models: recurrent-state checkpoint slots (--ctx-checkpoints)",
         static_cast<double>(s->kv_checkpoints_total));
  metric(o, "kiln_kv_checkpoints_used", "gauge", "hybrid models: checkpoints held by cached blocks",
         static_cast<double>(s->kv_checkpoints_used));
  metric(o, "kiln_steps_total", "counter", "engine steps", static_cast<double>(s->steps));
  metric(o, "kiln_preemptions_total", "counter", "sequences preempted (KV dropped, recomputed later)",
         static_cast<double>(s->preemptions));
  metric(o, "kiln_draft_tokens_total", "counter", "speculative decoding: draft tokens verified",
         static_cast<double>(s->draft_tokens));
  metric(o, "kiln_draft_accepted_total", "counter", "speculative decoding: draft tokens the samples confirmed",
         static_cast<double>(s->draft_accepted));
  head(o, "kiln_sequences_finished_total", "counter", "requests finished by reason");
  const char* names[] = {"none", "stop", "length", "cancelled", "error"};
  for (int i = 1; i < 5; ++i)
    line(o, std::string("kiln_sequences_finished_total{reason=\"") + names[i] + "\"}",
         static_cast<double>(s->finished[i]));
  return o;
}

}  // namespace kiln::server
