// Hostile input through the kiln binary (issue 12): each case runs under a memory limit (ulimit -v 8000000, 8 GB of
// address space) and a timeout (60 s), and must end with exit status 1 and a message naming the problem (the
// key, the flag, the file) — never a signal, an abort, a hang or unbounded memory.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "gguf/gguf.h"

#if defined(__SANITIZE_ADDRESS__)
#define KILN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_TEST_ASAN 1
#endif
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;

const std::string kLlama = test::data_path("models/fixture-llama-f16.gguf");  // 2 blocks, 22 tensors

// A folder of this test's own (removed at the end of the test).
class CliHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kiln::test::temp_dir() + "kiln_hostile_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // `kiln <args>` under the memory limit and the timeout; stdout and stderr apart. (Under AddressSanitizer the
  // address-space limit is left out: its shadow memory alone reserves terabytes of address space; and a failed
  // allocation must throw bad_alloc as without it, not end in ASan's report.)
  test::CmdResult run_limited(const std::string& args, const std::string& stdin_path = "/dev/null") {
    const std::string out = path("cmd.out"), err = path("cmd.err");
    std::string cmd;
#ifdef KILN_TEST_ASAN
    cmd += "export ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1\" && ";
#else
    cmd += "ulimit -v 8000000 && ";
#endif
    cmd += "exec timeout 60 '" + test::kiln_binary() + "' " + args + " >'" + out + "' 2>'" + err + "' <'" + stdin_path + "'";
    const int st = std::system(cmd.c_str());
    test::CmdResult r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = test::slurp(out);
    r.err = test::slurp(err);
    return r;
  }

  // A copy of the llama fixture with metadata edited (gguf::Writer).
  std::string variant(const std::string& name, const std::function<void(gguf::Writer&)>& edit) {
    static gguf::File src = gguf::File::open(kLlama).value();
    gguf::Writer w;
    for (const auto& kv : src.kvs()) w.set(kv.key, kv.value);
    edit(w);
    for (const auto& t : src.tensors())
      EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok());
    const std::string p = path(name + ".gguf");
    Status st = w.write(p);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return p;
  }

  std::string dir_;
};

// Exit status 1 and every part in stderr.
void expect_fails_with(const test::CmdResult& r, const std::vector<std::string>& parts) {
  EXPECT_EQ(r.rc, 1) << "stderr: " << r.err << "\nstdout: " << r.out.substr(0, 2000);
  for (const std::string& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << "'" << p << "' not in: " << r.err;
}

TEST_F(CliHostile, HugeBlockCountInASmallFile) {
  for (uint32_t n : {10'000'000u, 100'000'000u, 1'000'000'000u}) {
    SCOPED_TRACE(n);
    const std::string m = variant("blocks" + std::to_string(n), [n](gguf::Writer& w) { w.set("llama.block_count", n); });
    expect_fails_with(run_limited("run -m '" + m + "' -p hi -n 1"),
                      {"kiln run: error:", "llama.block_count is " + std::to_string(n), "only 2 block(s)", m});
  }
}

TEST_F(CliHostile, HugeCountsFromMetadata) {
  struct Case {
    const char* key;
    uint64_t value;
    const char* expect;
  } cases[] = {
      {"llama.attention.head_count", 1'000'000'000, "llama.attention.head_count is 1000000000"},
      {"llama.attention.head_count_kv", 1'000'000'000, "llama.attention.head_count_kv is 1000000000"},
      {"llama.vocab_size", 1'000'000'000, "llama.vocab_size is 1000000000"},
      {"llama.context_length", uint64_t{1} << 40, "llama.context_length is 1099511627776"},
      {"llama.feed_forward_length", 1'000'000'000, "llama.feed_forward_length is 1000000000"},
      {"llama.embedding_length", 1'000'000'000, "llama.embedding_length is 1000000000"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const std::string k = c.key;
    const uint64_t v = c.value;
    const std::string m = variant("count" + std::to_string(i++), [&](gguf::Writer& w) {
      if (v > UINT32_MAX)
        w.set(k, v);
      else
        w.set(k, static_cast<uint32_t>(v));
    });
    expect_fails_with(run_limited("run -m '" + m + "' -p hi -n 1"), {"kiln run: error:", c.expect});
  }
}

TEST_F(CliHostile, HugeContextEndsInAnErrorNotAnAbort) {
  // 10^11 and 10^12 tokens of context, on every command that takes -c: refused before anything is allocated for
  // them (the KV cache's slot ids are 32-bit), the message naming -c; 10^9 fits the ids but not the memory: the
  // model state's check of the storage against what the backend can allocate says how much it needs.
  const std::string out = path("l.bin");
  const std::string cmds[] = {"run -p hi -n 1", "chat", "perplexity -f '" + kLlama + "'",
                              "logits --tokens 1,2 --out '" + out + "'"};
  const std::string text = path("in.txt");
  { std::ofstream(text) << "hello\n"; }
  for (const std::string& c : cmds) {
    const std::string name = c.substr(0, c.find(' '));
    for (const char* n : {"100000000000", "1000000000000"}) {
      SCOPED_TRACE(c + " -c " + n);
      expect_fails_with(run_limited(c + " -m '" + kLlama + "' -c " + n, text),
                        {"kiln " + name + ": error:", "-c " + std::string(n) + ": the context is limited to"});
    }
    SCOPED_TRACE(c + " -c 1000000000");
    expect_fails_with(run_limited(c + " -m '" + kLlama + "' -c 1000000000", text),
                      {"kiln " + name + ": error:", "the KV cache needs", "GiB", "lower -c"});
  }
  // The embedded model too (no -m).
  expect_fails_with(run_limited("run -p hi -n 1 -c 1000000000000"), {"kiln run: error:", "-c 1000000000000"});
}

TEST_F(CliHostile, EndlessPromptInputIsBounded) {
  // /dev/zero as the prompt file, the --tokens file or chat's stdin: bounded reads, an error naming the input.
  const std::string m = "-m '" + kLlama + "' ";
  expect_fails_with(run_limited("run " + m + "-f /dev/zero"),
                    {"kiln run: error:", "-f '/dev/zero': more than", "raise -c"});
  expect_fails_with(run_limited("run " + m + "--tokens /dev/zero"),
                    {"kiln run: error:", "--tokens '/dev/zero': more than", "raise -c"});
  expect_fails_with(run_limited("perplexity " + m + "-f /dev/zero"),
                    {"kiln perplexity: error:", "-f '/dev/zero': more than 268435456 bytes"});
  expect_fails_with(run_limited("chat " + m + "-n 1", "/dev/zero"),
                    {"kiln chat: error:", "stdin: no end of line"});
}

TEST_F(CliHostile, HugeThreadCountsAreCappedOrSurvived) {
  // -t far above the cores is capped with a warning; under the memory limit the thread pool starts what it can.
  auto r = run_limited("run -m '" + kLlama + "' -p hi -n 2 -t 100000");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("kiln: -t 100000 is more than"), std::string::npos) << r.err;
  expect_fails_with(run_limited("run -m '" + kLlama + "' -p hi -n 2 -t -1"), {"-t: threads must be >= 0"});
}

TEST_F(CliHostile, SynthRefusesAFifoTarget) {
  const std::string fifo = path("out.gguf");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_fails_with(run_limited("synth --shape tiny -o '" + fifo + "'"),
                    {"kiln synth: error:", fifo, "is a FIFO, not a regular file"});
  struct stat sb {};
  ASSERT_EQ(::lstat(fifo.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISFIFO(sb.st_mode)) << "the FIFO was replaced";
}

TEST_F(CliHostile, SynthFollowsASymlinkAndKeepsAnUnrelatedTmpFile) {
  const std::string real = path("real.gguf"), link = path("link.gguf");
  ASSERT_EQ(::symlink("real.gguf", link.c_str()), 0);
  { std::ofstream(link + ".tmp") << "not kiln's"; }
  { std::ofstream(real + ".tmp") << "not kiln's either"; }
  auto r = run_limited("synth --shape tiny -o '" + link + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(link));
  auto f = gguf::File::open(real);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->get_str("general.architecture").value(), "llama");
  EXPECT_EQ(test::slurp(link + ".tmp"), "not kiln's");
  EXPECT_EQ(test::slurp(real + ".tmp"), "not kiln's either");
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir_)) n += e.path().filename().string().rfind("cmd.", 0) != 0;
  EXPECT_EQ(n, 4u) << "a temporary file was left behind";
}

TEST_F(CliHostile, SynthShapeLimits) {
  const std::string out = path("x.gguf");
  expect_fails_with(run_limited("synth --shape tiny --embd 1000000000 -o '" + out + "'"),
                    {"--embd 1000000000 is too large (at most 65536)"});
  expect_fails_with(run_limited("synth --shape tiny --layers 100000 -o '" + out + "'"),
                    {"--layers 100000 is too large (at most 1024)"});
  expect_fails_with(run_limited("synth --shape tiny --n-vocab 1000000000 -o '" + out + "'"),
                    {"--n-vocab 1000000000 is too large"});
  expect_fails_with(run_limited("synth --shape tiny --ff 0 -o '" + out + "'"), {"--ff 0 must be positive"});
  // Every option within its limit, the whole far beyond any disk: refused before writing, naming the sizes.
  expect_fails_with(run_limited("synth --shape tiny --layers 1024 --embd 65536 --ff 1048576 -o '" + out + "'"),
                    {"-o " + out + ": the model needs", "TiB", "free"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);  // cmd.out, cmd.err
  // Absurd thread counts are capped with a warning.
  auto r = run_limited("synth --shape tiny -t 100000 -o '" + out + "'");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning: -t 100000"), std::string::npos) << r.err;
  EXPECT_TRUE(gguf::File::open(out).is_ok());
  expect_fails_with(run_limited("synth --shape tiny -t -3 -o '" + out + "'"), {"-t -3 must be >= 0"});
}

TEST_F(CliHostile, InfoOnAFileTruncatedInsideItsTensorData) {
  const std::string full = test::slurp(kLlama);
  const std::string cut = path("cut.gguf");
  { std::ofstream(cut, std::ios::binary) << full.substr(0, full.size() / 2); }
  auto r = run_limited("info '" + cut + "'");
  expect_fails_with(r, {"kiln info: error:", cut, "lies outside the file", "at offset"});
  for (const char* s : {"damaged file", "arch:        llama", "block_count", "tokenizer.ggml.tokens",
                        "blk.1.ffn_down.weight", "tensors (22)"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "'" << s << "' not in stdout:\n" << r.out.substr(0, 3000);
  // JSON: still one valid object, with the error and complete = false.
  r = run_limited("info --json '" + cut + "'");
  EXPECT_EQ(r.rc, 1);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out.substr(0, 2000);
  EXPECT_EQ(j["complete"], false);
  EXPECT_NE(j["error"].get<std::string>().find("lies outside the file"), std::string::npos);
  EXPECT_EQ(j["metadata"]["llama.block_count"], 2);
  // A file cut inside its header gives the error only.
  { std::ofstream(cut, std::ios::binary) << full.substr(0, 6); }
  r = run_limited("info '" + cut + "'");
  expect_fails_with(r, {"kiln info: error:", "truncated"});
  EXPECT_EQ(r.out, "");
}

TEST_F(CliHostile, TokenizeReadsABoundedFile) {
  expect_fails_with(run_limited("tokenize -m '" + kLlama + "' -f /dev/zero"),
                    {"kiln tokenize: error:", "-f '/dev/zero': more than 256 MiB of text"});
  const std::string txt = path("t.txt");
  { std::ofstream(txt) << "hello world"; }
  auto r = run_limited("tokenize -m '" + kLlama + "' -f '" + txt + "' --ids");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("[", 0), 0u) << r.out;
}

TEST_F(CliHostile, EmptyMetadataKey) {
  // Header, one u32 kv with an empty key at offset 24.
  std::string b;
  auto put = [&b](auto x) { b.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  put(gguf::kMagic);
  put(uint32_t{3});
  put(uint64_t{0});
  put(uint64_t{1});
  put(uint64_t{0});  // key length 0
  put(uint32_t{4});
  put(uint32_t{7});
  const std::string p = path("emptykey.gguf");
  { std::ofstream(p, std::ios::binary) << b; }
  expect_fails_with(run_limited("info '" + p + "'"), {"kiln info: error:", "at offset 24", "empty metadata key"});
  expect_fails_with(run_limited("run -m '" + p + "' -p hi -n 1"), {"kiln run: error:", "empty metadata key"});
}

}  // namespace
}  // namespace kiln
