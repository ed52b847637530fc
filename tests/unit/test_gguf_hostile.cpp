// Hostile GGUF inputs crafted byte by byte: each must give an error naming the problem and the byte offset.
#include <cinttypes>
#include <memory>

#include "common/test_util.h"
#include "gguf/gguf.h"

namespace kiln::gguf {
namespace {

// Little-endian byte builder for hand-made files.
struct Raw {
  std::string b;
  Raw& u8(uint8_t x) { return put(x); }
  Raw& u32(uint32_t x) { return put(x); }
  Raw& u64(uint64_t x) { return put(x); }
  Raw& str(std::string_view s) {
    u64(s.size());
    b.append(s);
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_str(std::string_view k, std::string_view v) { return str(k).u32(8).str(v); }
  Raw& kv_u32(std::string_view k, uint32_t v) { return str(k).u32(4).u32(v); }
  Raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) u64(n);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t a = 32) {
    while (b.size() % a) b.push_back('\0');
    return *this;
  }
  Raw& zeros(size_t n) {
    b.append(n, '\0');
    return *this;
  }
  size_t size() const { return b.size(); }
  template <class T>
  Raw& put(T x) {
    b.append(reinterpret_cast<const char*>(&x), sizeof(T));
    return *this;
  }
};

Result<File> parse_bytes(const std::string& bytes) {
  auto keep = std::make_shared<std::string>(bytes);
  auto span = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(keep->data()), keep->size());
  return File::parse(MappedFile::from_memory(span, "mem.gguf", keep));
}

// Expects a parse error whose message holds every one of `parts`.
void expect_error(const Raw& r, std::vector<std::string> parts) {
  auto f = parse_bytes(r.b);
  ASSERT_FALSE(f.is_ok()) << "parsed although it should fail: " << parts[0];
  const std::string& msg = f.status().message();
  EXPECT_NE(msg.find("mem.gguf"), std::string::npos) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

std::string at(size_t off) { return "at offset " + std::to_string(off); }

// A valid file: one kv, tensors a and b (f32 [8]) at 0 and 32.
Raw good() {
  Raw r;
  r.header(2, 1).kv_str("general.architecture", "x").tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(64);
  return r;
}

TEST(GgufHostile, GoodBaseParses) {
  auto f = parse_bytes(good().b);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[1].data, f->mapping()->data() + f->data_offset() + 32);
  Raw v2 = good();
  v2.b[4] = 2;
  EXPECT_TRUE(parse_bytes(v2.b).is_ok());
}

TEST(GgufHostile, EveryTruncationFails) {
  const std::string full = good().b;
  for (size_t n = 0; n < full.size(); ++n) {
    auto f = parse_bytes(full.substr(0, n));
    ASSERT_FALSE(f.is_ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_NE(f.status().message().find("at offset"), std::string::npos) << f.status().message();
  }
  Raw r;
  r.header(0, 1).str("key").u32(8).u64(10).b += "abc";
  expect_error(r, {"string length 10 runs past the end", at(39)});
}

TEST(GgufHostile, BadMagicAndVersions) {
  Raw r = good();
  r.b[0] = 'X';
  expect_error(r, {"bad magic", at(0)});
  Raw v1;
  v1.header(0, 0, 1);
  expect_error(v1, {"unsupported GGUF version 1", at(4)});
  Raw v4;
  v4.header(0, 0, 4);
  expect_error(v4, {"unsupported GGUF version 4", at(4)});
  Raw be;
  be.header(0, 0, 0x03000000);
  expect_error(be, {"big-endian", at(4)});
}

TEST(GgufHostile, HugeCounts) {
  Raw kv;
  kv.header(0, uint64_t{1} << 60).kv_str("a", "b");
  expect_error(kv, {"metadata count 1152921504606846976", at(16)});
  Raw t;
  t.header(uint64_t{1} << 59, 0).tensor("a", {8}, 0, 0);
  expect_error(t, {"tensor count", at(8)});
  Raw arr;
  arr.header(0, 1).str("k").u32(9).u32(0).u64(uint64_t{1} << 62).zeros(16);
  expect_error(arr, {"array of 4611686018427387904 u8 items", "'k'", at(24 + 9 + 4 + 4)});
  Raw sarr;  // 1000 strings claimed, room for 2 lengths only
  sarr.header(0, 1).str("k").u32(9).u32(8).u64(1000).zeros(16);
  expect_error(sarr, {"array of 1000 string items"});
  Raw key;
  key.header(0, 1).u64(uint64_t{1} << 40).zeros(8);
  expect_error(key, {"string length 1099511627776", at(24)});
}

TEST(GgufHostile, EmptyKeyIsRejectedNamingItsOffset) {
  // The GGUF spec requires non-empty keys: the first key of the file (at offset 24) and a later one.
  Raw first;
  first.header(0, 1).str("").u32(4).u32(7);
  expect_error(first, {"empty metadata key", at(24)});
  Raw second;
  second.header(0, 2).kv_u32("a", 1).str("").u32(4).u32(7);
  expect_error(second, {"empty metadata key", at(24 + 8 + 1 + 4 + 4)});
  Raw ok;  // a one-byte key is fine
  ok.header(0, 1).kv_u32("k", 7);
  EXPECT_TRUE(parse_bytes(ok.b).is_ok());
}

TEST(GgufHostile, PartialParseKeepsWhatWasReadIntact) {
  // Truncated inside tensor b's data: the header, the metadata and both tensor infos are intact.
  const std::string full = good().b;
  auto keep = std::make_shared<std::string>(full.substr(0, full.size() - 8));
  auto span = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(keep->data()), keep->size());
  File partial;
  auto f = File::parse(MappedFile::from_memory(span, "mem.gguf", keep), &partial);
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("tensor 'b'"), std::string::npos) << f.status().message();
  EXPECT_EQ(partial.version(), 3u);
  ASSERT_EQ(partial.kvs().size(), 1u);
  EXPECT_EQ(partial.kvs()[0].key, "general.architecture");
  ASSERT_NE(partial.find("general.architecture"), nullptr);
  ASSERT_EQ(partial.tensors().size(), 2u);
  EXPECT_NE(partial.tensors()[0].data, nullptr);  // a was placed before the error
  EXPECT_EQ(partial.tensors()[1].data, nullptr);  // b was not
  // Cut inside the metadata: only what precedes it.
  Raw two;
  two.header(0, 2).kv_u32("a", 1).kv_u32("b", 2);
  auto keep2 = std::make_shared<std::string>(two.b.substr(0, two.b.size() - 2));
  auto span2 = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(keep2->data()), keep2->size());
  File partial2;
  ASSERT_FALSE(File::parse(MappedFile::from_memory(span2, "mem.gguf", keep2), &partial2).is_ok());
  ASSERT_EQ(partial2.kvs().size(), 1u);
  EXPECT_EQ(partial2.kvs()[0].key, "a");
  EXPECT_TRUE(partial2.tensors().empty());
}

TEST(GgufHostile, BadValues) {
  Raw unk;
  unk.header(0, 1).str("k").u32(13).u32(0);
  expect_error(unk, {"unknown value type 13", "'k'", at(33)});
  Raw unk_el;
  unk_el.header(0, 1).str("k").u32(9).u32(42).u64(0);
  expect_error(unk_el, {"unknown array element type 42", at(37)});
  Raw b;
  b.header(0, 1).str("flag").u32(7).u8(2);
  expect_error(b, {"bool value 2", "'flag'", at(40)});
  Raw deep;  // 9 nested arrays, one more than allowed
  deep.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 8; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  expect_error(deep, {"nested deeper than 8"});
  Raw ok8;  // 8 levels are fine
  ok8.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 7; ++i) ok8.u32(9).u64(1);
  ok8.u32(4).u64(0);
  EXPECT_TRUE(parse_bytes(ok8.b).is_ok());
  Raw dup;
  dup.header(0, 2).kv_str("a", "1");
  const size_t second = dup.size();
  dup.kv_str("a", "2");
  expect_error(dup, {"duplicate key 'a'", at(second), "first at offset 24"});
}

TEST(GgufHostile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Raw r;
    r.header(0, 1).kv_u32("general.alignment", a);
    expect_error(r, {"general.alignment " + std::to_string(a) + " is not a non-zero power of two", at(24)});
  }
  Raw t;
  t.header(0, 1).str("general.alignment").u32(10).u64(64);
  expect_error(t, {"general.alignment has type u64"});
  Raw ok;  // alignment 64: tensor offsets must be multiples of 64, data starts at a multiple of 64
  ok.header(1, 1).kv_u32("general.alignment", 64).tensor("a", {8}, 0, 0).pad(64).zeros(64);
  auto f = parse_bytes(ok.b);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->data_offset() % 64, 0u);
  Raw mis;
  mis.header(1, 1).kv_u32("general.alignment", 64);
  const size_t info = mis.size();
  mis.tensor("a", {8}, 0, 32).pad(64).zeros(128);
  expect_error(mis, {"data offset 32 is not a multiple of the alignment 64", at(info + 8 + 1 + 4 + 8 + 4)});
}

TEST(GgufHostile, BadTensorInfos) {
  const size_t info = 24;  // tensor infos start right after the header when there are no kvs
  const size_t dims_at = info + 8 + 1;
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset = 0) {
    Raw r;
    r.header(1, 0).tensor("t", std::move(ne), type, offset).pad().zeros(64);
    return r;
  };
  expect_error(one({1, 1, 1, 1, 1}, 0), {"tensor 't': 5 dimensions", at(dims_at)});
  expect_error(one({}, 0), {"tensor 't': 0 dimensions", at(dims_at)});
  expect_error(one({8, static_cast<uint64_t>(-5)}, 0), {"dimension 1 is negative (-5)", at(dims_at + 4 + 8)});
  expect_error(one({uint64_t{1} << 32, uint64_t{1} << 32}, 0), {"overflows int64", at(dims_at + 4 + 8)});
  expect_error(one({uint64_t{1} << 31, uint64_t{1} << 31}, 0), {"overflows 64 bits", at(dims_at)});
  expect_error(one({33}, 2), {"ne[0] = 33 is not a multiple of q4_0's block size 32", at(dims_at + 4)});
  expect_error(one({8}, 57), {"unknown tensor type id 57", at(dims_at + 4 + 8)});
  expect_error(one({8}, 4), {"unknown tensor type id 4"});  // removed Q4_2
  expect_error(one({8}, 0, 16), {"data offset 16 is not a multiple of the alignment 32"});
  expect_error(one({8}, 0, 1 << 20), {"tensor 't': data", "lies outside the file", at(info)});
  expect_error(one({1000}, 0), {"lies outside the file"});
  // The data section must exist when there are tensors.
  Raw nodata;
  nodata.header(1, 0).tensor("t", {8}, 0, 0);
  expect_error(nodata, {"starts past the end of the file"});
}

TEST(GgufHostile, DuplicateAndOverlappingTensors) {
  Raw dup;
  dup.header(2, 0).tensor("t", {8}, 0, 0);
  const size_t second = dup.size();
  dup.tensor("t", {8}, 0, 32).pad().zeros(64);
  expect_error(dup, {"duplicate tensor name 't'", at(second)});
  Raw ov;
  ov.header(3, 0).tensor("a", {8}, 0, 64).tensor("b", {16}, 0, 0);  // b is 64 bytes: ends where a starts: ok
  const size_t c_info = ov.size();
  ov.tensor("c", {16}, 0, 32).pad().zeros(96);  // c = [32, 96) overlaps b = [0, 64)
  expect_error(ov, {"tensor 'c'", "overlaps tensor 'b'", at(c_info)});
  Raw adj;
  adj.header(2, 0).tensor("a", {8}, 0, 64).tensor("b", {16}, 0, 0).pad().zeros(96);
  EXPECT_TRUE(parse_bytes(adj.b).is_ok());
}

TEST(GgufHostile, NoTensorsNeedNoDataSection) {
  Raw r;
  r.header(0, 1).kv_str("tokenizer.ggml.model", "gpt2");  // vocab-only files may end right after the kvs
  auto f = parse_bytes(r.b);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_str("tokenizer.ggml.model"), "gpt2");
}

}  // namespace
}  // namespace kiln::gguf
