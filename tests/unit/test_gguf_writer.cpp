// Writer -> reader round trips: every value type, nested arrays, alignments, borrowed and generated tensors.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/test_util.h"
#include "gguf/gguf.h"

namespace kiln::gguf {
namespace {

std::string temp_path(const std::string& name) {
  return ::kiln::test::temp_dir() + "kiln_test_" + name;
}

Value nested(int levels) {  // [[[...[1, 2]...]]] with `levels` arrays
  Array inner;
  inner.type = ValueType::I32;
  inner.items = {int32_t{1}, int32_t{2}};
  Value v = inner;
  for (int i = 1; i < levels; ++i) {
    Array a;
    a.type = ValueType::ARRAY;
    a.items.push_back(v);
    v = a;
  }
  return v;
}

TEST(GgufWriter, RoundTripsEveryValueType) {
  Writer w;
  w.set("u8", uint8_t{200});
  w.set("i8", int8_t{-100});
  w.set("u16", uint16_t{60000});
  w.set("i16", int16_t{-30000});
  w.set("u32", uint32_t{4000000000u});
  w.set("i32", int32_t{-2000000000});
  w.set("f32", 1.5f);
  w.set("bool", true);
  w.set("str", "héllo\nworld");
  w.set("u64", uint64_t{1} << 63);
  w.set("i64", int64_t{-(int64_t{1} << 62)});
  w.set("f64", 3.141592653589793);
  Array strs;
  strs.type = ValueType::STRING;
  for (int i = 0; i < 1000; ++i) strs.items.push_back(std::string("tok") + std::to_string(i));
  w.set("strs", strs);
  Array empty;
  empty.type = ValueType::F32;
  w.set("empty", empty);
  w.set("nested8", nested(8));
  w.set("u32", uint32_t{7});  // set() on an existing key replaces in place
  const std::string path = temp_path("values.gguf");
  ASSERT_TRUE(w.write(path).is_ok());

  auto f = File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->kvs().size(), 15u);
  EXPECT_EQ(f->kvs()[4].key, "u32");  // insertion order kept
  EXPECT_EQ(std::get<uint8_t>(f->find("u8")->v), 200);
  EXPECT_EQ(std::get<int8_t>(f->find("i8")->v), -100);
  EXPECT_EQ(std::get<uint16_t>(f->find("u16")->v), 60000);
  EXPECT_EQ(std::get<int16_t>(f->find("i16")->v), -30000);
  EXPECT_EQ(*f->get_u32("u32"), 7u);
  EXPECT_EQ(std::get<int32_t>(f->find("i32")->v), -2000000000);
  EXPECT_EQ(*f->get_f32("f32"), 1.5f);
  EXPECT_EQ(*f->get_bool("bool"), true);
  EXPECT_EQ(*f->get_str("str"), "héllo\nworld");
  EXPECT_EQ(*f->get_u64("u64"), uint64_t{1} << 63);
  EXPECT_EQ(*f->get_i64("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(std::get<double>(f->find("f64")->v), 3.141592653589793);
  auto s = f->get_str_array("strs");
  ASSERT_TRUE(s.is_ok());
  ASSERT_EQ(s->size(), 1000u);
  EXPECT_EQ((*s)[999], "tok999");
  EXPECT_EQ(f->find("empty")->arr().type, ValueType::F32);
  EXPECT_TRUE(f->find("empty")->arr().items.empty());
  const Value* v = f->find("nested8");
  for (int i = 1; i < 8; ++i) {
    ASSERT_TRUE(v->is_array());
    ASSERT_EQ(v->arr().type, ValueType::ARRAY);
    v = &v->arr().items[0];
  }
  ASSERT_EQ(v->arr().type, ValueType::I32);
  EXPECT_EQ(std::get<int32_t>(v->arr().items[1].v), 2);
  EXPECT_TRUE(f->tensors().empty());
  std::filesystem::remove(path);
}

TEST(GgufWriter, GettersConvertAndNameTheKey) {
  Writer w;
  w.set("small", uint8_t{5});
  w.set("neg", int32_t{-1});
  w.set("d", 0.25);
  w.set("s", "x");
  Array ints;
  ints.type = ValueType::U16;
  ints.items = {uint16_t{1}, uint16_t{65535}};
  w.set("ints", ints);
  const std::string path = temp_path("getters.gguf");
  ASSERT_TRUE(w.write(path).is_ok());
  auto f = File::open(path);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(*f->get_u64("small"), 5u);
  EXPECT_EQ(*f->get_f32("small"), 5.0f);
  EXPECT_EQ(*f->get_f32("d"), 0.25f);
  EXPECT_EQ(*f->get_i64("neg"), -1);
  auto bad = f->get_u32("neg");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'neg'"), std::string::npos);
  auto wrong = f->get_str("small");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("u8"), std::string::npos);
  auto miss = f->get_u32("nope");
  ASSERT_FALSE(miss.is_ok());
  EXPECT_EQ(miss.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(*f->get_u32_or("nope", 9), 9u);
  EXPECT_FALSE(f->get_u32_or("s", 9).is_ok());  // present with the wrong type is still an error
  EXPECT_EQ(*f->get_str_or("nope", "fb"), "fb");
  auto iv = f->get_i32_array("ints");
  ASSERT_TRUE(iv.is_ok());
  EXPECT_EQ((*iv)[1], 65535);
  EXPECT_FALSE(f->get_str_array("ints").is_ok());
  std::filesystem::remove(path);
}

// A deterministic byte pattern for tensor t at byte i.
uint8_t pattern(int t, uint64_t i) { return static_cast<uint8_t>((i * 2654435761u + t * 97u) >> 7); }

void round_trip_tensors(uint64_t alignment, int n_threads) {
  Writer w;
  w.set("general.architecture", "test");
  w.set_alignment(alignment);
  std::vector<float> norm(96);
  for (size_t i = 0; i < norm.size(); ++i) norm[i] = 1.0f + 0.01f * static_cast<float>(i);
  ASSERT_TRUE(w.add_tensor("norm.weight", DType::F32, {96}, norm.data()).is_ok());
  // 20 MB of q8_0 so several chunks are produced (and checked for block alignment) in parallel.
  const int64_t rows = 20 * (1 << 20) / 34 / 4;
  std::atomic<uint64_t> bad_chunks{0};
  ASSERT_TRUE(w.add_tensor("big.weight", DType::Q8_0, {128, rows}, [&](uint8_t* dst, uint64_t b, uint64_t n) {
                 if (b % 34 != 0 || n % 34 != 0 || n > Writer::kWriteChunkBytes) bad_chunks++;
                 for (uint64_t i = 0; i < n; ++i) dst[i] = pattern(1, b + i);
               }).is_ok());
  ASSERT_TRUE(w.add_tensor("cube", DType::F16, {4, 3, 2, 5}, [&](uint8_t* dst, uint64_t b, uint64_t n) {
                 for (uint64_t i = 0; i < n; ++i) dst[i] = pattern(2, b + i);
               }).is_ok());
  ASSERT_TRUE(w.add_tensor("empty", DType::F32, {0, 4}, nullptr).is_ok());
  const std::string path = temp_path("tensors.gguf");
  ASSERT_TRUE(w.write(path, n_threads).is_ok());
  auto size = w.file_size();
  ASSERT_TRUE(size.is_ok());
  EXPECT_EQ(*size, std::filesystem::file_size(path));
  EXPECT_EQ(bad_chunks.load(), 0u);

  auto f = File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->alignment(), alignment);
  EXPECT_EQ(f->data_offset() % alignment, 0u);
  EXPECT_EQ(f->has("general.alignment"), alignment != 32);
  ASSERT_EQ(f->tensors().size(), 4u);
  const TensorInfo* n = f->find_tensor("norm.weight");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, DType::F32);
  EXPECT_EQ(n->n_dims, 1u);
  EXPECT_EQ(0, std::memcmp(n->data, norm.data(), norm.size() * 4));
  const TensorInfo* big = f->find_tensor("big.weight");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->type, DType::Q8_0);
  EXPECT_EQ(big->ne[1], rows);
  EXPECT_EQ(big->nbytes, static_cast<uint64_t>(rows) * 4 * 34);
  uint64_t mismatches = 0;
  for (uint64_t i = 0; i < big->nbytes; ++i) mismatches += big->data[i] != pattern(1, i);
  EXPECT_EQ(mismatches, 0u);
  const TensorInfo* cube = f->find_tensor("cube");
  ASSERT_NE(cube, nullptr);
  EXPECT_EQ(cube->shape_string(), "[4, 3, 2, 5]");
  EXPECT_EQ(cube->n_elements(), 120);
  for (uint64_t i = 0; i < cube->nbytes; ++i) ASSERT_EQ(cube->data[i], pattern(2, i));
  for (const TensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % alignment, 0u) << t.name;
  EXPECT_EQ(f->find_tensor("empty")->nbytes, 0u);
  std::filesystem::remove(path);
}

TEST(GgufWriter, TensorsDefaultAlignmentOneThread) { round_trip_tensors(32, 1); }
TEST(GgufWriter, TensorsAlignment64Parallel) { round_trip_tensors(64, 3); }
TEST(GgufWriter, TensorsAlignment4096Parallel) { round_trip_tensors(4096, 2); }

TEST(GgufWriter, RejectsBadInput) {
  Writer w;
  EXPECT_FALSE(w.add_tensor("a", DType::Q4_0, {33}, [](uint8_t*, uint64_t, uint64_t) {}).is_ok());
  EXPECT_FALSE(w.add_tensor("a", DType::F32, {}, [](uint8_t*, uint64_t, uint64_t) {}).is_ok());
  EXPECT_FALSE(w.add_tensor("a", DType::F32, {1, 1, 1, 1, 1}, [](uint8_t*, uint64_t, uint64_t) {}).is_ok());
  EXPECT_FALSE(w.add_tensor("a", DType::F32, {-1}, [](uint8_t*, uint64_t, uint64_t) {}).is_ok());
  EXPECT_FALSE(w.add_tensor("a", DType::F32, {4}, static_cast<const void*>(nullptr)).is_ok());
  ASSERT_TRUE(w.add_tensor("a", DType::F32, {4}, [](uint8_t* d, uint64_t, uint64_t n) { std::memset(d, 0, n); }).is_ok());
  auto dup = w.add_tensor("a", DType::F32, {4}, [](uint8_t*, uint64_t, uint64_t) {});
  ASSERT_FALSE(dup.is_ok());
  EXPECT_NE(dup.message().find("'a'"), std::string::npos);
  w.set_alignment(48);
  auto st = w.write(temp_path("never.gguf"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("alignment 48"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(temp_path("never.gguf")));
  w.set_alignment(32);
  Array mixed;
  mixed.type = ValueType::U8;
  mixed.items = {uint8_t{1}, int8_t{2}};
  w.set("mixed", mixed);
  st = w.write(temp_path("never.gguf"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("mixed"), std::string::npos);
  w.remove("mixed");
  w.set("deep", nested(9));
  EXPECT_FALSE(w.write(temp_path("never.gguf")).is_ok());
  w.remove("deep");
  EXPECT_FALSE(w.write("/nonexistent-dir/x.gguf").is_ok());
}

TEST(GgufWriter, RejectsAnEmptyKey) {
  Writer w;
  w.set("", uint32_t{1});
  const std::string path = temp_path("emptykey.gguf");
  Status st = w.write(path);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("empty metadata key"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(path));
}

// The output target (kiln synth -o): a fresh folder per test with one small model written into it.
class WriterTarget : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_path(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    w_.set("general.architecture", "x");
    ASSERT_TRUE(w_.add_tensor("t", DType::F32, {64}, data_).is_ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // Names in the folder (to see that no temporary file is left behind).
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  bool parses(const std::string& p) const {
    auto f = File::open(p);
    return f.is_ok() && f->tensors().size() == 1 && f->tensors()[0].name == "t";
  }

  std::string dir_;
  float data_[64] = {};
  Writer w_;
};

TEST_F(WriterTarget, RefusesAFifoAndLeavesItAlone) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  Status st = w_.write(fifo);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("is a FIFO, not a regular file"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(fifo), std::string::npos) << st.message();
  struct stat sb {};
  ASSERT_EQ(::lstat(fifo.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISFIFO(sb.st_mode));
  EXPECT_EQ(listing(), std::vector<std::string>{"fifo"});
  // Through a symlink too: the link's target is what counts.
  ASSERT_EQ(::symlink("fifo", path("link").c_str()), 0);
  st = w_.write(path("link"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("(the target of '" + path("link") + "') is a FIFO"), std::string::npos)
      << st.message();
  // A directory is refused the same way.
  std::filesystem::create_directory(path("sub"));
  st = w_.write(path("sub"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("is a directory"), std::string::npos) << st.message();
  EXPECT_EQ(listing(), (std::vector<std::string>{"fifo", "link", "sub"}));
}

TEST_F(WriterTarget, FollowsASymlinkAndKeepsIt) {
  { std::ofstream(path("real.gguf")) << "old contents"; }
  ASSERT_EQ(::symlink("real.gguf", path("model.gguf").c_str()), 0);
  Status st = w_.write(path("model.gguf"));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(std::filesystem::is_symlink(path("model.gguf")));
  EXPECT_EQ(std::filesystem::read_symlink(path("model.gguf")), "real.gguf");
  EXPECT_TRUE(parses(path("real.gguf")));
  EXPECT_TRUE(parses(path("model.gguf")));
  EXPECT_EQ(listing(), (std::vector<std::string>{"model.gguf", "real.gguf"}));
  // A dangling link (chained through a second one) creates its target.
  ASSERT_EQ(::symlink("new.gguf", path("dangling").c_str()), 0);
  ASSERT_EQ(::symlink(path("dangling").c_str(), path("chain").c_str()), 0);
  st = w_.write(path("chain"));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(std::filesystem::is_symlink(path("chain")));
  EXPECT_TRUE(std::filesystem::is_symlink(path("dangling")));
  EXPECT_TRUE(parses(path("new.gguf")));
  // A symlink loop is an error, not a hang.
  ASSERT_EQ(::symlink("loop2", path("loop1").c_str()), 0);
  ASSERT_EQ(::symlink("loop1", path("loop2").c_str()), 0);
  st = w_.write(path("loop1"));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("too many levels of symbolic links"), std::string::npos) << st.message();
}

TEST_F(WriterTarget, NeverClobbersAnExistingTmpFile) {
  const std::string out = path("model.gguf");
  { std::ofstream(out + ".tmp") << "someone else's file"; }
  ASSERT_TRUE(w_.write(out).is_ok());
  EXPECT_TRUE(parses(out));
  EXPECT_EQ(test::slurp(out + ".tmp"), "someone else's file");
  // Replacing an existing model, twice, leaves no temporary file behind.
  ASSERT_TRUE(w_.write(out).is_ok());
  ASSERT_TRUE(w_.write(out, 2).is_ok());
  EXPECT_TRUE(parses(out));
  EXPECT_EQ(listing(), (std::vector<std::string>{"model.gguf", "model.gguf.tmp"}));
}

TEST_F(WriterTarget, AFailedWriteLeavesTheTargetAndNoTemporary) {
  const std::string out = path("model.gguf");
  ASSERT_TRUE(w_.write(out).is_ok());
  Writer bad;
  bad.set("k", uint32_t{1});
  ASSERT_TRUE(bad.add_tensor("big", DType::F32, {64}, [](uint8_t* d, uint64_t, uint64_t n) { std::memset(d, 1, n); }).is_ok());
  bad.set_alignment(48);  // invalid: reported by write() before any file is made
  ASSERT_FALSE(bad.write(out).is_ok());
  EXPECT_TRUE(parses(out));
  EXPECT_EQ(listing(), std::vector<std::string>{"model.gguf"});
}

TEST(GgufValue, ToStringSummarizesLongArrays) {
  Array a;
  a.type = ValueType::U32;
  for (uint32_t i = 0; i < 100; ++i) a.items.push_back(i);
  Value v = a;
  EXPECT_EQ(v.to_string(3), "[0, 1, 2, ... (97 more)]");
  EXPECT_EQ(Value("a\"b\n").to_string(), "\"a\\\"b\\n\"");
  EXPECT_EQ(Value(true).to_string(), "true");
  EXPECT_EQ(Value(int8_t{-3}).to_string(), "-3");
  EXPECT_TRUE(Value(uint16_t{1}).is_integer());
  EXPECT_FALSE(Value(1.0f).is_integer());
}

}  // namespace
}  // namespace kiln::gguf
