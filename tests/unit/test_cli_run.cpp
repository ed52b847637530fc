// kiln run / chat / perplexity as a user runs them: the binary, its stdout/stderr and exit code.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "cli/model_source.h"
#include "common/test_util.h"

namespace {

using kiln::Result;
using kiln::test::CmdResult;
CmdResult kiln(const std::string& args, const std::string& input = "") {
  return kiln::test::run_kiln(args, input);
}

std::string slurp_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::vector<int> parse_ids(const std::string& line) {
  std::vector<int> ids;
  std::string s;
  for (char c : line) {
    if (isdigit(static_cast<unsigned char>(c))) {
      s += c;
    } else if (!s.empty()) {
      ids.push_back(std::stoi(s));
      s.clear();
    }
  }
  if (!s.empty()) ids.push_back(std::stoi(s));
  return ids;
}

struct FixtureModel {
  std::string name, dir;
  int checked_steps;
};

std::vector<FixtureModel> models_in(const std::string& dir) {
  std::ifstream f(dir + "/manifest.json");
  if (!f) return {};
  auto j = nlohmann::json::parse(f);
  std::vector<FixtureModel> out;
  for (auto& [name, m] : j["models"].items())
    if (std::ifstream(dir + "/" + name + ".gguf")) out.push_back({name, dir, m["free_run_checked_steps"].get<int>()});
  return out;
}

std::string model_path(const FixtureModel& m) { return m.dir + "/" + m.name + ".gguf"; }
std::string prompt_ids() { return slurp_line(kiln::test::data_path("models/prompt.txt")); }
std::string first_model() { return model_path(models_in(kiln::test::data_path("models")).at(0)); }

// `kiln run --tokens <prompt> --temp 0 -n 32 --ids --ignore-eos` prints llama.cpp's greedy ids (the first
// free_run_checked_steps of them are decisive, fixtures README) at the default batch, -b 7 and -b 1.
void check_greedy(const FixtureModel& m, const std::string& threads) {
  SCOPED_TRACE(m.name);
  auto want = parse_ids(slurp_line(m.dir + "/" + m.name + ".greedy.txt"));
  ASSERT_EQ(want.size(), 32u);
  for (std::string b : {"", " -b 7", " -b 1"}) {
    SCOPED_TRACE("batch:" + b);
    CmdResult r = kiln("run -m '" + model_path(m) + "' --tokens " + prompt_ids() + " --temp 0 -n 32 --ids --ignore-eos -t " + threads + b);
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    ASSERT_EQ(r.out.front(), '[');
    auto got = parse_ids(r.out);
    ASSERT_EQ(got.size(), 32u) << r.out;
    for (int i = 0; i < m.checked_steps; ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
    EXPECT_NE(r.err.find("prompt 32 tokens"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("generated 32 tokens"), std::string::npos) << r.err;
  }
}

// Models with free_run_checked_steps 0 would check no id: they are left out and named; a set where no model is
// checkable skips with the reason instead of passing.
void check_greedy_all(const std::vector<FixtureModel>& ms, const std::string& threads) {
  int checked = 0;
  std::string unchecked;
  for (auto& m : ms) {
    if (m.checked_steps == 0) {
      unchecked += " " + m.name;
      continue;
    }
    check_greedy(m, threads);
    ++checked;
  }
  std::printf("[cli-greedy] %d models checked; not checkable (free_run_checked_steps 0):%s\n", checked,
              unchecked.empty() ? " none" : unchecked.c_str());
  if (checked == 0) GTEST_SKIP() << "skipped: no model here has free_run_checked_steps > 0 (" << unchecked << ")";
}

TEST(CliRun, GreedyIdsMatchLlamaCpp) {
  auto ms = models_in(kiln::test::data_path("models"));
  ASSERT_FALSE(ms.empty());
  check_greedy_all(ms, "2");
}

TEST(CliRun, GreedyIdsMatchLlamaCppFullMatrix) {
  KILN_REQUIRE_FIXTURES();
  auto ms = models_in(kiln::test::fixtures_dir() + "/models");
  ASSERT_GE(ms.size(), 20u);
  check_greedy_all(ms, "1");
}

TEST(CliRun, TokensFromAFileAndTextPrompt) {
  CmdResult a = kiln("run -t 1 -m '" + first_model() + "' --tokens '" + kiln::test::data_path("models/prompt.txt") +
               "' --temp 0 -n 4 --ids --ignore-eos");
  CmdResult b = kiln("run -t 1 -m '" + first_model() + "' --tokens " + prompt_ids() + " --temp 0 -n 4 --ids --ignore-eos");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  // A text prompt streams text (the fixture's vocabulary is byte-level: any bytes may come out) and a newline.
  CmdResult t = kiln("run -t 1 -m '" + first_model() + "' -p 'Hello world' -n 8 -s 3 --ignore-eos");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_FALSE(t.out.empty());
  EXPECT_EQ(t.out.back(), '\n');
  EXPECT_NE(t.err.find("generated 8 tokens"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("seed 3"), std::string::npos) << t.err;
  // Same seed, same text.
  CmdResult t2 = kiln("run -t 1 -m '" + first_model() + "' -p 'Hello world' -n 8 -s 3 --ignore-eos");
  EXPECT_EQ(t.out, t2.out);
}

TEST(CliRun, ContextFullIsAMessageNotACrash) {
  // -c 40 with 32 prompt tokens and -n -1: 9 tokens, then a clear stop (exit 0).
  CmdResult r = kiln("run -t 1 -m '" + first_model() + "' --tokens " + prompt_ids() + " --temp 0 -n -1 -c 40 --ids --ignore-eos");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out).size(), 9u) << r.out;
  EXPECT_NE(r.err.find("context full"), std::string::npos) << r.err;
  // A prompt longer than the context: error exit naming the context.
  CmdResult o = kiln("run -t 1 -m '" + first_model() + "' --tokens " + prompt_ids() + " -c 16 --ids");
  EXPECT_EQ(o.rc, 1);
  EXPECT_NE(o.err.find("context"), std::string::npos) << o.err;
  EXPECT_TRUE(o.out.empty());
}

TEST(CliRun, BadInputIsAnError) {
  const std::string m = "-m '" + first_model() + "' ";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {m + "--tokens 1,2,5000", "vocabulary"},
      {m + "--tokens 1,x,3", "element 1"},
      {m + "--tokens 1 -p hi", "only one"},
      {m + "-f /nonexistent/prompt.txt", "/nonexistent/prompt.txt"},
      {"-m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf"},
      {m + "--bogus", "unknown option"},
  };
  for (auto& c : cases) {
    CmdResult r = kiln("run -t 1 " + c.args);
    EXPECT_EQ(r.rc, 1) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find("kiln run: error"), std::string::npos) << r.err;
  }
}

// Issue 12: out-of-range flags are rejected consistently (--top-p 7 like --min-p 2), the error names the flag (not
// n_predict, top_p, n_batch, penalty_last_n), and it comes before the model loads: the model path here does not
// exist, so an error about the flag proves the check ran first. The same checks in run, chat, perplexity, logits
// and bench.
TEST(CliRun, FlagsAreCheckedBeforeTheModelLoadsAndNamed) {
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--temp nan", "--temp: must be a finite number"},
      {"--top-p 7", "--top-p: must be in [0, 1]"},
      {"--top-p -1", "--top-p: must be in [0, 1]"},
      {"--min-p 2", "--min-p: must be in [0, 1]"},
      {"--top-k -3", "--top-k: must be >= 0"},
      {"--repeat-penalty 0", "--repeat-penalty: must be a finite number > 0"},
      {"--repeat-last-n -2", "--repeat-last-n: must be >= -1"},
      {"-n -2", "-n: must be >= -1"},
      {"-b 0", "-b: must be in [1, 1048576]"},
      {"-b 2000000", "-b: must be in [1, 1048576]"},
      {"-s -2", "-s: '-2' is not a seed"},
      {"--kv-type q3", "--kv-type: 'q3' is not a KV cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)"},
      {"-ctk q4_k", "-ctk: 'q4_k' is not a KV cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)"},
      {"-ctv Q8_0", "-ctv: 'Q8_0' is not a KV cache type"},  // llama.cpp's names are lower case
      {"--kv-type q8_0 -ctv f16", "--kv-type q8_0 and -ctv f16 differ"},
      {"-fa maybe", "unexpected argument 'maybe'"},
      {"--device tpu", "--device: 'tpu'"},
      {"-ngl -5", "-ngl: must be >= 0"},
      {"-c 100000000000", "-c 100000000000: the context is limited"},
  };
  const char* internal[] = {"n_predict", "top_p", "min_p", "n_batch", "penalty_last_n", "repeat_penalty",
                            "max_new_tokens", "batch_tokens"};
  const std::string missing = "-m /nonexistent/model.gguf ";
  for (const char* cmd : {"run -p hi", "chat"}) {
    for (auto& c : cases) {
      SCOPED_TRACE(std::string(cmd) + " " + c.args);
      CmdResult r = kiln(std::string(cmd) + " " + missing + c.args, "hi\n");
      EXPECT_EQ(r.rc, 1);
      EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("/nonexistent/model.gguf"), std::string::npos) << "checked after loading: " << r.err;
      for (const char* f : internal) EXPECT_EQ(r.err.find(f), std::string::npos) << r.err;
    }
  }
  // The flags each of perplexity, logits and bench takes.
  const std::string out = " --out '" + ::kiln::test::temp_dir() + "kiln_flags.bin'";
  struct Other {
    std::string args, needle;
  } others[] = {
      {"perplexity -f " KILN_SOURCE_DIR "/README.md -b -1", "-b: must be in [1, 1048576]"},
      {"perplexity -f " KILN_SOURCE_DIR "/README.md -c 100000000000", "-c 100000000000: the context is limited"},
      {"perplexity -f " KILN_SOURCE_DIR "/README.md -ctk q8", "-ctk: 'q8' is not a KV cache type"},
      {"perplexity -f " KILN_SOURCE_DIR "/README.md --chunks -1", "--chunks: must be >= 0"},
      {"logits --tokens 1,2 -b 0" + out, "-b: must be in [1, 1048576]"},
      {"logits --tokens 1,2 -c 100000000000" + out, "-c 100000000000: the context is limited"},
      {"logits --tokens 1,2,3 -c 2" + out, "--tokens: 3 ids are more than -c 2 holds"},
      {"logits --tokens ''" + out, "--tokens: the list is empty"},
      {"logits --tokens 1 -ctk q3" + out, "-ctk: 'q3'"},
      {"bench -b 0", "-b: must be in [1, 1048576]"},
      {"bench -fa 2", "-fa: '2' is not 0, 1, on, off or auto"},
      {"bench -ctv q6_k", "-ctv: 'q6_k' is not a KV cache type"},
      {"bench --device tpu", "--device: 'tpu'"},
  };
  for (auto& c : others) {
    SCOPED_TRACE(c.args);
    CmdResult r = kiln(c.args + " " + missing);
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("/nonexistent/model.gguf"), std::string::npos) << "checked after loading: " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// -f and --tokens are bounded by the context; empty ones are errors naming the flag.
TEST(CliRun, PromptSourcesAreBoundedAndNotEmpty) {
  const std::string dir = ::kiln::test::temp_dir();
  const std::string empty = dir + "kiln_empty_prompt.txt", big = dir + "kiln_big_prompt.txt",
                    ids = dir + "kiln_many_ids.txt";
  { std::ofstream f(empty); }
  {
    std::ofstream f(big);
    for (int i = 0; i < 200; ++i) f << "The quick brown fox jumps over the lazy dog. ";
  }
  {
    std::ofstream f(ids);
    for (int i = 0; i < 500; ++i) f << (i ? "," : "") << (i % 900 + 1);
  }
  const std::string m = "run -t 1 -m '" + first_model() + "' ";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--tokens ''", "--tokens: the list is empty"},
      {"-f '" + empty + "'", "-f '" + empty + "': the file is empty"},
      {"-f /dev/zero -c 64", "-f '/dev/zero': more than 16384 bytes (more text than a context of 64 tokens"},
      {"--tokens /dev/zero -c 64", "--tokens '/dev/zero': more than"},
      {"-f '" + big + "' -c 16", "more text than a context of 16 tokens can hold"},  // bytes, before loading
      {"-f '" + big + "' -c 64", "-f: the prompt is"},                               // tokens, after it
      {"--tokens '" + ids + "' -c 100", "--tokens: 500 ids are more than the context of 100 tokens"},
      {"--tokens 1,2,3,4,5 -c 4", "--tokens: 5 ids are more than"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.args);
    CmdResult r = kiln(m + c.args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // A prompt that fits runs.
  CmdResult ok = kiln(m + "-f '" + big + "' -c 8192 -n 2 --ids");
  EXPECT_EQ(ok.rc, 0) << ok.err;
  std::remove(empty.c_str());
  std::remove(big.c_str());
  std::remove(ids.c_str());
}

// llama.cpp's flags that scripts pass: accepted, and where they change nothing on the CPU, said once.
TEST(CliRun, LlamaCppFlagsAreAccepted) {
  // --device cpu: the "-ngl has no effect" notice is the CPU's (a GPU machine would honour -ngl).
  const std::string m = "run -t 1 --device cpu -m '" + first_model() + "' --tokens " + prompt_ids() +
                        " --temp 0 -n 4 --ids --ignore-eos";
  CmdResult base = kiln(m);
  ASSERT_EQ(base.rc, 0) << base.err;
  // Cache types: the label of the timings' kv cache line.
  const std::map<std::string, std::string> cache_label = {
      {"-ctk f16 -ctv f16", "(f16,"},   {"-ctk q8_0 -ctv q8_0", "(q8_0,"},          {"--cache-type-k q8_0", "(k q8_0, v f16,"},
      {"-ctk q4_0 -ctv q4_0", "(q4_0,"}, {"-ctk bf16 -ctv iq4_nl", "(k bf16, v iq4_nl,"}, {"--kv-type q5_1", "(q5_1,"},
      {"-ctv q4_1 --cache-type-k f32", "(k f32, v q4_1,"}};
  std::vector<std::string> extras = {"-fa", "-fa on", "-fa off", "--flash-attn auto", "-ngl 99", "-ngl 0", "-s -1"};
  for (const auto& [flags, label] : cache_label) extras.push_back(flags);
  for (const std::string& extra : extras) {
    SCOPED_TRACE(extra);
    CmdResult r = kiln(m + " " + extra);
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto label = cache_label.find(extra);
    if (label == cache_label.end() || extra == "-ctk f16 -ctv f16") {
      EXPECT_EQ(r.out, base.out);  // greedy: the same ids
    }
    if (label != cache_label.end()) {
      EXPECT_NE(r.err.find("kv cache "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(label->second), std::string::npos) << r.err;  // the kv cache line of the timings
    }
    if (extra.rfind("-fa", 0) == 0 || extra.rfind("--flash", 0) == 0) {
      const auto first = r.err.find("has no effect: kiln's attention is always flash-style");
      EXPECT_NE(first, std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("has no effect", first + 1), std::string::npos) << "said more than once: " << r.err;
    }
    if (extra == "-ngl 99") {
      EXPECT_NE(r.err.find("-ngl 99 has no effect: the model runs on the CPU"), std::string::npos) << r.err;
    }
  }
  // -s -1: a random seed each run (printed), as llama.cpp.
  CmdResult a = kiln("run -t 1 -m '" + first_model() + "' -p hi -n 2 -s -1");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_NE(a.err.find("seed "), std::string::npos);
  // --kv-type sets K and V: a -ctk that says otherwise is refused, one that agrees is fine.
  CmdResult kv = kiln(m + " --kv-type q8_0 -ctk f16");
  EXPECT_EQ(kv.rc, 1);
  EXPECT_NE(kv.err.find("--kv-type q8_0 and -ctk f16 differ (--kv-type sets K and V alike)"), std::string::npos)
      << kv.err;
  EXPECT_EQ(kiln(m + " --kv-type q8_0 -ctk q8_0").rc, 0);
}

TEST(CliRun, ContextAboveTheTrainingContextWarnsOnce) {
  // The fixture's training context, from `kiln info --json`.
  CmdResult info = kiln("info --json '" + first_model() + "'");
  ASSERT_EQ(info.rc, 0);
  const int64_t train = nlohmann::json::parse(info.out)["metadata"]["llama.context_length"].get<int64_t>();
  CmdResult r = kiln("run -t 1 -m '" + first_model() + "' -p hi -n 1 -c " + std::to_string(train * 2));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string w = "-c " + std::to_string(train * 2) + " is more than the model's training context (" +
                         std::to_string(train) + " tokens)";
  const auto at = r.err.find(w);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("training context", at + w.size()), std::string::npos) << r.err;
  CmdResult quiet = kiln("run -t 1 -m '" + first_model() + "' -p hi -n 1 -c " + std::to_string(train));
  ASSERT_EQ(quiet.rc, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("training context"), std::string::npos) << quiet.err;
}

// A random-weight model whose vocabulary is mostly padding (control tokens that render as nothing) prints no
// text: run says so, with the count of generated tokens.
TEST(CliRun, WarnsWhenNothingPrintableCameOut) {
  const std::string pad = ::kiln::test::temp_dir() + "kiln_pad_model.gguf";
  CmdResult s = kiln("synth --shape tiny --vocab '" + first_model() + "' --n-vocab 65536 -o '" + pad + "'");
  ASSERT_EQ(s.rc, 0) << s.err;
  const std::string args = "run -t 1 -m '" + pad + "' -p hi -n 8 -s 1";
  CmdResult ids = kiln(args + " --ids");
  ASSERT_EQ(ids.rc, 0) << ids.err;
  CmdResult text = kiln(args);
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.err.find("generated 8 tokens"), std::string::npos) << text.err;
  bool visible = false;
  for (char c : text.out) visible = visible || (static_cast<unsigned char>(c) > ' ' && c != 0x7f);
  const bool warned = text.err.find("printed no visible text") != std::string::npos;
  EXPECT_EQ(warned, !visible) << "stdout: '" << text.out << "' ids: " << ids.out << "\n" << text.err;
  // The seed above samples padding only with the reference kernels' logits; wherever it does, the warning names
  // the count.
  if (warned) {
    EXPECT_NE(text.err.find("the 8 generated tokens printed no visible text"), std::string::npos);
  }
  // A model that prints text gets no warning; --ids output gets none either.
  CmdResult fine = kiln("run -t 1 -m '" + first_model() + "' -p hi -n 8 -s 1 --ignore-eos");
  EXPECT_EQ(fine.err.find("no visible text"), std::string::npos) << fine.err;
  EXPECT_EQ(ids.err.find("no visible text"), std::string::npos) << ids.err;
  std::remove(pad.c_str());
}

TEST(CliTokenize, DefaultsToTheEmbeddedModel) {
  CmdResult r = kiln("tokenize -p 'And God said' --ids");
  CmdResult l = kiln("logits --tokens 1,2,3 --out '" + ::kiln::test::temp_dir() + "kiln_embedded_logits.bin'");
  if (r.rc != 0) {  // a build without the embedded model says so
    EXPECT_NE(r.err.find("no model: pass -m FILE"), std::string::npos) << r.err;
    EXPECT_NE(l.err.find("no model: pass -m FILE"), std::string::npos) << l.err;
    return;
  }
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 3) << r.out;  // BOS + "And God said"
  EXPECT_EQ(l.rc, 0) << l.err;
  // The same ids as -m models/kiln-demo.gguf.
  CmdResult f = kiln("tokenize -m '" KILN_SOURCE_DIR "/models/kiln-demo.gguf' -p 'And God said' --ids");
  EXPECT_EQ(f.out, r.out);
}

// The notice a CUDA build on a GPU-less machine prints (load_model prints it once), over fake factories.
Result<std::vector<kiln::DeviceInfo>> no_devices() { return std::vector<kiln::DeviceInfo>{}; }
Result<std::vector<kiln::DeviceInfo>> one_gpu() { return std::vector<kiln::DeviceInfo>{{"cuda:0", "fake", 0, 0}}; }
Result<std::vector<kiln::DeviceInfo>> cpu_only() { return std::vector<kiln::DeviceInfo>{{"cpu", "fake", 0, 0}}; }
Result<std::vector<kiln::DeviceInfo>> driver_error() {
  return kiln::make_error(kiln::ErrorCode::kUnsupported, "no driver");
}
TEST(CliDevices, GpuFallbackNotice) {
  using kiln::BackendFactory;
  const BackendFactory cpu{"cpu", cpu_only, nullptr, nullptr, nullptr},
      cuda_none{"cuda", no_devices, nullptr, nullptr, nullptr}, cuda_one{"cuda", one_gpu, nullptr, nullptr, nullptr},
      cuda_err{"cuda", driver_error, nullptr, nullptr, nullptr};
  const std::string line = "kiln: no GPU found, running on the CPU";
  std::vector<const BackendFactory*> cpu_build{&cpu}, cuda_build_no_gpu{&cpu, &cuda_none},
      cuda_build_gpu{&cpu, &cuda_one}, cuda_build_no_driver{&cpu, &cuda_err};
  EXPECT_EQ(kiln::cli::gpu_fallback_notice(cpu_build, "auto"), "");
  EXPECT_EQ(kiln::cli::gpu_fallback_notice(cuda_build_no_gpu, "auto"), line);
  EXPECT_EQ(kiln::cli::gpu_fallback_notice(cuda_build_no_driver, "auto"), line);
  EXPECT_EQ(kiln::cli::gpu_fallback_notice(cuda_build_no_gpu, "cpu"), "");  // asked for the CPU: nothing to say
  EXPECT_EQ(kiln::cli::gpu_fallback_notice(cuda_build_gpu, "auto"), "");
  // This build: the CPU build never prints it.
  CmdResult r = kiln("run -t 1 -m '" + first_model() + "' -p hi -n 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  if (kiln::cli::gpu_fallback_notice(kiln::backend_factories(), "auto").empty())
    EXPECT_EQ(r.err.find("no GPU found"), std::string::npos) << r.err;
  else
    EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
}

TEST(CliRun, NoModelUsesTheEmbeddedOneOrSaysSo) {
  CmdResult r = kiln("run -t 1 -p hi -n 4");
  if (r.rc != 0) {
    EXPECT_NE(r.err.find("no model: pass -m FILE (this build has no embedded default model)"), std::string::npos) << r.err;
  } else {
    EXPECT_NE(r.err.find("generated"), std::string::npos) << r.err;
  }
}

TEST(CliRun, HelpOnEveryCommand) {
  for (const char* c : {"run", "chat", "bench", "perplexity"}) {
    CmdResult r = kiln(std::string(c) + " -h");
    EXPECT_EQ(r.rc, 0) << c;
    EXPECT_NE(r.out.find("usage: kiln " + std::string(c)), std::string::npos) << r.out;
  }
}

TEST(CliChat, PipedConversation) {
  // The fixture model has no chat template and no ChatML tokens: the plain-text conversation is announced.
  CmdResult r = kiln("chat -t 1 -m '" + first_model() + "' -n 6 --temp 0 -sys 'be brief'", "hello there\n\nhow are you\n/exit\nnot read\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("plain-text conversation"), std::string::npos) << r.err;
  // Two replies, each ended by a newline.
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 2);
  EXPECT_NE(r.err.find("generated"), std::string::npos) << r.err;
  // An explicit template is used without the notice; an unknown one is an error (before loading).
  CmdResult l = kiln("chat -t 1 -m '" + first_model() + "' -n 4 --temp 0 --chat-template llama3", "hi\n");
  ASSERT_EQ(l.rc, 0) << l.err;
  EXPECT_EQ(l.err.find("no chat template"), std::string::npos) << l.err;
  CmdResult bad = kiln("chat -t 1 -m '" + first_model() + "' --chat-template nonsense", "hi\n");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--chat-template"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("model:"), std::string::npos) << bad.err;
}

// The embedded demo model (no template, no ChatML tokens): a plain-text conversation whose replies are capped, so
// several turns fit its 512-token context; each reply stops at "\nUser:" or a blank line, never printing either.
TEST(CliChat, DemoModelConversesInPlainText) {
  std::string turns;
  for (int i = 0; i < 3; ++i) turns += "who is the lord\n";
  CmdResult r = kiln("chat -t 1 -s 7", turns);
  if (r.rc != 0 && r.err.find("no model: pass -m FILE") != std::string::npos) GTEST_SKIP() << "skipped: no embedded model";
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("plain-text conversation"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("context full"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("refused"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("User:"), std::string::npos) << r.out;
  // At most 128 tokens per reply (a quarter of the 512-token context): 3 replies, at most 384 tokens.
  auto pos = r.err.find("generated ");
  ASSERT_NE(pos, std::string::npos) << r.err;
  const int n_gen = std::stoi(r.err.substr(pos + 10));
  EXPECT_GT(n_gen, 0);
  EXPECT_LE(n_gen, 3 * 128);
  // --chat-template plain forces the mode; -n caps the reply.
  CmdResult n = kiln("chat -t 1 -s 7 -n 5 --chat-template plain", "hello\n");
  ASSERT_EQ(n.rc, 0) << n.err;
  EXPECT_NE(n.err.find("generated 5 tokens"), std::string::npos) << n.err;
}

TEST(CliChat, AMessageTooLongIsRefusedAndTheSessionGoesOn) {
  std::string long_msg;
  for (int i = 0; i < 40; ++i) long_msg += "this is a fairly long message to fill the context quickly ";
  // A message longer than the context, then one that fits: the first is refused, the second answered.
  CmdResult r = kiln("chat -t 1 -m '" + first_model() + "' -n 4 --temp 0 -c 64", long_msg + "\nhi\n");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("message refused"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the context holds 64"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated 4 tokens"), std::string::npos) << r.err;
  // Messages that fit one by one until the conversation is full: refused with /clear suggested; /clear starts over.
  std::string many;
  for (int i = 0; i < 12; ++i) many += "a short message\n";
  many += "/clear\nhi\n";
  CmdResult f = kiln("chat -t 1 -m '" + first_model() + "' -n 4 --temp 0 -c 64", many);
  EXPECT_EQ(f.rc, 0) << f.err;
  EXPECT_NE(f.err.find("/clear starts over"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("conversation cleared"), std::string::npos) << f.err;
  // A line longer than any context could take (bytes) is refused without tokenizing it.
  CmdResult b = kiln("chat -t 1 -m '" + first_model() + "' -n 2 --temp 0 -c 16", std::string(5000, 'x') + "\nhi\n");
  EXPECT_EQ(b.rc, 0) << b.err;
  EXPECT_NE(b.err.find("message refused: more than 4096 bytes"), std::string::npos) << b.err;
}

// Ctrl-C (SIGINT) during a reply ends the reply, not chat: the next message is answered; two at the prompt quit.
TEST(CliChat, InterruptEndsTheReplyNotTheSession) {
  signal(SIGPIPE, SIG_IGN);  // a chat that died early fails the test, not the test binary
  int in[2], out[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(out), 0);
  const std::string err_path = ::kiln::test::temp_dir() + "kiln_chat_sigint_" + std::to_string(getpid()) + ".err";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    FILE* e = std::freopen(err_path.c_str(), "w", stderr);
    (void)e;
    close(in[1]);
    close(out[0]);
    const std::string bin = kiln::test::kiln_binary(), model = first_model();
    // A reply that runs until the context is full (thousands of tokens): the interrupt lands inside it. ChatML:
    // no stop strings (the plain-text conversation this model would get ends a reply at its first blank line).
    execl(bin.c_str(), bin.c_str(), "chat", "-t", "1", "-m", model.c_str(), "-c", "2048", "-n", "-1", "--ignore-eos",
          "--temp", "0", "--chat-template", "chatml", (char*)nullptr);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  auto send = [&](const std::string& s) { ASSERT_EQ(write(in[1], s.data(), s.size()), (ssize_t)s.size()); };
  send("hello\n");
  char buf[4096];
  ASSERT_GT(read(out[0], buf, sizeof buf), 0);  // the reply has started
  kill(pid, SIGINT);
  send("again\n");
  close(in[1]);
  std::string rest;
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) rest.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  const std::string err = kiln::test::slurp(err_path);
  ASSERT_TRUE(WIFEXITED(st)) << "chat was killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0) << "\n" << err;
  EXPECT_EQ(WEXITSTATUS(st), 0) << err;
  EXPECT_NE(err.find("reply interrupted"), std::string::npos) << err;
  EXPECT_NE(err.find("kiln chat: prompt"), std::string::npos) << err;  // the stats: chat ended normally
  std::remove(err_path.c_str());
}

// On a terminal: Ctrl-D at the prompt puts the stats on a line of their own (not after "> "); Ctrl-C twice at the
// prompt quits (the first says how). Through a pseudo-terminal, as a user types.
std::string pty_chat(const std::vector<std::string>& keys, int* rc) {
  int master = -1;
  const std::string bin = kiln::test::kiln_binary(), model = first_model();
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) return "forkpty failed";
  if (pid == 0) {
    // NOFLSH: Ctrl-C must not flush output chat writes right after it (the line discipline flushes after
    // signalling, racing with the child's stats line).
    struct termios tio {};
    if (tcgetattr(0, &tio) == 0) {
      tio.c_lflag |= NOFLSH;
      tcsetattr(0, TCSANOW, &tio);
    }
    execl(bin.c_str(), bin.c_str(), "chat", "-t", "1", "-m", model.c_str(), "-n", "2", (char*)nullptr);
    _exit(127);
  }
  std::string seen;
  char buf[4096];
  // Before each key, the next "> " prompt (chat prints one per line it waits for, also after a Ctrl-C).
  auto prompts = [&] {
    size_t count = 0;
    for (size_t p = seen.find("> "); p != std::string::npos; p = seen.find("> ", p + 1)) ++count;
    return count;
  };
  size_t want = 0;
  for (const std::string& k : keys) {
    ++want;
    while (prompts() < want) {
      const ssize_t n = read(master, buf, sizeof buf);
      if (n <= 0) break;
      seen.append(buf, static_cast<size_t>(n));
    }
    if (write(master, k.data(), k.size()) != static_cast<ssize_t>(k.size())) break;
  }
  for (ssize_t n; (n = read(master, buf, sizeof buf)) > 0;) seen.append(buf, static_cast<size_t>(n));
  close(master);
  int st = 0;
  waitpid(pid, &st, 0);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return seen;
}

TEST(CliChat, TerminalCtrlDAndCtrlC) {
  int rc = -1;
  std::string out = pty_chat({"hi\r", "\x04"}, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("kiln chat: prompt"), std::string::npos) << out;
  EXPECT_EQ(out.find("> kiln chat: prompt"), std::string::npos) << "stats on the prompt line: " << out;
  out = pty_chat({"\x03", "\x03"}, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Ctrl-C again"), std::string::npos) << out;
  EXPECT_NE(out.find("kiln chat: prompt"), std::string::npos) << out;
}

TEST(CliPerplexity, ScoresWindows) {
  const std::string text_path = ::kiln::test::temp_dir() + "kiln_ppl_text.txt";
  {
    std::ofstream f(text_path);
    for (int i = 0; i < 40; ++i) f << "The quick brown fox jumps over the lazy dog, sentence number " << i << ". ";
  }
  CmdResult r = kiln("perplexity -t 1 -m '" + first_model() + "' -f '" + text_path + "' -c 64 -b 16");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto pos = r.out.find("Final estimate: PPL = ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const double ppl = std::stod(r.out.substr(pos + 22));
  EXPECT_GT(ppl, 1.0);
  // Window 1's PPL is exp(mean NLL) over positions 32..62 of the first 64 tokens (BOS first) predicting the next
  // token: recomputed here from `kiln tokenize` ids and `kiln logits --all` (an independent path through the
  // engine), in double. The printed value has 4 decimals at ~7e4: relative 1e-6 covers the rounding, while a
  // wrong half, an off-by-one target or a missing BOS changes it by orders of magnitude more.
  const auto wpos = r.out.find("[1] window ppl ");
  ASSERT_NE(wpos, std::string::npos) << r.out;
  const double window_ppl = std::stod(r.out.substr(wpos + 15));
  CmdResult tk = kiln("tokenize -m '" + first_model() + "' -f '" + text_path + "' --ids");
  ASSERT_EQ(tk.rc, 0) << tk.err;
  auto ids = parse_ids(tk.out);
  ASSERT_GE(ids.size(), 64u);
  ids.resize(64);
  std::string list;
  for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
  const std::string lpath = ::kiln::test::temp_dir() + "kiln_ppl_logits.bin";
  CmdResult lg = kiln("logits -t 1 -m '" + first_model() + "' --tokens " + list + " --all --out '" + lpath + "'");
  ASSERT_EQ(lg.rc, 0) << lg.err;
  const auto bytes = kiln::test::read_file(lpath);
  const size_t nv = bytes.size() / sizeof(float) / 64;
  ASSERT_EQ(nv * 64 * sizeof(float), bytes.size());
  std::vector<float> logits(bytes.size() / sizeof(float));
  std::memcpy(logits.data(), bytes.data(), bytes.size());
  double sum = 0;
  for (int pos = 32; pos <= 62; ++pos) {
    const float* row = logits.data() + pos * nv;
    double mx = row[0];
    for (size_t i = 1; i < nv; ++i) mx = std::max(mx, static_cast<double>(row[i]));
    double z = 0;
    for (size_t i = 0; i < nv; ++i) z += std::exp(row[i] - mx);
    sum += std::log(z) - (row[ids[pos + 1]] - mx);
  }
  EXPECT_NEAR(window_ppl, std::exp(sum / 31), window_ppl * 1e-6);
  std::remove(lpath.c_str());
  // The window split does not depend on -b.
  CmdResult r2 = kiln("perplexity -t 1 -m '" + first_model() + "' -f '" + text_path + "' -c 64");
  ASSERT_EQ(r2.rc, 0) << r2.err;
  EXPECT_NEAR(std::stod(r2.out.substr(r2.out.find("Final estimate: PPL = ") + 22)), ppl, ppl * 1e-3);
  CmdResult tiny = kiln("perplexity -t 1 -m '" + first_model() + "' -f '" + text_path + "' -c 100000");
  EXPECT_EQ(tiny.rc, 1);
  std::remove(text_path.c_str());
}

// Against llama-perplexity 0.5.0 (the fixtures' llama.cpp) on the same text and window: `llama-perplexity -m X
// -f T -c 128 -b 128 -t 1` printed the reference values below for the text this test writes. Observed agreement:
// 4e-5 (F16) and 7e-4 (Q4_0) relative. Tolerances: 1e-3 and 1e-2 relative, i.e. a mean-NLL difference of 1e-3 /
// 1e-2 nats, which the logits parity limits (NMSE 1e-4 / 3.7e-3 per row) allow; scoring the wrong half, an
// off-by-one target or a missing BOS moves these random-weight models' PPL by far more than that.
TEST(CliPerplexity, MatchesLlamaCpp) {
  static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then",
                                "runs", "into", "forest", "where", "many", "trees", "grow", "tall", "under",
                                "bright", "sun"};
  const std::string text_path = ::kiln::test::temp_dir() + "kiln_ppl_ref.txt";
  {
    std::ofstream f(text_path);
    uint64_t x = 12345;
    for (int i = 0; i < 2000; ++i) {
      x = (x * 1103515245 + 12345) % (1ull << 31);
      f << (i ? " " : "") << words[(x >> 16) % 21];
    }
    f << "\n";
  }
  struct Ref {
    const char* model;
    double ppl, rel_tol;
  } refs[] = {{"fixture-llama-f16.gguf", 53526.3560, 1e-3}, {"fixture-qwen3-q4_0.gguf", 1400338888.7923, 1e-2}};
  for (auto& ref : refs) {
    for (const char* b : {"", " -b 7"}) {
      CmdResult r = kiln("perplexity -m '" + kiln::test::data_path(std::string("models/") + ref.model) + "' -f '" +
                         text_path + "' -c 128 -t 1" + b);
      ASSERT_EQ(r.rc, 0) << r.err;
      auto pos = r.out.find("Final estimate: PPL = ");
      ASSERT_NE(pos, std::string::npos) << r.out;
      EXPECT_NEAR(std::stod(r.out.substr(pos + 22)), ref.ppl, ref.ppl * ref.rel_tol) << ref.model << b;
    }
  }
  std::remove(text_path.c_str());
}

// Speculative decoding's flags (runtime/engine_config.h SpecConfig): prompt lookup prints the same greedy text;
// an unknown type is refused naming --spec-type.
TEST(CliRun, SpeculativeDecodingFlags) {
  const std::string demo = std::string(KILN_SOURCE_DIR) + "/models/kiln-demo.gguf";
  const std::string base = "run -m '" + demo + "' -p 'And God said, Let there be light: and there was light. And God "
                           "said, Let there be' -n 24 --temp 0";
  const CmdResult a = kiln(base);
  const CmdResult b = kiln(base + " --spec-type ngram-simple --spec-ngram-simple-size-n 3");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(b.out, a.out);
  const CmdResult c = kiln("run -m '" + demo + "' -p hi -n 2 --spec-type eagle");
  EXPECT_NE(c.rc, 0);
  EXPECT_NE(c.err.find("--spec-type"), std::string::npos) << c.err;
}

// A draft model (-md; draft-simple is then the type): the same ids as without, the acceptance on stderr; -ngld and
// -devd take llama.cpp's values; a wrong file, a missing -md and a wrong type are refused naming the flag; -ctkd and
// -ctvd set the draft's cache types and are refused without -md (run, chat, serve).
TEST(CliRun, DraftModelFlags) {
  const std::string m = kiln::test::data_path("models/fixture-llama-f16.gguf");
  const std::string d = kiln::test::data_path("models/fixture-llama-q4_k_m.gguf");
  const std::string base = "run -m '" + m + "' --tokens '" + kiln::test::data_path("models/prompt.txt") +
                           "' -n 24 --temp 0 --ids";
  const CmdResult a = kiln(base);
  const CmdResult b = kiln(base + " -md '" + d + "' -ngld all -devd cpu --spec-draft-n-max 4");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(b.out, a.out);
  EXPECT_NE(b.err.find("kiln run: speculative: "), std::string::npos) << b.err;
  EXPECT_EQ(a.err.find("speculative:"), std::string::npos);
  const CmdResult c = kiln(base + " -md /nonexistent.gguf");
  EXPECT_NE(c.rc, 0);
  EXPECT_NE(c.err.find("-md"), std::string::npos) << c.err;
  const CmdResult e = kiln(base + " --spec-type draft-simple");
  EXPECT_NE(e.rc, 0);
  EXPECT_NE(e.err.find("needs a draft model (-md FILE)"), std::string::npos) << e.err;
  const CmdResult f = kiln(base + " -md '" + d + "' --spec-type ngram-simple");
  EXPECT_NE(f.rc, 0);
  EXPECT_NE(f.err.find("-md: a draft model is used by --spec-type draft-simple"), std::string::npos) << f.err;
  const CmdResult g = kiln(base + " -md '" + d + "' -ngld many");
  EXPECT_NE(g.rc, 0);
  EXPECT_NE(g.err.find("-ngld"), std::string::npos) << g.err;
  const CmdResult h = kiln("run -m '" + m + "' -p hi -n 2 -md '" + std::string(KILN_SOURCE_DIR) +
                           "/models/kiln-demo.gguf'");
  EXPECT_NE(h.rc, 0);
  EXPECT_NE(h.err.find("-md: "), std::string::npos) << h.err;
  // -ctkd / -ctvd: the draft's cache types (the same ids), llama.cpp's names and the -ctk error style; only with -md.
  const CmdResult i = kiln(base + " -md '" + d + "' -ctkd q8_0 --cache-type-v-draft q4_0");
  ASSERT_EQ(i.rc, 0) << i.err;
  EXPECT_EQ(i.out, a.out);
  const CmdResult j = kiln(base + " -md '" + d + "' -ctkd q4_k");
  EXPECT_NE(j.rc, 0);
  EXPECT_NE(j.err.find("-ctkd: 'q4_k' is not a KV cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)"),
            std::string::npos) << j.err;
  for (const char* cmd : {"run", "chat", "serve"}) {
    const CmdResult k = kiln(std::string(cmd) + " -m '" + m + "' -ctvd q8_0");
    EXPECT_NE(k.rc, 0) << cmd;
    EXPECT_NE(k.err.find("-ctvd: the draft model's KV cache type needs a draft model (-md FILE)"), std::string::npos)
        << cmd << ": " << k.err;
  }
}

}  // namespace
