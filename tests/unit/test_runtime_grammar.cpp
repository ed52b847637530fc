// Grammar-constrained generation in the engine loop (runtime/grammar_mask.h) with a random-weight fixture model:
// every output is in the grammar's language, greedy or sampled; a grammar that is complete and cannot go on ends
// the request at once ("stop", no step for an EOG token, also with ignore_eos); a token limit cuts it ("length");
// the mask over a model vocabulary larger than the tokenizer's; the compiled-grammar cache (hits, failures kept,
// LRU eviction by count and bytes, one compile for concurrent requests of one text); lazy grammars (tool_choice
// "auto"): the trigger scanner across pieces, the mask free before the trigger and the grammar's after it, and a
// call forced to open in the fixture model's output finished under the Hermes grammar into a parseable call; a
// trigger begun in the prompt's end (a prefill) and ended in the output engages, one wholly in it does not; a
// trigger inside the reply's thinking block does not engage, one after the block does.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "gguf/gguf.h"
#include "runtime/grammar_mask.h"
#include "runtime/tool_grammar.h"
#include "template/template.h"
#include "template/tool_formats.h"
#include "unit/grammar_test_util.h"

namespace kiln {
namespace {

std::string fixture() { return test::data_path("models/fixture-llama-q8_0.gguf"); }

std::shared_ptr<const grammar::CompiledGrammar> compile_for(const std::string& gbnf, GrammarCache& cache) {
  auto g = cache.get(gbnf);
  EXPECT_TRUE(g) << g.status().to_string();
  return g ? *g : nullptr;
}

GenRequest constrained(const Scheduler& s, GrammarCache& cache, const std::string& gbnf, float temp, uint64_t seed) {
  GenRequest r;
  r.prompt = s.tokenizer().encode("Once upon a time", true, false);
  r.sampling.temp = temp;
  r.sampling.seed = seed;
  r.max_new_tokens = 2000;
  r.hooks = grammar_hooks(compile_for(gbnf, cache));
  return r;
}

// A schema whose every path ends within a few hundred bytes (random weights never choose to stop early).
const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 12},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
  "ok": {"type": "boolean"}},
  "required": ["name", "age"], "additionalProperties": false})";

TEST(GrammarGeneration, OutputsFollowTheGrammarGreedyAndSampled) {
  auto s = test::make_scheduler(fixture(), test::one_sequence(4096));
  ASSERT_TRUE(s);
  GrammarCache cache(s->tokenizer());
  auto gbnf = grammar::json_schema_to_gbnf(std::string_view(kSchema));
  ASSERT_TRUE(gbnf) << gbnf.status().to_string();
  for (int seed = 0; seed < 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const test::Generated g = test::generate(*s, constrained(*s, cache, *gbnf, seed == 0 ? 0.0f : 1.0f, seed));
    ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
    EXPECT_EQ(g.reason, FinishReason::kStop);
    EXPECT_TRUE(grammar::test::matches(*gbnf, g.text)) << g.text;
    const nlohmann::json j = nlohmann::json::parse(g.text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << g.text;
    EXPECT_TRUE(j.contains("name") && j["name"].is_string() && j["age"].is_number_integer()) << g.text;
  }
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 5u);
}

// "yes" | "no": the request ends right after the choice, with ignore_eos too, and without an EOG token.
TEST(GrammarGeneration, ACompleteGrammarEndsTheRequest) {
  auto s = test::make_scheduler(fixture(), test::one_sequence(512));
  ASSERT_TRUE(s);
  GrammarCache cache(s->tokenizer());
  for (bool ignore_eos : {false, true}) {
    for (int seed = 0; seed < 4; ++seed) {
      GenRequest r = constrained(*s, cache, R"(root ::= "yes" | "no")", 1.0f, seed);
      r.ignore_eos = ignore_eos;
      const test::Generated g = test::generate(*s, r);
      ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
      EXPECT_TRUE(g.text == "yes" || g.text == "no") << g.text;
      EXPECT_EQ(g.reason, FinishReason::kStop);
      EXPECT_EQ(g.stop, StopReason::kEog);
      for (int32_t id : g.ids) EXPECT_FALSE(s->tokenizer().is_eog(id));
    }
  }
  // A limit before the grammar completes: "length", the text a prefix of the language.
  GenRequest r = constrained(*s, cache, R"(root ::= "abcdefghijklmnopqrstuvwxyz")", 0.0f, 1);
  r.max_new_tokens = 3;
  const test::Generated g = test::generate(*s, r);
  EXPECT_EQ(g.reason, FinishReason::kLength);
  EXPECT_EQ(g.ids.size(), 3u);
  EXPECT_EQ(std::string("abcdefghijklmnopqrstuvwxyz").rfind(g.text, 0), 0u) << g.text;
}

// The hook's mask: the matcher's bits, and nothing past the grammar's vocabulary (a model's n_vocab may exceed the
// tokenizer's); EOG only once the grammar is complete.
TEST(GrammarMask, BitsMatchTheMatcherAndStopAtTheVocabulary) {
  auto cg = grammar::test::compile(R"(root ::= "a"+)", grammar::test::byte_vocab());  // 257 ids, EOG = 256
  ASSERT_TRUE(cg);
  SequenceHooks h = grammar_hooks(cg)();
  ASSERT_TRUE(h.mask && h.mask->restricts());
  std::vector<uint64_t> mask(8, ~uint64_t{0});  // 512 ids
  ASSERT_TRUE(h.mask->allowed(mask));
  auto allowed = [&] {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 512; ++i)
      if ((mask[i / 64] >> (i % 64)) & 1) ids.push_back(i);
    return ids;
  };
  EXPECT_EQ(allowed(), std::vector<int32_t>({'a'}));
  h.mask->accept('a');
  EXPECT_FALSE(h.mask->finished());
  ASSERT_TRUE(h.mask->allowed(mask));
  EXPECT_EQ(allowed(), std::vector<int32_t>({'a', 256}));
  h.mask->accept(256);
  EXPECT_TRUE(h.mask->finished());
  // A token the grammar refuses (only a path around the mask could pick it): nothing is allowed after it.
  SequenceHooks h2 = grammar_hooks(cg)();
  h2.mask->accept('b');
  ASSERT_TRUE(h2.mask->allowed(mask));
  EXPECT_TRUE(allowed().empty());
}

// ---- lazy grammars ----

GrammarTriggers trig(std::vector<std::string> words) {
  GrammarTriggers t;
  t.words = std::move(words);
  return t;
}

std::vector<std::string> feed_all(TriggerScanner& s, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) {
    auto r = s.feed(p);
    out.push_back(r ? "[" + *r + "]" : "-");
  }
  return out;
}

TEST(TriggerScanner, FindsAWordSplitOverPieces) {
  TriggerScanner s(trig({"<tool_call>"}));
  // The text before the word is left out; what follows it in the same piece is kept.
  EXPECT_EQ(feed_all(s, {"Sure, <to", "o", "l_c", "all>\n{\"na", "me\""}),
            (std::vector<std::string>{"-", "-", "-", "[<tool_call>\n{\"na]", "-"}));
  EXPECT_TRUE(s.fired());
  // A near miss keeps looking; a word wholly inside one piece, and one that starts at a piece's last byte.
  TriggerScanner t(trig({"<tool_call>"}));
  EXPECT_EQ(feed_all(t, {"<tool_cal", "l <tool_call>x"}), (std::vector<std::string>{"-", "[<tool_call>x]"}));
  TriggerScanner u(trig({"[TOOL_CALLS]"}));
  EXPECT_EQ(feed_all(u, {"a [T", "OOL_CALLS][{"}), (std::vector<std::string>{"-", "[[TOOL_CALLS][{]"}));
  // Of several words the earliest in the text.
  TriggerScanner v(trig({"<b>", "<a>"}));
  EXPECT_EQ(feed_all(v, {"x<a", "><b>"}), (std::vector<std::string>{"-", "[<a><b>]"}));
  TriggerScanner none(GrammarTriggers{});
  EXPECT_TRUE(none.done());
  EXPECT_FALSE(none.feed("<tool_call>"));
}

TEST(TriggerScanner, AtStartOnlyAfterWhitespaceAndTheLead) {
  const GrammarTriggers t{{"{\"name\""}, true, "<|python_tag|>"};
  TriggerScanner a(t);
  EXPECT_EQ(feed_all(a, {" \n", "{\"", "name\": \"f\""}), (std::vector<std::string>{"-", "-", "[{\"name\": \"f\"]"}));
  TriggerScanner b(t);
  EXPECT_EQ(feed_all(b, {"<|python", "_tag|>", "{\"name\""}), (std::vector<std::string>{"-", "-", "[{\"name\"]"}));
  TriggerScanner c(t);
  EXPECT_EQ(feed_all(c, {"Hi ", "{\"name\""}), (std::vector<std::string>{"-", "-"}));
  EXPECT_TRUE(c.done());
  EXPECT_FALSE(c.fired());
  TriggerScanner d(t);
  EXPECT_EQ(feed_all(d, {"{\"nam", "e_x\""}), (std::vector<std::string>{"-", "-"}));
  EXPECT_TRUE(d.done());
}

// A prefix (the prompt's end) the output continues: a word begun in it fires in the output; a word ending at its
// end fires at once; one wholly before its end (an earlier, complete call) does not, and a later one still does.
TEST(TriggerScanner, StartsFromThePrefix) {
  auto with_prefix = [](GrammarTriggers t, std::string prefix) {
    t.prefix = std::move(prefix);
    return t;
  };
  TriggerScanner split(with_prefix(trig({"<tool_call>"}), "Sure. <tool"));
  EXPECT_FALSE(split.prefix());
  EXPECT_EQ(feed_all(split, {"_ca", "ll>\n{"}), (std::vector<std::string>{"-", "[<tool_call>\n{]"}));
  TriggerScanner at_end(with_prefix(trig({"<tool_call>"}), "Sure. <tool_call>"));
  ASSERT_TRUE(at_end.prefix());
  EXPECT_EQ(*at_end.prefix(), "<tool_call>");
  EXPECT_TRUE(at_end.done());
  TriggerScanner earlier(with_prefix(trig({"<tool_call>"}), "<tool_call>\n{\"name\": \"f\"}\n</tool_call>\n"));
  EXPECT_FALSE(earlier.prefix());
  EXPECT_EQ(feed_all(earlier, {"Done", ". <tool_call>"}), (std::vector<std::string>{"-", "[<tool_call>]"}));
  // A shorter word wholly in the kept tail is before the end too.
  TriggerScanner shorter(with_prefix(trig({"<a>", "<longer>"}), "x<a>yz"));
  EXPECT_FALSE(shorter.prefix());
  EXPECT_EQ(feed_all(shorter, {"w", "<a>"}), (std::vector<std::string>{"-", "[<a>]"}));
  // at_start: the prefix is the output's start (whitespace, the lead, a word's start) or it is past it.
  const GrammarTriggers t{{"{\"name\""}, true, "<|python_tag|>"};
  TriggerScanner lead(with_prefix(t, "<|python_tag|>"));
  EXPECT_EQ(feed_all(lead, {"{\"name\""}), (std::vector<std::string>{"[{\"name\"]"}));
  TriggerScanner begun(with_prefix(t, " {\"na"));
  EXPECT_EQ(feed_all(begun, {"me\": 1"}), (std::vector<std::string>{"[{\"name\": 1]"}));
  TriggerScanner whole(with_prefix(t, "{\"name\""));
  ASSERT_TRUE(whole.prefix());
  EXPECT_EQ(*whole.prefix(), "{\"name\"");
  TriggerScanner past(with_prefix(t, "{\"name\": \"f\", \"parameters\": {}}"));
  EXPECT_FALSE(past.prefix());
  EXPECT_TRUE(past.done());
  EXPECT_EQ(feed_all(past, {" {\"name\""}), (std::vector<std::string>{"-"}));
}

TEST(TriggerScanner, RestartForgetsTheTextSoFar) {
  const GrammarTriggers t{{"{\"name\""}, true, ""};
  TriggerScanner s(t);
  EXPECT_EQ(feed_all(s, {"<th"}), (std::vector<std::string>{"-"}));
  EXPECT_TRUE(s.done());  // the output opened with other text
  s.restart();            // ... which was a thinking block: the output starts after it
  EXPECT_EQ(feed_all(s, {"\n\n{\"name\""}), (std::vector<std::string>{"[{\"name\"]"}));
  TriggerScanner w(trig({"<tool_call>"}));
  EXPECT_EQ(feed_all(w, {"<tool"}), (std::vector<std::string>{"-"}));
  w.restart();
  EXPECT_EQ(feed_all(w, {"_call>"}), (std::vector<std::string>{"-"}));
}

// A small vocabulary whose tokens split the trigger "<tool_call>", one that carries text past it, EOG, and one that
// continues the trigger.
std::shared_ptr<const grammar::VocabIndex> lazy_vocab() {
  grammar::Vocabulary v;
  v.tokens = {"Hi ", "<tool", "_call>{", "ab", "}", "x", "<tool_call>{x", "", "{ab"};
  v.eog_ids = {7};
  return grammar::VocabIndex::build(std::move(v));
}

std::vector<int32_t> mask_ids(TokenMaskProvider& m, int32_t n) {
  std::vector<uint64_t> mask(1, ~uint64_t{0});
  if (!m.allowed(mask)) return {-1};  // untouched: every token
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i)
    if ((mask[0] >> i) & 1) ids.push_back(i);
  return ids;
}

TEST(LazyGrammar, FreeUntilTheTriggerThenTheGrammar) {
  auto cg = grammar::test::compile(R"(root ::= "<tool_call>{" ("ab")+ "}")", lazy_vocab());
  ASSERT_TRUE(cg);
  SequenceHooks h = lazy_grammar_hooks(cg, trig({"<tool_call>"}))();
  ASSERT_TRUE(h.mask);
  // Free: nothing restricted, text the grammar would refuse goes through.
  for (int32_t t : {0, 5, 4, 0}) {
    EXPECT_FALSE(h.mask->restricts());
    EXPECT_EQ(mask_ids(*h.mask, 8), std::vector<int32_t>{-1});
    h.mask->accept(t);
    EXPECT_FALSE(h.mask->finished());
  }
  // "<tool" + "_call>{": the trigger across two tokens; "<tool_call>{" is fed, the grammar wants "ab" next.
  h.mask->accept(1);
  EXPECT_FALSE(h.mask->restricts());
  h.mask->accept(2);
  EXPECT_TRUE(h.mask->restricts());
  EXPECT_EQ(mask_ids(*h.mask, 8), std::vector<int32_t>{3});  // a malformed call ("x", "}", another "<tool") refused
  h.mask->accept(3);
  EXPECT_EQ(mask_ids(*h.mask, 8), (std::vector<int32_t>{3, 4}));
  h.mask->accept(4);
  EXPECT_TRUE(h.mask->finished());
  // The trigger's token carries text the grammar refuses ("x"): the output stays free to its end.
  SequenceHooks r = lazy_grammar_hooks(cg, trig({"<tool_call>"}))();
  r.mask->accept(6);
  EXPECT_FALSE(r.mask->restricts());
  r.mask->accept(1);
  r.mask->accept(2);
  EXPECT_FALSE(r.mask->restricts());
  EXPECT_FALSE(r.mask->finished());
}

// The prefix: a trigger split between it and the first token engages; one ending at its end engages before any
// token; a complete call in it does not.
TEST(LazyGrammar, ThePrefixFeedsTheScanner) {
  auto cg = grammar::test::compile(R"(root ::= "<tool_call>{" ("ab")+ "}")", lazy_vocab());
  ASSERT_TRUE(cg);
  auto hooks = [&](std::string prefix) {
    GrammarTriggers t = trig({"<tool_call>"});
    t.prefix = std::move(prefix);
    return lazy_grammar_hooks(cg, t)();
  };
  SequenceHooks split = hooks("Let me check. <tool");
  EXPECT_FALSE(split.mask->restricts());
  split.mask->accept(2);  // "_call>{"
  EXPECT_TRUE(split.mask->restricts());
  EXPECT_EQ(mask_ids(*split.mask, 9), std::vector<int32_t>{3});
  SequenceHooks opened = hooks("<tool_call>");
  EXPECT_TRUE(opened.mask->restricts());
  EXPECT_EQ(mask_ids(*opened.mask, 9), std::vector<int32_t>{8});  // "{ab" continues the call
  SequenceHooks earlier = hooks("<tool_call>{ab}");
  EXPECT_FALSE(earlier.mask->restricts());
  earlier.mask->accept(0);
  EXPECT_FALSE(earlier.mask->restricts());
  earlier.mask->accept(1);
  earlier.mask->accept(2);  // a new call in the output still engages
  EXPECT_TRUE(earlier.mask->restricts());
}

// Tokens of the thinking block (accept_in_block with n_block > 0) are not scanned; after the block they are.
TEST(LazyGrammar, ATriggerInsideTheThinkingBlockIsIgnored) {
  auto cg = grammar::test::compile(R"(root ::= "<tool_call>{" ("ab")+ "}")", lazy_vocab());
  ASSERT_TRUE(cg);
  SequenceHooks h = lazy_grammar_hooks(cg, trig({"<tool_call>"}))();
  h.mask->accept_in_block(5, "<think>", 7);
  h.mask->accept_in_block(6, "<tool_call>{x", 13);
  h.mask->accept_in_block(1, "<tool", 5);
  h.mask->accept_in_block(2, "_call>{", 7);
  EXPECT_FALSE(h.mask->restricts());
  h.mask->accept_in_block(5, "</think>", 8);
  EXPECT_FALSE(h.mask->restricts());
  h.mask->accept(1);
  h.mask->accept(2);
  EXPECT_TRUE(h.mask->restricts());
  EXPECT_EQ(mask_ids(*h.mask, 9), std::vector<int32_t>{3});
  // The token that closes the block carries the trigger: the text after the marker is scanned.
  SequenceHooks c = lazy_grammar_hooks(cg, trig({"<tool_call>"}))();
  c.mask->accept_in_block(1, "<think><tool", 12);
  c.mask->accept_in_block(5, "_call> </think>\n<tool_call>{", 15);
  EXPECT_TRUE(c.mask->restricts());
  EXPECT_EQ(mask_ids(*c.mask, 9), std::vector<int32_t>{3});
  // Before the block opens (n_block 0) tokens are scanned as any.
  SequenceHooks d = lazy_grammar_hooks(cg, trig({"<tool_call>"}))();
  d.mask->accept_in_block(1, "<tool", 0);
  d.mask->accept_in_block(2, "_call>{", 0);
  EXPECT_TRUE(d.mask->restricts());
}

// Forces the first tokens of the output (every other logit -inf), then leaves the row alone.
class ForceTokens final : public LogitsProcessor {
 public:
  explicit ForceTokens(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  void process(std::span<float> logits) override {
    if (i_ >= ids_.size()) return;
    for (size_t k = 0; k < logits.size(); ++k)
      if (static_cast<int32_t>(k) != ids_[i_]) logits[k] = -INFINITY;
    ++i_;
  }

 private:
  std::vector<int32_t> ids_;
  size_t i_ = 0;
};

// The fixture model (random weights) through the engine loop: prose, then a Hermes call opened by force; the lazy
// grammar takes over at "<tool_call>" and the model finishes a call that parses, of an offered function, with
// arguments its schema accepts. Without the trigger the output is the unconstrained one.
TEST(LazyGrammar, ATriggeredCallParsesInTheEngineLoop) {
  auto s = test::make_scheduler(fixture(), test::one_sequence(2048));
  ASSERT_TRUE(s);
  const tpl::ToolFormat* f = tpl::tool_format_by_name("hermes");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->trigger, "<tool_call>");
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
      "required": ["city", "days"], "additionalProperties": false}}}])");
  ToolGrammarRequest rq;
  rq.names = {"get_weather"};
  rq.parallel = false;
  auto gbnf = tool_call_gbnf(*f, tools, rq);
  ASSERT_TRUE(gbnf) << gbnf.status().to_string();
  GrammarCache cache(s->tokenizer());
  auto cg = compile_for(*gbnf, cache);
  ASSERT_TRUE(cg);
  const std::vector<int32_t> forced = s->tokenizer().encode("Let me check. <tool_call>", false, false);
  auto request = [&](bool force, uint64_t seed) {
    GenRequest r;
    r.prompt = s->tokenizer().encode("Weather in Paris?", true, false);
    r.sampling.temp = 1.0f;
    r.sampling.seed = seed;
    r.max_new_tokens = force ? 400 : 24;
    r.hooks = [cg, f, force, forced] {
      SequenceHooks h = lazy_grammar_hooks(cg, trig({f->trigger}))();
      if (force) h.processors.push_back(std::make_unique<ForceTokens>(forced));
      return h;
    };
    return r;
  };
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const test::Generated g = test::generate(*s, request(true, seed));
    ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
    EXPECT_EQ(g.reason, FinishReason::kStop) << g.text;  // the grammar completed the call
    ASSERT_EQ(g.text.rfind("Let me check. <tool_call>", 0), 0u) << g.text;
    std::string content = g.text;
    std::vector<tpl::ToolCall> calls;
    tpl::parse_tool_calls(*f, &content, &calls, tools);
    ASSERT_EQ(calls.size(), 1u) << g.text;
    EXPECT_EQ(calls[0].name, "get_weather");
    const nlohmann::json args = nlohmann::json::parse(calls[0].arguments);
    EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Lima") << calls[0].arguments;
    EXPECT_TRUE(args["days"].is_number_integer() && args["days"] >= 1 && args["days"] <= 9) << calls[0].arguments;
    EXPECT_EQ(content, "Let me check.");
    // Not forced: the same text as with no hooks at all (random weights never write the trigger here).
    GenRequest plain = request(false, seed);
    plain.hooks = nullptr;
    const test::Generated free_run = test::generate(*s, request(false, seed));
    EXPECT_EQ(free_run.text, test::generate(*s, plain).text);
  }
}

// The engine loop with the fixture model and the Hermes grammar, the output's first tokens forced: a trigger begun in
// the prefix and ended by the output engages the grammar, which finishes a call that parses; in a thinking block
// (the prompt opened it) the trigger leaves the output free (the same text as with no grammar), while without the
// block's tracking it engages; after the block's close it engages.
TEST(LazyGrammar, PrefixAndThinkingBlockInTheEngineLoop) {
  auto s = test::make_scheduler(fixture(), test::one_sequence(2048));
  ASSERT_TRUE(s);
  const Tokenizer& tok = s->tokenizer();
  const tpl::ToolFormat* f = tpl::tool_format_by_name("hermes");
  ASSERT_TRUE(f);
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
      "required": ["zone"], "additionalProperties": false}}}])");
  ToolGrammarRequest rq;
  rq.names = {"get_time"};
  rq.parallel = false;
  auto gbnf = tool_call_gbnf(*f, tools, rq);
  ASSERT_TRUE(gbnf) << gbnf.status().to_string();
  GrammarCache cache(tok);
  auto cg = compile_for(*gbnf, cache);
  ASSERT_TRUE(cg);
  ReasoningBudget block;  // tracked, never forced
  block.begin = "<think>";
  block.end = "</think>";
  block.close = tok.encode("\n</think>\n\n", false, false);
  block.opened = true;
  auto run = [&](const std::string& forced_text, const std::string& prefix, bool grammar, const ReasoningBudget& rb,
                 int max_new) {
    GenRequest r;
    r.prompt = tok.encode("Time in Paris?", true, false);
    r.sampling.temp = 1.0f;
    r.sampling.seed = 4;
    r.max_new_tokens = max_new;
    r.reasoning = rb;
    const std::vector<int32_t> forced = tok.encode(forced_text, false, false);
    GrammarTriggers t = trig({f->trigger});
    t.prefix = prefix;
    r.hooks = [cg, t, grammar, forced] {
      SequenceHooks h = grammar ? lazy_grammar_hooks(cg, t)() : SequenceHooks{};
      h.processors.push_back(std::make_unique<ForceTokens>(forced));
      return h;
    };
    const test::Generated g = test::generate(*s, r);
    EXPECT_TRUE(g.error.is_ok()) << g.error.to_string();
    return g;
  };
  auto one_call = [&](const std::string& text) {
    std::string content = text;
    std::vector<tpl::ToolCall> calls;
    tpl::parse_tool_calls(*f, &content, &calls, tools);
    EXPECT_EQ(calls.size(), 1u) << text;
    if (calls.size() == 1) {
      EXPECT_EQ(calls[0].name, "get_time");
    }
  };
  // The trigger split between the prefix and the output.
  const test::Generated split = run("_call>", "Let me check. <tool", true, ReasoningBudget{}, 400);
  EXPECT_EQ(split.reason, FinishReason::kStop) << split.text;
  ASSERT_EQ(split.text.rfind("_call>", 0), 0u) << split.text;
  one_call("<tool" + split.text);
  // Inside the block: free; untracked: engaged.
  const std::string thought = "I could write <tool_call>";  // the forcing ends with the trigger
  const test::Generated free_run = run(thought, "", false, block, 40);
  const test::Generated in_block = run(thought, "", true, block, 40);
  EXPECT_EQ(in_block.text, free_run.text);
  EXPECT_EQ(in_block.reason, free_run.reason);
  const test::Generated untracked = run(thought, "", true, ReasoningBudget{}, 40);
  EXPECT_NE(untracked.text, free_run.text);
  // After the block: engaged, the call finished.
  const test::Generated after = run("Hmm.</think>\nLet me check. <tool_call>", "", true, block, 400);
  EXPECT_EQ(after.reason, FinishReason::kStop) << after.text;
  const size_t close = after.text.find("</think>");
  ASSERT_NE(close, std::string::npos) << after.text;
  one_call(after.text.substr(close + 8));
}

std::unique_ptr<Tokenizer> fixture_tokenizer() {
  auto f = gguf::File::open(fixture());
  EXPECT_TRUE(f) << f.status().to_string();
  if (!f) return nullptr;
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t) << t.status().to_string();
  return t ? std::move(t).value() : nullptr;
}

TEST(GrammarCache, HitsFailuresAndEviction) {
  auto tok = fixture_tokenizer();
  ASSERT_TRUE(tok);
  GrammarCache::Options o;
  o.max_entries = 2;
  GrammarCache cache(*tok, o);
  const std::string a = R"(root ::= "a")", b = R"(root ::= "b")", c = R"(root ::= "c")";
  auto ga = compile_for(a, cache);
  EXPECT_EQ(compile_for(a, cache), ga);  // the same compiled grammar
  EXPECT_EQ(cache.stats().hits, 1u);
  auto bad1 = cache.get("root ::= (");
  auto bad2 = cache.get("root ::= (");
  ASSERT_FALSE(bad1);
  ASSERT_FALSE(bad2);
  EXPECT_EQ(bad1.status().message(), bad2.status().message());
  EXPECT_NE(bad1.status().message().find("line 1"), std::string::npos) << bad1.status().message();
  EXPECT_EQ(cache.stats().hits, 2u);  // the failure was kept
  compile_for(b, cache);
  compile_for(c, cache);  // a and the failure are the least recently used: evicted
  EXPECT_EQ(cache.stats().entries, 2u);
  const uint64_t misses = cache.stats().misses;
  auto ga2 = compile_for(a, cache);
  EXPECT_EQ(cache.stats().misses, misses + 1);
  EXPECT_NE(ga2, ga);
  // A byte bound below one grammar's size keeps only the newest.
  GrammarCache::Options tiny;
  tiny.max_bytes = 1;
  GrammarCache small(*tok, tiny);
  compile_for(a, small);
  compile_for(b, small);
  EXPECT_EQ(small.stats().entries, 1u);
  EXPECT_GT(small.stats().bytes, 0u);
}

TEST(GrammarCache, ConcurrentRequestsForOneTextCompileOnce) {
  auto tok = fixture_tokenizer();
  ASSERT_TRUE(tok);
  GrammarCache cache(*tok);
  auto gbnf = grammar::json_schema_to_gbnf(std::string_view(kSchema));
  ASSERT_TRUE(gbnf);
  std::vector<std::shared_ptr<const grammar::CompiledGrammar>> got(8);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < got.size(); ++i) ts.emplace_back([&, i] { got[i] = cache.get(*gbnf).value(); });
  for (auto& t : ts) t.join();
  for (auto& g : got) EXPECT_EQ(g, got[0]);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 7u);
}

}  // namespace
}  // namespace kiln
