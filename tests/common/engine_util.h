// What the runtime tests share: a model on the CPU, the engine loop over it, one request run to its end, and hooks that
// observe the step (runtime/hooks.h).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/scheduler.h"

namespace kiln::test {

// One CPU thread: the machine is shared, and these are correctness tests.
inline std::unique_ptr<Model> load_cpu_model(const std::string& path) {
  LoadOptions lo;
  lo.devices.device = "cpu";
  lo.devices.backend.n_threads = 1;
  auto m = Model::load(path, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m ? std::move(m).value() : nullptr;
}

inline std::unique_ptr<Scheduler> make_scheduler(const std::string& path, const EngineConfig& cfg) {
  auto m = load_cpu_model(path);
  if (!m) return nullptr;
  auto s = Scheduler::create(std::move(m), cfg);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s ? std::move(s).value() : nullptr;
}

// The configuration `kiln run` uses: one sequence, no prefix cache.
inline EngineConfig one_sequence(int64_t n_ctx = 256, int32_t batch_tokens = 512) {
  EngineConfig c;
  c.n_ctx = n_ctx;
  c.max_seqs = 1;
  c.batch_tokens = batch_tokens;
  c.prefix_cache = false;
  return c;
}

struct Generated {
  std::vector<int32_t> ids;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  StopReason stop = StopReason::kNone;
  RequestTimings timings;
  Status error;
};

// Submits req and waits for its end (a submit error is returned in `error`).
inline Generated generate(Scheduler& s, GenRequest req) {
  Generated g;
  auto h = s.submit(std::move(req));
  if (!h) {
    g.error = h.status();
    return g;
  }
  for (const TokenEvent& e : (*h)->wait_all()) {
    if (e.id >= 0) g.ids.push_back(e.id);
    g.text += e.text;
  }
  g.reason = (*h)->finish_reason();
  g.stop = (*h)->stop_reason();
  g.timings = (*h)->timings();
  g.error = (*h)->error();
  return g;
}

// A model run through the engine loop to the end of one request, and the loop's statistics (speculative decoding's
// drafts and acceptances).
struct SpecRun {
  Generated g;
  SchedulerStats stats;
};

inline SpecRun run_spec(const std::string& model, const EngineConfig& cfg, GenRequest r) {
  SpecRun out;
  auto s = make_scheduler(model, cfg);
  if (!s) return out;
  out.g = generate(*s, std::move(r));
  out.stats = s->stats();
  return out;
}

// n token ids in [3, 990) (the fixtures' vocabulary of 1000 without its specials), from a seed.
inline std::vector<int32_t> ids(size_t n, uint32_t seed) {
  std::vector<int32_t> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = 3 + static_cast<int32_t>((x >> 8) % 987u);
  }
  return v;
}

inline GenRequest greedy_request(const std::vector<int32_t>& prompt, int32_t max_new_tokens) {
  GenRequest r;
  r.prompt = prompt;
  r.max_new_tokens = max_new_tokens;
  r.ignore_eos = true;
  r.sampling.temp = 0;
  return r;
}

// A logits processor that changes nothing and keeps a copy of every row it sees (its presence makes the step fetch
// the logits row even for greedy sampling).
class RecordRows : public LogitsProcessor {
 public:
  explicit RecordRows(std::vector<std::vector<float>>* rows) : rows_(rows) {}
  void process(std::span<float> logits) override { rows_->emplace_back(logits.begin(), logits.end()); }

 private:
  std::vector<std::vector<float>>* rows_;
};

// Hooks with one RecordRows writing into *rows (the request must outlive nothing: rows is the caller's).
inline SequenceHooksFactory record_rows(std::vector<std::vector<float>>* rows) {
  return [rows] {
    SequenceHooks h;
    h.processors.push_back(std::make_unique<RecordRows>(rows));
    return h;
  };
}

}  // namespace kiln::test
