// --split-mode / --tensor-split / --main-gpu on the commands that load models (cli/model_source.h), as a user runs
// them on a CPU-only machine: tensor parallel over CPU ranks (--device cpu,cpu) and the layer split over two CPU
// backend instances give the one-device ids and logits; bad values fail with exit code 1 and a message naming the
// flag (the model layer's numerics are tested in test_model_tensor_parallel.cpp). The expert flags (--cpu-moe,
// --n-cpu-moe, -ot) likewise: their errors name the flag, before the model loads where the value alone is wrong, at
// load naming the tensor where a pattern matches a non-expert one; on the CPU they change nothing and say so (the
// experts-on-the-CPU numerics are in test_model_parity.cpp and test_model_moe.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/test_util.h"

namespace {

using kiln::test::CmdResult;

std::string model(const char* stem) { return kiln::test::data_path(std::string("models/") + stem + ".gguf"); }

const char* const kRun = " --tokens 997,331,970,154,404,666 -n 12 --ids --temp 0 --ignore-eos";

TEST(CliSplitMode, TensorAndLayerSplitGiveTheOneDeviceIds) {
  for (const char* stem : {"fixture-llama-q8_0", "fixture-qwen3-q4_0", "fixture-llama-f16"}) {
    const std::string m = " -m " + model(stem);
    const CmdResult one = kiln::test::run_kiln("run" + m + kRun);
    ASSERT_EQ(one.rc, 0) << one.err;
    for (const char* split : {"--split-mode tensor --device cpu,cpu", "-sm tensor --device cpu,cpu,cpu,cpu -t 1",
                              "--split-mode layer --device cpu,cpu", "--split-mode layer --device cpu,cpu -ts 1,3"}) {
      const CmdResult r = kiln::test::run_kiln("run" + m + kRun + " " + split);
      ASSERT_EQ(r.rc, 0) << stem << " " << split << ": " << r.err;
      EXPECT_EQ(r.out, one.out) << stem << " " << split;
    }
  }
}

TEST(CliSplitMode, TensorParallelLogitsEqualOneDevice) {
  const std::string dir = ::kiln::test::temp_dir();
  const std::string m = " -m " + model("fixture-llama-q8_0") + " --tokens 997,331,970,154 --all";
  const CmdResult a = kiln::test::run_kiln("logits" + m + " --out " + dir + "tp_one.bin");
  ASSERT_EQ(a.rc, 0) << a.err;
  const CmdResult b = kiln::test::run_kiln("logits" + m + " --out " + dir + "tp_two.bin --split-mode tensor --device cpu,cpu");
  ASSERT_EQ(b.rc, 0) << b.err;
  // llama q8_0: the column-split sums happen to round exactly as one rank's (test_model_tensor_parallel: NMSE 0).
  EXPECT_EQ(kiln::test::read_file(dir + "tp_one.bin"), kiln::test::read_file(dir + "tp_two.bin"));
  std::remove((dir + "tp_one.bin").c_str());
  std::remove((dir + "tp_two.bin").c_str());
}

TEST(CliSplitMode, BadValuesNameTheFlag) {
  const std::string m = " -m " + model("fixture-llama-q8_0") + kRun;
  struct Case {
    const char* args;
    const char* want;
  } cases[] = {
      {"--split-mode rows", "--split-mode: 'rows' is not none, layer or tensor"},
      {"--split-mode", "--split-mode"},
      {"--tensor-split 1,x --split-mode layer --device cpu,cpu", "--tensor-split: '1,x' is not a list of proportions"},
      {"--tensor-split 0,0 --split-mode layer --device cpu,cpu", "--tensor-split: '0,0' has no share > 0"},
      {"--tensor-split 1,1,1 --split-mode layer --device cpu,cpu", "--tensor-split: 3 proportions for 2 devices"},
      {"--split-mode tensor", "--split-mode tensor: needs at least 2 devices"},
      {"--split-mode tensor --device cpu", "--split-mode tensor: needs at least 2 devices"},
      {"--split-mode tensor --device cpu,cpu -ts 3,1", "--tensor-split: --split-mode tensor needs equal shares"},
      {"--split-mode tensor --device cpu,cpu -ngl 1", "-ngl: --split-mode tensor runs every layer on the ranks"},
      {"--device cpu,cpu", "--device: the list 'cpu,cpu' needs --split-mode layer or tensor"},
      {"--device cpu,,cpu --split-mode layer", "--device: "},
      {"--device cpu,gpu --split-mode layer", "--device: 'cpu,gpu' is not auto, cpu, cuda or cuda:N"},
      {"--main-gpu -1", "--main-gpu: must be >= 0"},
      {"--main-gpu 7", "--main-gpu: 7 is not a GPU of this machine"},
  };
  for (const Case& c : cases) {
    const CmdResult r = kiln::test::run_kiln("run" + m + " " + c.args);
    EXPECT_EQ(r.rc, 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << c.args << ": " << r.err;
  }
}

TEST(CliSplitMode, ShapesThatDoNotDivideNameTheTensor) {
  const CmdResult r = kiln::test::run_kiln("run -m " + model("fixture-llama-q4_k_m") + kRun +
                                           " --split-mode tensor --device cpu,cpu");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("tensor 'blk.0.attn_output.weight' [256, 256] (q4_K): a shard of 128 input columns"),
            std::string::npos)
      << r.err;
}

TEST(CliSplitMode, HelpListsTheFlags) {
  const CmdResult r = kiln::test::run_kiln("run -h");
  EXPECT_EQ(r.rc, 0);
  for (const char* f : {"--split-mode", "--tensor-split", "--main-gpu"})
    EXPECT_TRUE(r.out.find(f) != std::string::npos || r.err.find(f) != std::string::npos) << f;
}

const std::string kGptOss = " -m " + kiln::test::data_path("models-gptoss/fixture-gptoss-f16.gguf");

TEST(CliCpuMoe, BadValuesNameTheFlagBeforeTheModelLoads) {
  struct Case {
    const char* args;
    const char* want;
  } cases[] = {
      {"--n-cpu-moe -1", "--n-cpu-moe: must be >= 0 (got -1)"},
      {"-ncmoe x", "-ncmoe: 'x' is not an integer"},
      {"-ot exps=CUDA0", "-ot: buffer type 'CUDA0' in 'exps=CUDA0': only CPU is supported for now"},
      {"-ot exps=CPU -ot up=gpu", "-ot: buffer type 'gpu' in 'up=gpu': only CPU is supported for now"},
      {"-ot exps", "-ot: 'exps' is not PATTERN=BUFTYPE (e.g. exps=CPU)"},
      {"--override-tensor 'ffn_(up=CPU'", "-ot: 'ffn_(up' is not a regular expression"},
      {"-ot", "-ot"},
      {"--cpu-moe --split-mode tensor --device cpu,cpu", "--cpu-moe / --n-cpu-moe / -ot: not with --split-mode tensor"},
  };
  const std::string missing = " -m /nonexistent/model.gguf ";
  const std::string out = " --out '" + kiln::test::temp_dir() + "kiln_cpu_moe.bin'";
  const std::string cmds[] = {"run -p hi", "chat", "perplexity -f " KILN_SOURCE_DIR "/README.md",
                              "logits --tokens 1,2" + out, "bench", "serve"};
  for (const std::string& cmd : cmds) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cmd + " " + c.args);
      const CmdResult r = kiln::test::run_kiln(cmd + missing + c.args, "hi\n");
      EXPECT_EQ(r.rc, 1);
      EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("/nonexistent/model.gguf"), std::string::npos) << "checked after loading: " << r.err;
    }
  }
}

// Which tensors a pattern matches is known once the file is open: a non-expert one is refused by name, before any
// weight is read. The router is not an expert tensor (it goes with its layer's experts, but -ot cannot name it).
TEST(CliCpuMoe, APatternMatchingANonExpertTensorNamesIt) {
  struct Case {
    const char* args;
    const char* want;
  } cases[] = {
      {"-ot attn_q=CPU", "-ot: 'attn_q' matches tensor 'blk.0.attn_q.weight': only expert tensors (blk.N.ffn_*_exps) "
                         "can be overridden for now"},
      {"-ot 'blk\\.1\\.ffn_.*=CPU'", "matches tensor 'blk.1.ffn_gate_inp.weight': only expert tensors"},
      {"-ot exps=CPU,^token_embd=CPU", "-ot: '^token_embd' matches tensor 'token_embd.weight'"},
  };
  for (const Case& c : cases) {
    const CmdResult r = kiln::test::run_kiln("run" + kGptOss + kRun + " --device cpu " + c.args);
    EXPECT_EQ(r.rc, 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << c.args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << ": " << r.out;
  }
}

// With every layer on the CPU the experts are already there: the ids are the plain run's, and a note says that the
// flags moved nothing (and why: on a dense model, that it has no experts).
TEST(CliCpuMoe, OnTheCpuTheFlagsChangeNothingAndSaySo) {
  const CmdResult one = kiln::test::run_kiln("run" + kGptOss + kRun + " --device cpu");
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(one.err.find("move no expert tensor"), std::string::npos) << one.err;
  for (const char* flags : {"--cpu-moe", "-cmoe", "--n-cpu-moe 1", "-ncmoe 99", "-ot exps=cpu",
                            "-ot 'blk\\.0\\.ffn_up_exps=CPU' --override-tensor 'blk\\.1\\.ffn_down_exps\\.bias=CPU'"}) {
    const CmdResult r = kiln::test::run_kiln("run" + kGptOss + kRun + " --device cpu " + flags);
    ASSERT_EQ(r.rc, 0) << flags << ": " << r.err;
    EXPECT_EQ(r.out, one.out) << flags;
    EXPECT_NE(r.err.find("kiln: --cpu-moe / --n-cpu-moe / -ot move no expert tensor: every layer runs on the CPU "
                         "already"),
              std::string::npos)
        << flags << ": " << r.err;
  }
  const CmdResult dense =
      kiln::test::run_kiln("run -m " + model("fixture-llama-q8_0") + kRun + " --device cpu --cpu-moe");
  ASSERT_EQ(dense.rc, 0) << dense.err;
  EXPECT_NE(dense.err.find("move no expert tensor: the model has no expert tensors"), std::string::npos) << dense.err;
}

TEST(CliCpuMoe, HelpListsTheFlags) {
  for (const char* cmd : {"run", "chat", "serve", "bench", "perplexity", "logits"}) {
    const CmdResult r = kiln::test::run_kiln(std::string(cmd) + " -h");
    EXPECT_EQ(r.rc, 0) << cmd;
    const std::string text = r.out + r.err;
    for (const char* f : {"--cpu-moe", "-cmoe", "--n-cpu-moe", "-ncmoe", "--override-tensor", "-ot",
                          "only expert tensors"})
      EXPECT_NE(text.find(f), std::string::npos) << cmd << ": " << f;
  }
}

}  // namespace
