// Grammar-constrained generation in the engine loop (runtime/grammar_mask.h) with a random-weight fixture model:
// every output is in the grammar's language, greedy or sampled; a grammar that is complete and cannot go on ends
// the request at once ("stop", no step for an EOG token, also with ignore_eos); a token limit cuts it ("length");
// the mask over a model vocabulary larger than the tokenizer's; the compiled-grammar cache (hits, failures kept,
// LRU eviction by count and bytes, one compile for concurrent requests of one text).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "gguf/gguf.h"
#include "runtime/grammar_mask.h"
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
