// The JSON-schema compiler: the language of the generated grammar (exact integer ranges checked value by value,
// number bounds, formats, property order, optional members, extra keys, whitespace) and the errors that name the
// keyword and its JSON pointer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"

namespace kiln::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> schema_grammar(const std::string& schema, const SchemaOptions& o = {}) {
  auto gbnf = json_schema_to_gbnf(std::string_view(schema), o);
  EXPECT_TRUE(gbnf) << gbnf.status().message();
  if (!gbnf) return nullptr;
  return test::compile(*gbnf, test::byte_vocab());
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& cg, const std::string& text) {
  Matcher m(cg);
  return m.accept_bytes(text).is_ok() && m.is_complete();
}

std::string error_of(const std::string& schema) {
  auto r = json_schema_to_gbnf(std::string_view(schema));
  return r ? "(ok)" : r.status().message();
}

TEST(GrammarJsonSchema, IntegerRangesAreExact) {
  const struct {
    const char* schema;
    int64_t lo, hi;  // the accepted values within [-1500, 1500]
  } cases[] = {
      {R"({"type":"integer","minimum":-273,"maximum":1000})", -273, 1000},
      {R"({"type":"integer","minimum":7,"maximum":1234})", 7, 1234},
      {R"({"type":"integer","exclusiveMinimum":-100,"exclusiveMaximum":-9})", -99, -10},
      {R"({"type":"integer","minimum":1.5,"maximum":99.5})", 2, 99},
      {R"({"type":"integer","minimum":0,"maximum":0})", 0, 0},
      {R"({"type":"integer","minimum":-1000})", -1000, 1500},
      {R"({"type":"integer","maximum":-1})", -1500, -1},
  };
  for (const auto& c : cases) {
    auto cg = schema_grammar(c.schema);
    ASSERT_TRUE(cg);
    for (int64_t v = -1500; v <= 1500; ++v)
      ASSERT_EQ(accepts(cg, std::to_string(v)), v >= c.lo && v <= c.hi) << c.schema << " value " << v;
    EXPECT_FALSE(accepts(cg, "007")) << c.schema;
    EXPECT_FALSE(accepts(cg, "-0")) << c.schema;
    EXPECT_FALSE(accepts(cg, "1.0")) << c.schema;
  }
}

TEST(GrammarJsonSchema, NumberBounds) {
  auto cg = schema_grammar(R"({"type":"number","minimum":-10,"exclusiveMaximum":10})");
  ASSERT_TRUE(cg);
  for (const char* ok : {"-10", "-10.0", "-9.99", "0", "0.5", "9.999", "-0.25", "3"}) EXPECT_TRUE(accepts(cg, ok)) << ok;
  for (const char* bad : {"-10.01", "10", "10.0", "11", "-11", "1e1", "-10.5"}) EXPECT_FALSE(accepts(cg, bad)) << bad;
  cg = schema_grammar(R"({"type":"number","exclusiveMinimum":0})");
  ASSERT_TRUE(cg);
  for (const char* ok : {"0.001", "1", "12345.5"}) EXPECT_TRUE(accepts(cg, ok)) << ok;
  for (const char* bad : {"0", "0.0", "-1", "-0.5"}) EXPECT_FALSE(accepts(cg, bad)) << bad;
  cg = schema_grammar(R"({"type":"number"})");
  ASSERT_TRUE(cg);
  for (const char* ok : {"0", "-1.5e10", "3.25E-2", "12"}) EXPECT_TRUE(accepts(cg, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e"}) EXPECT_FALSE(accepts(cg, bad)) << bad;
}

TEST(GrammarJsonSchema, NumericFormats) {
  auto cg = schema_grammar(R"({"type":"integer","format":"int32"})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "2147483647"));
  EXPECT_TRUE(accepts(cg, "-2147483648"));
  EXPECT_FALSE(accepts(cg, "2147483648"));
  EXPECT_FALSE(accepts(cg, "-2147483649"));
  EXPECT_EQ(error_of(R"({"type":"number","format":"decimal"})"),
            "json schema: /format: format 'decimal' is not supported for numbers (int32, int64, float, double are)");
}

TEST(GrammarJsonSchema, Formats) {
  auto cg = schema_grammar(R"({"type":"string","format":"date"})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "\"2024-02-28\""));
  EXPECT_TRUE(accepts(cg, "\"1999-12-31\""));
  EXPECT_FALSE(accepts(cg, "\"2024-02-30\""));
  EXPECT_FALSE(accepts(cg, "\"2024-04-31\""));
  EXPECT_FALSE(accepts(cg, "\"2024-13-01\""));
  cg = schema_grammar(R"({"type":"string","format":"date-time"})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "\"2024-01-05T23:59:59Z\""));
  EXPECT_TRUE(accepts(cg, "\"2024-01-05T00:00:00.123+05:30\""));
  EXPECT_FALSE(accepts(cg, "\"2024-01-05T24:00:00Z\""));
  EXPECT_FALSE(accepts(cg, "\"2024-01-05T10:00:00\""));  // a time zone is required (ajv-formats' strict time)
  cg = schema_grammar(R"({"type":"string","format":"uuid"})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(accepts(cg, "\"123e4567e89b12d3a456426614174000\""));
  cg = schema_grammar(R"({"type":"string","format":"email"})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "\"ada.lovelace+test@mail.example.org\""));
  EXPECT_FALSE(accepts(cg, "\"ada@localhost\""));
  EXPECT_FALSE(accepts(cg, "\"@example.org\""));
}

TEST(GrammarJsonSchema, ObjectsKeepOrderAndOptionalMembers) {
  auto cg = schema_grammar(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
      "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  ASSERT_TRUE(cg);
  for (const char* ok : {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})", R"({"a":1,"b":"","c":false})",
                         "{ \"a\": 1,\n  \"b\": \"x\" }"})
    EXPECT_TRUE(accepts(cg, ok)) << ok;
  for (const char* bad : {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","d":1})", R"({"b":"x",})",
                          R"({"b":"x","b":"y"})", " {\"b\":\"x\"}"})
    EXPECT_FALSE(accepts(cg, bad)) << bad;
}

TEST(GrammarJsonSchema, AdditionalPropertiesNeverRepeatDeclaredNames) {
  auto cg = schema_grammar(R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},
      "required":["n"],"additionalProperties":{"type":"integer"}})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, R"({"n":1,"nam":2,"names":3,"x":4,"":5})"));
  EXPECT_TRUE(accepts(cg, R"({"name":"a","n":1})"));
  EXPECT_FALSE(accepts(cg, R"({"n":1,"name":2})"));
  EXPECT_FALSE(accepts(cg, R"({"n":1,"n":2})"));
  EXPECT_FALSE(accepts(cg, R"({"n":1,"x":"s"})"));
}

TEST(GrammarJsonSchema, WhitespaceIsBoundedOrOff) {
  auto cg = schema_grammar(R"({"type":"array","items":{"type":"integer"}})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "[1, 2,\n\n    3]\n"));
  EXPECT_FALSE(accepts(cg, "[1,\n\n\n3]"));
  EXPECT_FALSE(accepts(cg, "[1," + std::string(21, ' ') + "2]"));
  SchemaOptions tight;
  tight.allow_whitespace = false;
  cg = schema_grammar(R"({"type":"array","items":{"type":"integer"}})", tight);
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "[1,2,3]"));
  EXPECT_FALSE(accepts(cg, "[1, 2]"));
}

TEST(GrammarJsonSchema, ArraysCountItems) {
  auto cg = schema_grammar(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
      "items":{"type":"boolean"},"minItems":1,"maxItems":4})");
  ASSERT_TRUE(cg);
  for (const char* ok : {R"(["a"])", R"(["a",1])", R"(["a",1,true])", R"(["a",1,true,false])"})
    EXPECT_TRUE(accepts(cg, ok)) << ok;
  for (const char* bad : {"[]", R"([1])", R"(["a",1,true,false,true])", R"(["a",true])"})
    EXPECT_FALSE(accepts(cg, bad)) << bad;
}

TEST(GrammarJsonSchema, RecursiveReferences) {
  auto cg = schema_grammar(R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["v"],"additionalProperties":false}},
      "$ref":"#/$defs/n"})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(accepts(cg, R"({"v":1,"kids":[{"kids":[]}]})"));
}

TEST(GrammarJsonSchema, EnumConstAndJsonObjectMode) {
  auto cg = schema_grammar(R"({"enum":["a\"b", 1, null, {"k":[true]}]})");
  ASSERT_TRUE(cg);
  for (const char* ok : {R"("a\"b")", "1", "null", R"({"k":[true]})"}) EXPECT_TRUE(accepts(cg, ok)) << ok;
  EXPECT_FALSE(accepts(cg, "2"));
  auto obj = test::compile(json_object_gbnf(), test::byte_vocab());
  ASSERT_TRUE(obj);
  EXPECT_TRUE(accepts(obj, R"({"x": [1, {"y": null}], "z": "\u00e9\n"})"));
  EXPECT_FALSE(accepts(obj, "[1]"));
  EXPECT_FALSE(accepts(obj, R"({"s": "\ud800"})"));  // a lone surrogate escape: not valid text
}

TEST(GrammarJsonSchema, ErrorsNameKeywordAndPointer) {
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":5}}})"),
            "json schema: /properties/age/multipleOf: keyword 'multipleOf' is not supported");
  EXPECT_EQ(error_of(R"({"not":{"type":"string"}})"), "json schema: /not: keyword 'not' is not supported");
  EXPECT_EQ(error_of(R"({"type":"array","uniqueItems":true})"),
            "json schema: /uniqueItems: uniqueItems: true is not supported");
  EXPECT_EQ(error_of(R"({"type":"string","format":"uri"})"),
            "json schema: /format: format 'uri' is not supported (date, time, date-time, uuid, email are)");
  EXPECT_EQ(error_of(R"({"$ref":"https://example.org/s.json"})"),
            "json schema: /$ref: only local references (\"#...\") are supported, not 'https://example.org/s.json'");
  EXPECT_EQ(error_of(R"({"$ref":"#/$defs/missing"})"), "json schema: /$ref: reference '#/$defs/missing' does not resolve");
  EXPECT_EQ(error_of(R"({"items":false,"type":"array","minItems":1})"),
            "json schema: /minItems: no array satisfies minItems, maxItems and the item schemas together");
  EXPECT_EQ(error_of(R"({"properties":{"a":false}})"), "json schema: /properties/a: the schema 'false' matches nothing");
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"^(?=a)b$"})"),
            "json schema: /pattern: regex: offset 2: lookaround, flags and other (?...) groups are not supported");
  EXPECT_EQ(error_of(R"({"type":"number","minimum":0.5})"),
            "json schema: /minimum: a bound on a non-integer number must be an integer to be enforced");
  EXPECT_EQ(error_of(R"({"type":"integer","minimum":10,"maximum":5})"), "json schema: /: no integer lies within minimum / maximum");
  EXPECT_EQ(error_of(R"({"type":"string","minLength":5,"maxLength":2})"), "json schema: /minLength: minLength is above maxLength");
  EXPECT_EQ(error_of(R"({"anyOf":[{"type":"string"}],"minLength":2})"),
            "json schema: /minLength: keyword 'minLength' beside 'anyOf' is not supported");
  EXPECT_EQ(error_of(R"({"allOf":[{"properties":{"a":{}},"additionalProperties":false},{"properties":{"b":{}}}]})"),
            "json schema: /allOf: additionalProperties: false in one member forbids property 'b' of another");
  EXPECT_EQ(error_of(R"({"type":"strng"})"), "json schema: /type: unknown type \"strng\"");
  EXPECT_EQ(error_of("{\"type\":"), "json schema: not valid JSON");
  std::string deep = "true";
  for (int i = 0; i < 200; ++i) deep = "{\"items\":" + deep + "}";
  EXPECT_NE(error_of(deep).find("schemas nested deeper than 100"), std::string::npos);
}

TEST(GrammarJsonSchema, AllOfMergesObjectsAndBounds) {
  auto cg = schema_grammar(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
      {"properties":{"b":{"type":"string"}},"required":["b"]}]})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(accepts(cg, R"({"a":1})"));
  cg = schema_grammar(R"({"allOf":[{"type":"integer","minimum":3},{"maximum":5}]})");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "4"));
  EXPECT_FALSE(accepts(cg, "6"));
  EXPECT_FALSE(accepts(cg, "2"));
}

}  // namespace
}  // namespace kiln::grammar
