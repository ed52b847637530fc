// Grammar-constrained greedy decoding with the mask taken on the output backend (runtime/hooks.h: allowed_ahead,
// OutputKind::kMaskedArgmax, Backend::argmax_masked) against the host path (the row fetched and masked in update()),
// on every backend of the build that has a device here: the same tokens, text, finish reason and error for a JSON
// schema, a GBNF grammar, a lazy tool-call grammar (engaged from the prefix, and by a trigger in the output), a
// mask that allows nothing (an error after the same tokens) and one whose only bits lie past the vocabulary;
// several sequences in one step mixing masked, plain-argmax and sampled rows. The step observer shows which path
// each output row took: masked argmax rows on the device path, none there on the host path.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "common/backend_test_util.h"
#include "common/engine_util.h"
#include "common/test_util.h"
#include "runtime/grammar_mask.h"
#include "runtime/tool_grammar.h"
#include "template/template.h"
#include "template/tool_formats.h"

namespace kiln {
namespace {

std::string fixture() { return test::data_path("models/fixture-llama-q8_0.gguf"); }

// The provider as it is, but asked in update() only: the host path.
class HostOnly final : public TokenMaskProvider {
 public:
  explicit HostOnly(std::unique_ptr<TokenMaskProvider> m) : m_(std::move(m)) {}
  bool restricts() const override { return m_->restricts(); }
  bool allowed(std::span<uint64_t> mask) override { return m_->allowed(mask); }
  void accept(int32_t t) override { m_->accept(t); }
  void accept_in_block(int32_t t, std::string_view text, size_t n) override { m_->accept_in_block(t, text, n); }
  bool finished() const override { return m_->finished(); }

 private:
  std::unique_ptr<TokenMaskProvider> m_;
};

SequenceHooksFactory host_only(SequenceHooksFactory f) {
  return [f] {
    SequenceHooks h = f();
    if (h.mask) h.mask = std::make_unique<HostOnly>(std::move(h.mask));
    return h;
  };
}

// Allows `ids` for the first `n_ok` positions, then nothing but the bits past the vocabulary's end (none when it
// ends on a word boundary): the mask allows no token.
class AllowThenNothing final : public TokenMaskProvider {
 public:
  AllowThenNothing(std::vector<int32_t> ids, int n_ok, int32_t n_vocab) : ids_(std::move(ids)), n_ok_(n_ok), nv_(n_vocab) {}
  bool restricts() const override { return true; }
  bool allowed_ahead() const override { return true; }
  bool allowed(std::span<uint64_t> mask) override {
    std::fill(mask.begin(), mask.end(), uint64_t{0});
    if (n_seen_ < n_ok_) {
      for (int32_t id : ids_) mask[static_cast<size_t>(id / 64)] |= uint64_t{1} << (id % 64);
    } else if (nv_ % 64) {
      mask.back() = ~uint64_t{0} << (nv_ % 64);
    }
    return true;
  }
  void accept(int32_t) override { ++n_seen_; }

 private:
  std::vector<int32_t> ids_;
  int n_ok_;
  int32_t nv_;
  int n_seen_ = 0;
};

struct Outcome {
  std::vector<test::Generated> gens;
  int64_t masked_rows = 0, logits_rows = 0;
};

class GrammarDeviceMask : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& id = GetParam();
    if (id != "cpu") {
      auto devs = list_devices();
      bool present = false;
      if (devs)
        for (const DeviceInfo& d : *devs) present = present || d.id == id;
      if (!present) GTEST_SKIP() << "skipped: " << id << ": no such device on this machine";
    }
    LoadOptions lo;
    lo.devices.device = id;
    lo.devices.backend.n_threads = 1;
    auto m = Model::load(fixture(), lo);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EngineConfig c;
    c.n_ctx = 8192;
    c.max_seqs = 4;
    c.batch_tokens = 512;
    c.prefix_cache = false;
    c.start = false;
    auto s = Scheduler::create(std::move(m).value(), c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    s_ = std::move(s).value();
    s_->set_step_observer([this](const StepInfo& info) {
      for (const StepInfo::Entry& e : info.entries) {
        if (!e.output) continue;
        masked_ += e.masked;
        logits_ += e.row;
      }
    });
    s_->start();
    cache_ = std::make_unique<GrammarCache>(s_->tokenizer());
  }

  // The requests submitted together (they share steps), each run to its end.
  Outcome run(std::vector<GenRequest> reqs) {
    masked_ = logits_ = 0;
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (GenRequest& r : reqs) {
      auto h = s_->submit(std::move(r));
      EXPECT_TRUE(h) << h.status().to_string();
      if (h) hs.push_back(*h);
    }
    Outcome out;
    for (auto& h : hs) {
      test::Generated g;
      for (const TokenEvent& e : h->wait_all()) {
        if (e.id >= 0) g.ids.push_back(e.id);
        g.text += e.text;
      }
      g.reason = h->finish_reason();
      g.error = h->error();
      out.gens.push_back(std::move(g));
    }
    EXPECT_TRUE(s_->wait_idle(std::chrono::seconds(60)));
    out.masked_rows = masked_, out.logits_rows = logits_;
    return out;
  }

  GenRequest request(const std::string& prompt, SequenceHooksFactory hooks, int32_t max_new = 300, float temp = 0) {
    GenRequest r;
    r.prompt = s_->tokenizer().encode(prompt, true, false);
    r.max_new_tokens = max_new;
    r.sampling.temp = temp;
    r.sampling.seed = 5;
    r.hooks = std::move(hooks);
    return r;
  }

  std::shared_ptr<const grammar::CompiledGrammar> compile(const std::string& gbnf) {
    auto g = cache_->get(gbnf);
    EXPECT_TRUE(g) << g.status().to_string();
    return g ? *g : nullptr;
  }

  // Runs `reqs` as they are (device path where it applies) and with every mask host-only: the outputs agree.
  // Returns the device run.
  Outcome expect_same(const std::function<std::vector<GenRequest>(bool host)>& make) {
    const Outcome dev = run(make(false)), host = run(make(true));
    EXPECT_EQ(host.masked_rows, 0);
    EXPECT_EQ(dev.gens.size(), host.gens.size());
    for (size_t i = 0; i < std::min(dev.gens.size(), host.gens.size()); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(dev.gens[i].ids, host.gens[i].ids);
      EXPECT_EQ(dev.gens[i].text, host.gens[i].text);
      EXPECT_EQ(dev.gens[i].reason, host.gens[i].reason);
      EXPECT_EQ(dev.gens[i].error.to_string(), host.gens[i].error.to_string());
    }
    return dev;
  }

  std::unique_ptr<Scheduler> s_;
  std::unique_ptr<GrammarCache> cache_;
  std::atomic<int64_t> masked_{0}, logits_{0};
};

SequenceHooksFactory maybe_host(SequenceHooksFactory f, bool host) { return host ? host_only(std::move(f)) : f; }

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 12},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}},
  "required": ["name", "age"], "additionalProperties": false})";

TEST_P(GrammarDeviceMask, JsonSchemaGreedyMatchesTheHostPath) {
  auto gbnf = grammar::json_schema_to_gbnf(std::string_view(kSchema));
  ASSERT_TRUE(gbnf) << gbnf.status().to_string();
  auto g = compile(*gbnf);
  ASSERT_TRUE(g);
  const Outcome dev = expect_same([&](bool host) {
    std::vector<GenRequest> v;
    for (const char* p : {"Once upon a time", "The weather", "JSON:", "A list of"})
      v.push_back(request(p, maybe_host(grammar_hooks(g), host)));
    return v;
  });
  EXPECT_GT(dev.masked_rows, 0);
  EXPECT_EQ(dev.logits_rows, 0);  // no row left the device
  for (const test::Generated& r : dev.gens) {
    EXPECT_EQ(r.reason, FinishReason::kStop) << r.text;
    EXPECT_TRUE(nlohmann::json::parse(r.text, nullptr, false).is_object()) << r.text;
  }
}

// A GBNF grammar, with a plain greedy request and a sampled grammar request (the host path) in the same steps.
TEST_P(GrammarDeviceMask, GbnfMixedWithPlainAndSampledRows) {
  auto g = compile("root ::= word (\" \" word){2,5} \".\"\nword ::= [a-z]{1,7}\n");
  ASSERT_TRUE(g);
  const Outcome dev = expect_same([&](bool host) {
    std::vector<GenRequest> v;
    v.push_back(request("Once upon a time", maybe_host(grammar_hooks(g), host)));
    v.push_back(request("The weather", nullptr, 40));
    v.push_back(request("A list of", maybe_host(grammar_hooks(g), host), 300, 1.0f));
    v.push_back(request("JSON:", maybe_host(grammar_hooks(g), host)));
    return v;
  });
  EXPECT_GT(dev.masked_rows, 0);
  EXPECT_GT(dev.logits_rows, 0);  // the sampled request fetches its rows
  EXPECT_EQ(dev.gens[0].reason, FinishReason::kStop) << dev.gens[0].text;
  EXPECT_EQ(dev.gens[0].text.back(), '.');
}

// Lazy grammars: the Hermes tool-call grammar engaged by the prefix (the generation prompt ends with the trigger),
// and a grammar engaged by a trigger the free greedy output writes itself (a word taken from that output).
TEST_P(GrammarDeviceMask, LazyToolCallGrammarMatchesTheHostPath) {
  const tpl::ToolFormat* f = tpl::tool_format_by_name("hermes");
  ASSERT_TRUE(f);
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
      "required": ["city", "days"], "additionalProperties": false}}}])");
  ToolGrammarRequest rq;
  rq.names = {"get_weather"};
  rq.parallel = false;
  auto gbnf = tool_call_gbnf(*f, tools, rq);
  ASSERT_TRUE(gbnf) << gbnf.status().to_string();
  auto call = compile(*gbnf);
  ASSERT_TRUE(call);
  GrammarTriggers from_prefix;
  from_prefix.words = {f->trigger};
  from_prefix.prefix = "Let me check. " + f->trigger;
  const Outcome dev = expect_same([&](bool host) {
    std::vector<GenRequest> v;
    v.push_back(request("Weather in Paris?", maybe_host(lazy_grammar_hooks(call, from_prefix), host)));
    v.push_back(request("Weather in Lima?", maybe_host(lazy_grammar_hooks(call, from_prefix), host)));
    return v;
  });
  EXPECT_GT(dev.masked_rows, 0);
  EXPECT_EQ(dev.logits_rows, 0);
  for (const test::Generated& r : dev.gens) {
    EXPECT_EQ(r.reason, FinishReason::kStop) << r.text;
    std::string content = f->trigger + r.text;
    std::vector<tpl::ToolCall> calls;
    tpl::parse_tool_calls(*f, &content, &calls, tools);
    EXPECT_EQ(calls.size(), 1u) << r.text;
  }

  // A trigger in the output: a word of the free greedy text, past its first tokens.
  const Outcome free_run = run({request("Once upon a time", nullptr, 24)});
  const std::string& text = free_run.gens[0].text;
  ASSERT_GT(text.size(), 20u);
  const std::string word = text.substr(12, 3);
  auto tail = compile("root ::= " + nlohmann::json(word).dump() + " [^!]{0,12} \"!\"");
  ASSERT_TRUE(tail);
  GrammarTriggers in_output;
  in_output.words = {word};
  const Outcome dev2 = expect_same([&](bool host) {
    return std::vector<GenRequest>{request("Once upon a time", maybe_host(lazy_grammar_hooks(tail, in_output), host))};
  });
  EXPECT_GT(dev2.masked_rows, 0);
  EXPECT_EQ(dev2.gens[0].text.back(), '!') << dev2.gens[0].text;
  EXPECT_EQ(dev2.gens[0].text.rfind(text.substr(0, 12), 0), 0u) << dev2.gens[0].text;  // free before the trigger
}

// A mask that allows nothing ends the request with the host path's error, after the same tokens; a mask whose only
// bits lie past the vocabulary allows nothing too.
TEST_P(GrammarDeviceMask, AMaskThatAllowsNothingGivesTheSameError) {
  const int32_t nv = s_->n_vocab();
  const std::vector<int32_t> ids = {7, 64, nv - 1, 300};
  const Outcome dev = expect_same([&](bool host) {
    std::vector<GenRequest> v;
    for (int n_ok : {0, 3}) {
      SequenceHooksFactory f = [ids, n_ok, nv] {
        SequenceHooks h;
        h.mask = std::make_unique<AllowThenNothing>(ids, n_ok, nv);
        return h;
      };
      v.push_back(request("Once upon a time", maybe_host(f, host)));
      v.back().ignore_eos = true;  // an allowed id that is an EOG token is emitted as any other
    }
    return v;
  });
  EXPECT_GT(dev.masked_rows, 0);
  EXPECT_EQ(dev.logits_rows, 0);
  for (size_t i = 0; i < dev.gens.size(); ++i) {
    const test::Generated& r = dev.gens[i];
    EXPECT_EQ(r.reason, FinishReason::kError);
    EXPECT_NE(r.error.to_string().find("no token of the vocabulary is allowed"), std::string::npos)
        << r.error.to_string();
    EXPECT_EQ(r.ids.size(), i == 0 ? 0u : 3u);
    for (int32_t t : r.ids) EXPECT_TRUE(std::find(ids.begin(), ids.end(), t) != ids.end()) << t;
  }
}

std::vector<std::string> device_ids() {
  std::vector<std::string> ids;
  for (const std::string& id : test::backend_ids())
    if (id != test::kCpuRefId) ids.push_back(id);
  return ids;
}

INSTANTIATE_TEST_SUITE_P(Devices, GrammarDeviceMask, ::testing::ValuesIn(device_ids()), test::backend_test_name);

}  // namespace
}  // namespace kiln
