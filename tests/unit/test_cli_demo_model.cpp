// The embedded demo model (models/kiln-demo.gguf, Q8_0; tools/train_demo, models/README.md) through the kiln
// binary, on the CPU:
//   * `kiln run` without -m greedily continues "And God said" the same way on every run, equal to
//     tests/data/demo/greedy.txt (kiln's own output when the model was committed), and the text it prints is the
//     decoding of those ids;
//   * the greedy ids agree with PyTorch's (train.py) for every step PyTorch decided by a clear margin;
//   * `kiln logits` over a fixed 32-id sequence matches PyTorch's f32 logits of the trained model
//     (reference_logits.f32) within the Q8_0 error bound argued below, at batch sizes 512, 7 and 1, and matches
//     kiln's own logits stored at commit time (kiln_logits.f32) as a regression reference.
// -t 1: one thread keeps the runs quick on a loaded machine (spinning workers suffer when cores are shared).
// The CUDA check waits for the CUDA backend (a later issue).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModel = KILN_SOURCE_DIR "/models/kiln-demo.gguf";
constexpr int kVocab = 4096;
constexpr int kPromptTokens = 4;  // BOS + "And God said"
constexpr int kGreedySteps = 48;

// Error bounds, NMSE per row = sum((kiln - ref)^2) / sum(ref^2).
//
// Against PyTorch's f32 model. train.py measured what rounding the weights to Q8_0 alone does to these 32 rows
// (reference.json, nmse_q8_vs_f32): max 3.3e-5, mean 1.0e-5. kiln's Q8_0 matmul also rounds each activation row
// to Q8_0 blocks before the integer dot product (llama.cpp's scheme): an error of the same form and size on the
// other operand, independent of the first, so about twice that is expected (kiln measured 7.3e-5 max, 2.8e-5
// mean when the model was committed; the f16 KV cache adds ~1e-7, which the F16 export showed: 1.1e-7 max against
// PyTorch). The bounds leave 4x over that expectation and stay two orders below the 1e-2..1 that a wrong layout
// (RoPE pairing, GQA head mapping, transposed weight, block scale) produces.
constexpr double kVsTorchMax = 3e-4;
constexpr double kVsTorchMean = 1e-4;
// Against kiln's own stored logits: the same weights and the same quantization scheme, so only the summation
// order may differ between machines (SIMD width, thread split): f32 rounding of ~1e-7 relative per op, and an
// activation that lands on a Q8_0 rounding boundary moving one quantization step -- both far below the 3e-5
// quantization error itself, which any real numerics change would show up at.
constexpr double kVsKilnMax = 1e-5;
// Rows (and greedy steps) whose reference top-1 minus top-2 logit is at most this decide nothing: the
// quantization error above moves logits by a few hundredths (fixtures README uses the same 0.25).
constexpr float kDecisiveMargin = 0.25f;

using kiln::test::CmdResult;
using kiln::test::slurp;
CmdResult kiln(const std::string& args) { return kiln::test::run_kiln(args); }

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cur;
  for (char c : s + " ") {
    if (c >= '0' && c <= '9') {
      cur += c;
    } else if (!cur.empty()) {
      ids.push_back(static_cast<int32_t>(std::stol(cur)));
      cur.clear();
    }
  }
  return ids;
}

std::vector<float> read_f32(const std::string& path) {
  const std::vector<uint8_t> b = kiln::test::read_file(path);
  std::vector<float> v(b.size() / sizeof(float));
  std::copy(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(v.size() * sizeof(float)),
            reinterpret_cast<uint8_t*>(v.data()));
  return v;
}

std::vector<int32_t> reference_ids() { return parse_ids(slurp(kiln::test::data_path("demo/reference_ids.txt"))); }

std::string join(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

int argmax(const float* row) { return static_cast<int>(std::max_element(row, row + kVocab) - row); }
float margin(const float* row) {
  std::vector<float> r(row, row + kVocab);
  std::partial_sort(r.begin(), r.begin() + 2, r.end(), std::greater<float>());
  return r[0] - r[1];
}

const char* kGreedyArgs = "run -p 'And God said' -n 48 --temp 0 --ids -t 1";

TEST(CliDemoModel, EmbeddedGreedyIsDeterministicAndMatchesReference) {
  const std::vector<int32_t> want = parse_ids(slurp(kiln::test::data_path("demo/greedy.txt")));
  ASSERT_EQ(want.size(), static_cast<size_t>(kGreedySteps));
  for (int run = 0; run < 2; ++run) {
    const CmdResult r = kiln(kGreedyArgs);  // no -m: the model embedded in the binary
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(parse_ids(r.out), want) << "run " << run << ": " << r.out;
  }
  // The file in the source tree is the same model.
  const CmdResult r = kiln(std::string(kGreedyArgs) + " -m '" + kModel + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out), want);
}

TEST(CliDemoModel, GreedyTextIsTheDecodedIds) {
  auto file = kiln::gguf::File::open(kModel);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto tok = kiln::Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::vector<int32_t> ids = parse_ids(slurp(kiln::test::data_path("demo/greedy.txt")));
  // greedy.txt is the CPU backend's own output (a GPU picks its own summation order: see the logits test below).
  const CmdResult r = kiln("run -p 'And God said' -n 48 --temp 0 -t 1 --device cpu");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string text = (*tok)->decode(ids);
  EXPECT_EQ(r.out.substr(0, text.size()), text);  // the CLI may end its output with a newline
  EXPECT_EQ(text.rfind(" unto", 0), 0u) << text;    // "And God said unto ...": KJV, not noise
}

TEST(CliDemoModel, GreedyAgreesWithPyTorchWhileDecisive) {
  // reference_ids = BOS + "And God said" + PyTorch's greedy continuation (Q8_0-rounded weights, f32 compute).
  const std::vector<int32_t> ref = reference_ids();
  const std::vector<float> logits = read_f32(kiln::test::data_path("demo/reference_logits.f32"));
  ASSERT_EQ(ref.size() * kVocab, logits.size());
  const std::vector<int32_t> got = parse_ids(slurp(kiln::test::data_path("demo/greedy.txt")));
  ASSERT_EQ(std::vector<int32_t>(ref.begin(), ref.begin() + kPromptTokens),
            (std::vector<int32_t>{4095, 295, 386, 387}));
  int checked = 0;
  for (size_t s = 0; kPromptTokens + s < ref.size(); ++s) {
    const float* row = &logits[(kPromptTokens - 1 + s) * kVocab];
    if (margin(row) <= kDecisiveMargin) break;  // from here on two correct engines may diverge
    ASSERT_EQ(argmax(row), ref[kPromptTokens + s]) << "reference data inconsistent at step " << s;
    EXPECT_EQ(got.at(s), ref[kPromptTokens + s]) << "greedy step " << s;
    ++checked;
  }
  EXPECT_GE(checked, 5);  // the committed model's first 7 steps are decisive
}

TEST(CliDemoModel, LogitsMatchPyTorchAndKilnReferences) {
  const std::vector<int32_t> ids = reference_ids();
  const size_t n = ids.size();
  ASSERT_EQ(n, 32u);
  const std::vector<float> torch_ref = read_f32(kiln::test::data_path("demo/reference_logits.f32"));
  const std::vector<float> kiln_ref = read_f32(kiln::test::data_path("demo/kiln_logits.f32"));
  ASSERT_EQ(torch_ref.size(), n * kVocab);
  ASSERT_EQ(kiln_ref.size(), n * kVocab);
  const std::string out = ::kiln::test::temp_dir() + "kiln_demo_logits_" + std::to_string(getpid()) + ".f32";
  for (int batch : {512, 7, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const CmdResult r = kiln("logits -m '" + kModel + "' --tokens " + join(ids, ",") + " --all -t 1 -b " +
                             std::to_string(batch) + " -o '" + out + "'");
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::vector<float> got = read_f32(out);
    std::remove(out.c_str());
    ASSERT_EQ(got.size(), n * kVocab);
    double max_t = 0, sum_t = 0, max_k = 0;
    for (size_t i = 0; i < n; ++i) {
      const float* g = &got[i * kVocab];
      const float* t = &torch_ref[i * kVocab];
      const double e_t = kiln::test::nmse(g, t, kVocab);
      const double e_k = kiln::test::nmse(g, &kiln_ref[i * kVocab], kVocab);
      EXPECT_LE(e_t, kVsTorchMax) << "row " << i << " vs PyTorch";
      EXPECT_LE(e_k, kVsKilnMax) << "row " << i << " vs kiln's stored logits";
      if (margin(t) > kDecisiveMargin) {
        EXPECT_EQ(argmax(g), argmax(t)) << "row " << i;
      }
      max_t = std::max(max_t, e_t);
      sum_t += e_t;
      max_k = std::max(max_k, e_k);
    }
    EXPECT_LE(sum_t / n, kVsTorchMean);
    std::printf("batch %d: NMSE vs PyTorch f32 max %.3e mean %.3e; vs kiln reference max %.3e\n", batch, max_t,
                sum_t / n, max_k);
  }
}

}  // namespace

// scripts/demo.sh (the README's first command) builds only what it runs (target kiln_cli, not the 20-odd test
// binaries) and shows progress from the start: run in a copy of scripts/ with cmake replaced by a stub that
// records its arguments and prints a ninja-style status line, and a stub kiln.
TEST(CliDemoScript, BuildsOnlyKilnCliAndShowsProgress) {
  namespace fs = std::filesystem;
  const std::string root = ::kiln::test::temp_dir() + "kiln_demo_script_" + std::to_string(::getpid());
  fs::remove_all(root);
  fs::create_directories(root + "/scripts");
  fs::create_directories(root + "/stub");
  for (const char* s : {"demo.sh", "build.sh"})
    fs::copy_file(std::string(KILN_SOURCE_DIR) + "/scripts/" + s, root + "/scripts/" + s);
  std::ofstream(root + "/scripts/deps.sh") << "exit 0\n";  // no package installs here
  std::ofstream(root + "/stub/cmake")
      << "#!/bin/sh\n"
         "echo \"$*\" >> \"" << root << "/cmake.log\"\n"
         "if [ \"$1\" = --preset ]; then mkdir -p build/release && touch build/release/build.ninja; fi\n"
         "if [ \"$1\" = --build ]; then\n"
         "  echo '[1/1] Linking CXX executable bin/kiln'\n"
         "  mkdir -p build/release/bin\n"
         "  printf '#!/bin/sh\\necho \"kiln-stub $*\"\\n' > build/release/bin/kiln && chmod +x build/release/bin/kiln\n"
         "fi\n";
  fs::permissions(root + "/stub/cmake", fs::perms::owner_all);
  const std::string env = "PATH='" + root + "/stub':\"$PATH\" ";
  auto run = [&](const std::string& cmd) {
    const std::string c = env + cmd + " >'" + root + "/out' 2>'" + root + "/err'";
    const int st = std::system(c.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };

  ASSERT_EQ(run("bash '" + root + "/scripts/demo.sh' Hello 5"), 0) << kiln::test::slurp(root + "/err");
  const std::string log = kiln::test::slurp(root + "/cmake.log"), err = kiln::test::slurp(root + "/err");
  EXPECT_NE(log.find("--preset release"), std::string::npos) << log;
  EXPECT_NE(log.find("--build build/release -j"), std::string::npos) << log;
  EXPECT_NE(log.find("--target kiln_cli"), std::string::npos) << "the demo must build only kiln_cli:\n" << log;
  // Progress on stderr: a line per step with the seconds elapsed, then the build's own status lines.
  EXPECT_NE(err.find("kiln build [0s]: checking the Debian packages"), std::string::npos) << err;
  EXPECT_NE(err.find("configuring build/release"), std::string::npos) << err;
  EXPECT_NE(err.find("building kiln_cli"), std::string::npos) << err;
  EXPECT_NE(err.find("[1/1] Linking CXX executable bin/kiln"), std::string::npos) << err;
  EXPECT_LT(err.find("checking the Debian packages"), err.find("[1/1]")) << err;
  // stdout holds only what kiln printed.
  EXPECT_EQ(kiln::test::slurp(root + "/out"), "kiln-stub run -p Hello -n 5 --temp 0.7 -s 42\n");

  // scripts/build.sh without arguments (what scripts/test.sh runs) still builds everything; configured once.
  fs::remove(root + "/cmake.log");
  ASSERT_EQ(run("bash '" + root + "/scripts/build.sh'"), 0) << kiln::test::slurp(root + "/err");
  const std::string all = kiln::test::slurp(root + "/cmake.log");
  EXPECT_EQ(all.find("--preset"), std::string::npos) << all;
  EXPECT_NE(all.find("--build build/release -j"), std::string::npos) << all;
  EXPECT_EQ(all.find("--target"), std::string::npos) << all;
  EXPECT_NE(kiln::test::slurp(root + "/err").find("building everything"), std::string::npos);
  fs::remove_all(root);
}
