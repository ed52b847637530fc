// Grammar-constrained decoding cost on a real vocabulary: compile time (grammar text -> automaton, automaton +
// vocabulary -> token-mask cache) and the time of one token mask, per step of two kinds of generation:
//  - "text": a realistic output (the case's instance document) tokenized with the vocabulary's own tokenizer and
//    fed token by token (what a model writing typical JSON does);
//  - "random": tokens drawn uniformly from the mask (long, odd tokens: a harsher case for the uncertain walk).
//   bench_grammar VOCAB.gguf [--threads T (cache compile, default 1)] [--runs R (default 20)]
//                 [--gbnf FILE --text FILE | --schema FILE --text FILE]
// Without a case file it runs the built-in cases: a JSON schema (an order with nested objects, enums, bounded
// integers, formats and arrays) and a GBNF grammar (generic JSON), each with an instance document.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

namespace {

using kiln::grammar::CompiledGrammar;
using kiln::grammar::Grammar;
using kiln::grammar::Matcher;

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "created": {"type": "string", "format": "date-time"},
    "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
    "customer": {
      "type": "object",
      "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 80},
        "email": {"type": "string", "format": "email"},
        "phone": {"type": "string", "pattern": "^\\+[1-9][0-9]{6,14}$"}
      },
      "required": ["name", "email"],
      "additionalProperties": false
    },
    "items": {
      "type": "array", "minItems": 1, "maxItems": 50,
      "items": {
        "type": "object",
        "properties": {
          "sku": {"type": "string"},
          "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
          "unit_price": {"type": "number", "minimum": 0},
          "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["sku", "quantity", "unit_price"],
        "additionalProperties": false
      }
    },
    "notes": {"type": ["string", "null"]},
    "gift": {"type": "boolean"}
  },
  "required": ["order_id", "created", "status", "customer", "items"],
  "additionalProperties": false
})";

const char* kSchemaText = R"({"order_id": "3f2b8c1e-9d4a-4e7b-8c2f-1a6d5e9b0c3d", "created": "2025-03-14T09:26:53Z", "status": "shipped", "customer": {"name": "Ada Lovelace", "email": "ada@example.org", "phone": "+441234567890"}, "items": [{"sku": "BK-1843-ANL", "quantity": 2, "unit_price": 39.95, "tags": ["book", "history", "mathematics"]}, {"sku": "PN-0001", "quantity": 12, "unit_price": 1.5, "tags": []}], "notes": "Please leave the parcel with the neighbour if nobody answers the door.", "gift": false})";

const char* kGbnf = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)";

const char* kGbnfText = R"({"model": "kiln", "choices": [{"index": 0, "message": {"role": "assistant", "content": "The capital of France is Paris.\nIt has been since 987."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}, "ok": true, "ratio": -0.75e-3})";

std::string slurp(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0, mean = 0;
  size_t n = 0;
};

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.n = v.size();
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * 0.99))];
  p.max = v.back();
  double s = 0;
  for (double x : v) s += x;
  p.mean = s / static_cast<double>(v.size());
  return p;
}

double us_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

int run_case(const char* name, const std::string& gbnf, const std::string& text, const kiln::Tokenizer& tok,
             const std::shared_ptr<const kiln::grammar::VocabIndex>& vocab, int threads, int runs, double text_ms) {
  kiln::Timer t;
  auto g = Grammar::from_gbnf(gbnf);
  if (!g) {
    std::fprintf(stderr, "%s: %s\n", name, g.status().message().c_str());
    return 1;
  }
  const double grammar_ms = t.ms() + text_ms;
  auto cg = CompiledGrammar::compile(*g, vocab, threads);
  if (!cg) {
    std::fprintf(stderr, "%s: %s\n", name, cg.status().message().c_str());
    return 1;
  }
  const auto& st = (*cg)->stats();
  std::printf("%s: %zu rules, %zu positions (%zu cache entries); grammar %.2f ms, mask cache %.1f ms (%d thread%s; %.1f ms "
              "finding shared entries), "
              "%zu uncertain tokens over all entries, %zu dense entries, %.1f MiB\n",
              name, (*g)->num_rules(), (*g)->num_positions(), st.positions, grammar_ms, st.compile_ms, threads,
              threads == 1 ? "" : "s", st.share_ms, st.uncertain_tokens, st.bitset_positions,
              static_cast<double>(st.memory_bytes) / (1 << 20));

  std::vector<uint32_t> words(vocab->mask_words());
  // Text mode: the instance tokenized by the model's tokenizer, then EOS.
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  std::vector<double> text_us;
  for (int r = 0; r < runs; ++r) {
    Matcher m(*cg);
    for (int32_t id : ids) {
      const auto t0 = std::chrono::steady_clock::now();
      m.fill_mask(words);
      text_us.push_back(us_since(t0));
      if (!((words[id >> 5] >> (id & 31)) & 1)) {
        std::fprintf(stderr, "%s: the instance's token %d (%s) is not in the mask\n", name, id,
                     vocab->token(id).c_str());
        return 1;
      }
      if (auto s = m.accept_token(id); !s) {
        std::fprintf(stderr, "%s: %s\n", name, s.message().c_str());
        return 1;
      }
    }
    if (!m.is_complete()) {
      std::fprintf(stderr, "%s: the instance does not complete the grammar\n", name);
      return 1;
    }
  }
  // Random mode: uniform draws from the mask, at most 256 tokens, then the shortest completion byte by byte.
  std::vector<double> rand_us;
  std::mt19937_64 rng(42);
  std::vector<int32_t> allowed;
  for (int r = 0; r < runs; ++r) {
    Matcher m(*cg);
    for (int step = 0; step < 256 && !m.is_terminated(); ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      m.fill_mask(words);
      rand_us.push_back(us_since(t0));
      allowed.clear();
      for (size_t w = 0; w < words.size(); ++w)
        for (uint32_t b = words[w]; b; b &= b - 1) allowed.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(b)));
      if (allowed.empty()) break;
      (void)m.accept_token(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]);
    }
  }
  const Percentiles a = percentiles(text_us), b = percentiles(rand_us);
  std::printf("%s: mask, text   (%zu steps): p50 %.1f us, p99 %.1f us, max %.1f us, mean %.1f us\n", name, a.n, a.p50,
              a.p99, a.max, a.mean);
  std::printf("%s: mask, random (%zu steps): p50 %.1f us, p99 %.1f us, max %.1f us, mean %.1f us\n", name, b.n, b.p50,
              b.p99, b.max, b.mean);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s VOCAB.gguf [--threads T] [--runs R] [--gbnf FILE --text FILE | --schema FILE --text FILE]\n",
                 argv[0]);
    return 1;
  }
  int threads = 1, runs = 20;
  const char *gbnf_file = nullptr, *schema_file = nullptr, *text_file = nullptr;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gbnf") && i + 1 < argc) gbnf_file = argv[++i];
    else if (!std::strcmp(argv[i], "--schema") && i + 1 < argc) schema_file = argv[++i];
    else if (!std::strcmp(argv[i], "--text") && i + 1 < argc) text_file = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 1;
    }
  }
  auto f = kiln::gguf::File::open(argv[1]);
  if (!f) {
    std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
    return 1;
  }
  auto tok = kiln::Tokenizer::from_gguf(*f);
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  kiln::Timer vt;
  kiln::grammar::Vocabulary voc;
  for (int32_t id = 0; id < (*tok)->n_vocab(); ++id) {
    voc.tokens.push_back((*tok)->token_to_piece(id, false));
    if ((*tok)->is_eog(id)) voc.eog_ids.push_back(id);
  }
  auto vocab = kiln::grammar::VocabIndex::build(std::move(voc));
  std::printf("vocabulary: %d tokens (%zu trie nodes), index built in %.1f ms\n", vocab->size(),
              vocab->trie_nodes(), vt.ms());

  const auto schema_case = [&](const char* name, const std::string& schema_text, const std::string& text) {
    kiln::Timer t;
    auto gbnf = kiln::grammar::json_schema_to_gbnf(std::string_view(schema_text));
    if (!gbnf) {
      std::fprintf(stderr, "%s: %s\n", name, gbnf.status().message().c_str());
      return 1;
    }
    return run_case(name, *gbnf, text, **tok, vocab, threads, runs, t.ms());
  };
  if (gbnf_file) return run_case("gbnf", slurp(gbnf_file), text_file ? slurp(text_file) : "", **tok, vocab, threads, runs, 0);
  if (schema_file) return schema_case("json-schema", slurp(schema_file), text_file ? slurp(text_file) : "");
  int rc = schema_case("json-schema", kSchema, kSchemaText);
  rc |= run_case("gbnf-json", kGbnf, kGbnfText, **tok, vocab, threads, runs, 0);
  return rc;
}
