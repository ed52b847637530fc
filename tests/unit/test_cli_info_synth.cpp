// `kiln info` and `kiln synth` end to end through the binary: outputs parse, written models reload with the
// reader with llama.cpp's tensor names/types/shapes, bad arguments fail naming the option.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"
#include "quant/reference.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int code;
  std::string out;  // stdout and stderr together
};

RunResult run_kiln(const std::string& args, bool with_stderr = true) {
  const std::string cmd = "'" + test::kiln_binary() + "' " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  RunResult r{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string temp_path(const std::string& name) {
  return ::kiln::test::temp_dir() + "kiln_cli_test_" + name;
}

const std::string kModel = test::data_path("models/fixture-llama-q4_k_m.gguf");
const std::string kVocab = test::vocab_path("gpt-2");

TEST(CliInfo, TextShowsHeaderArchTensorsTotals) {
  auto r = run_kiln("info '" + kModel + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"version 3", "arch:        llama", "block_count", "vocab:       1000 tokens, model gpt2",
                        "tokenizer.ggml.tokens", "[string x 1000]", "blk.1.ffn_down.weight", "q6_K", "totals:",
                        "22 tensors", "bits per weight"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in:\n" << r.out;
}

TEST(CliInfo, JsonParsesAndMatchesTheReader) {
  auto r = run_kiln("info --json '" + kModel + "'", false);
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  auto f = gguf::File::open(kModel);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["hparams"]["block_count"], 2);
  EXPECT_EQ(j["hparams"]["embedding_length"], 256);
  EXPECT_EQ(j["vocab"]["size"], 1000);
  EXPECT_EQ(j["vocab"]["pre"], "llama-bpe");
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"]["count"], 1000);
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"]["head"].size(), 8u);
  ASSERT_EQ(j["tensors"].size(), f->tensors().size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const auto& t = f->tensors()[i];
    EXPECT_EQ(j["tensors"][i]["name"], t.name);
    EXPECT_EQ(j["tensors"][i]["type"], dtype_name(t.type));
    EXPECT_EQ(j["tensors"][i]["shape"][0], t.ne[0]);
    EXPECT_EQ(j["tensors"][i]["bytes"], t.nbytes);
    bytes += t.nbytes;
  }
  EXPECT_EQ(j["totals"]["bytes"], bytes);
  EXPECT_GT(j["totals"]["bits_per_weight"].get<double>(), 4.0);
}

TEST(CliInfo, VocabOnlyFilesAndErrors) {
  auto r = run_kiln("info --json '" + kVocab + "'", false);
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["vocab"]["size"], 50257);
  EXPECT_EQ(j["totals"]["tensors"], 0);
  auto text = run_kiln("info '" + kVocab + "'");
  EXPECT_EQ(text.code, 0);
  auto missing = run_kiln("info /nonexistent/x.gguf");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("/nonexistent/x.gguf"), std::string::npos) << missing.out;
  auto none = run_kiln("info");
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.out.find("FILE"), std::string::npos) << none.out;
}

TEST(CliInfo, EveryFixtureModelAndVocab) {
  KILN_REQUIRE_FIXTURES();
  std::vector<std::string> files;
  for (const char* sub : {"/models", "/models-next"})
    for (auto& e : fs::directory_iterator(test::fixtures_dir() + sub))
      if (e.path().extension() == ".gguf") files.push_back(e.path().string());
  std::string tmp = ::kiln::test::temp_dir() + "kiln_info_vocab_XXXXXX";
  ASSERT_NE(::mkdtemp(tmp.data()), nullptr);
  const std::string cmd = "tar xJf '" + test::fixtures_dir() + "/tokenizer.tar.xz' -C '" + tmp + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  size_t n_vocabs = 0;
  for (auto& e : fs::directory_iterator(tmp + "/tokenizer"))
    if (e.path().extension() == ".gguf") files.push_back(e.path().string()), ++n_vocabs;
  EXPECT_GE(n_vocabs, 15u);
  for (const auto& p : files) {
    auto r = run_kiln("info --json '" + p + "'", false);
    ASSERT_EQ(r.code, 0) << p;
    EXPECT_TRUE(nlohmann::json::accept(r.out)) << p;
    EXPECT_EQ(run_kiln("info '" + p + "' > /dev/null").code, 0) << p;
  }
  fs::remove_all(tmp);
}

// Expected type of a synth tensor for --type `t` (llama.cpp's recipes).
DType expected_type(const std::string& t, const std::string& name, int layer, int n_layer, bool tied, int64_t n_gqa) {
  if (name.find("norm") != std::string::npos || name.find("bias") != std::string::npos || name == "rope_freqs.weight")
    return DType::F32;
  if (t == "f16") return DType::F16;
  if (t == "q8_0") return DType::Q8_0;
  if (t == "q6_k") return DType::Q6_K;
  const bool output = name == "output.weight" || (tied && name == "token_embd.weight");
  if (t == "mxfp4") return output ? DType::Q8_0 : DType::MXFP4;
  if (t == "tq1_0" || t == "tq2_0")
    return output ? DType::Q6_K : name == "token_embd.weight" ? DType::Q4_K : t == "tq1_0" ? DType::TQ1_0 : DType::TQ2_0;
  if (t == "iq2_xxs" || t == "iq2_xs" || t == "iq1_s" || t == "iq1_m") {  // dense files: no expert rules
    const DType base = t == "iq2_xxs" ? DType::IQ2_XXS : t == "iq2_xs" ? DType::IQ2_XS : t == "iq1_s" ? DType::IQ1_S
                                                                                                      : DType::IQ1_M;
    if (output) return DType::Q5_K;
    if (name == "token_embd.weight") return DType::Q2_K;
    if (name.find("attn_v") != std::string::npos) return n_gqa >= 4 ? DType::Q4_K : DType::Q2_K;
    if (name.find("ffn_down") != std::string::npos && layer < n_layer / 8) return DType::Q2_K;
    if (name.find("attn_output") != std::string::npos && (t == "iq1_s" || t == "iq1_m")) return DType::IQ2_XXS;
    return base;
  }
  if (output) return DType::Q6_K;
  if (t == "q4_0") return DType::Q4_0;
  if (t == "iq4_nl" || t == "iq4_xs") {
    const bool v = name.find("attn_v") != std::string::npos, down = name.find("ffn_down") != std::string::npos;
    if ((v && n_gqa >= 4) || (down && layer < n_layer / 8)) return DType::Q5_K;
    return t == "iq4_nl" ? DType::IQ4_NL : DType::IQ4_XS;
  }
  const bool more = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
  if ((name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos) && more)
    return DType::Q6_K;
  return DType::Q4_K;
}

void check_synth(const std::string& shape, const std::string& type, const std::string& extra, int n_layer,
                 bool tied, const std::string& arch) {
  SCOPED_TRACE(shape + " " + type + " " + extra);
  const std::string path = temp_path(shape + "-" + type + ".gguf");
  auto r = run_kiln("synth --shape " + shape + " --type " + type + " -t 2 -o '" + path + "' " + extra);
  ASSERT_EQ(r.code, 0) << r.out;
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_str("general.architecture"), arch);
  EXPECT_EQ(*f->get_u32(arch + ".block_count"), static_cast<uint32_t>(n_layer));
  const int64_t n_embd = *f->get_u32(arch + ".embedding_length");
  const int64_t n_ff = *f->get_u32(arch + ".feed_forward_length");
  const int64_t n_head = *f->get_u32(arch + ".attention.head_count");
  const int64_t n_kv = *f->get_u32(arch + ".attention.head_count_kv");
  const int64_t hd = *f->get_u32(arch + ".attention.key_length");
  const int64_t n_vocab = static_cast<int64_t>(f->get_str_array("tokenizer.ggml.tokens")->size());
  EXPECT_EQ(*f->get_u32(arch + ".vocab_size"), static_cast<uint32_t>(n_vocab));
  struct Want {
    std::string name;
    std::vector<int64_t> shape;
    int layer;
  };
  std::vector<Want> want = {{"token_embd.weight", {n_embd, n_vocab}, 0}, {"output_norm.weight", {n_embd}, 0}};
  if (!tied) want.push_back({"output.weight", {n_embd, n_vocab}, 0});
  if (shape.rfind("llama3", 0) == 0) want.push_back({"rope_freqs.weight", {hd / 2}, 0});  // Llama 3 RoPE factors
  for (int i = 0; i < n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    for (Want w : std::vector<Want>{{"attn_norm.weight", {n_embd}, i},
                                    {"attn_q.weight", {n_embd, n_head * hd}, i},
                                    {"attn_k.weight", {n_embd, n_kv * hd}, i},
                                    {"attn_v.weight", {n_embd, n_kv * hd}, i},
                                    {"attn_output.weight", {n_head * hd, n_embd}, i},
                                    {"ffn_norm.weight", {n_embd}, i},
                                    {"ffn_gate.weight", {n_embd, n_ff}, i},
                                    {"ffn_up.weight", {n_embd, n_ff}, i},
                                    {"ffn_down.weight", {n_ff, n_embd}, i}}) {
      w.name = p + w.name;
      want.push_back(w);
    }
    if (arch == "qwen3") {
      want.push_back({p + "attn_q_norm.weight", {hd}, i});
      want.push_back({p + "attn_k_norm.weight", {hd}, i});
    }
    if (arch == "qwen2") {
      want.push_back({p + "attn_q.bias", {n_head * hd}, i});
      want.push_back({p + "attn_k.bias", {n_kv * hd}, i});
      want.push_back({p + "attn_v.bias", {n_kv * hd}, i});
    }
  }
  EXPECT_EQ(f->tensors().size(), want.size());
  for (const Want& w : want) {
    const gguf::TensorInfo* t = f->find_tensor(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->n_dims, w.shape.size()) << w.name;
    for (size_t d = 0; d < w.shape.size(); ++d) EXPECT_EQ(t->ne[d], w.shape[d]) << w.name;
    EXPECT_EQ(t->type, expected_type(type, w.name, w.layer, n_layer, tied, n_head / n_kv))
        << w.name << " is " << dtype_name(t->type);
  }
  // Norm weights are near 1.
  const gguf::TensorInfo* norm = f->find_tensor("output_norm.weight");
  for (int64_t i = 0; i < norm->ne[0]; ++i) {
    float x;
    std::memcpy(&x, norm->data + 4 * i, 4);
    ASSERT_NEAR(x, 1.0f, 0.11f);
  }
  fs::remove(path);
}

TEST(CliSynth, TinyEveryType) {
  for (const char* t : {"f16", "q8_0", "q4_0", "q4_k_m", "q6_k", "iq4_nl", "iq4_xs", "mxfp4", "tq1_0", "tq2_0"})
    check_synth("tiny", t, "", 2, false, "llama");
  // IQ4 mixes: Q5_K attn_v with 4 query heads per KV head, Q5_K ffn_down in the first n_layer / 8 layers
  check_synth("llama3-8b", "iq4_xs", "--layers 8 --embd 256 --ff 768 --heads 4 --kv-heads 1 --n-vocab 700", 8, false,
              "llama");
  // The 2- and 1-bit i-quant mixes: Q2_K token_embd and early ffn_down, Q4_K attn_v with 4 query heads per KV head,
  // Q5_K output (tiny's 256-wide rows: whole super-blocks)
  for (const char* t : {"iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"}) {
    check_synth("tiny", t, "", 2, false, "llama");
    check_synth("llama3-8b", t, "--layers 8 --embd 256 --ff 768 --heads 4 --kv-heads 1 --n-vocab 700", 8, false,
                "llama");
  }
}

// The i-quant blocks synth writes decode to finite weights of about the requested scale (random codes: grid
// indices, signs, scales), and kiln runs the files.
TEST(CliSynth, LowBitIquantTypesLoadAndRun) {
  for (const char* t : {"iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"}) {
    SCOPED_TRACE(t);
    const std::string path = temp_path(std::string("tiny-") + t + "-run.gguf");
    auto r = run_kiln(std::string("synth --shape tiny --type ") + t + " -t 2 -o '" + path + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    const gguf::TensorInfo* w = f->find_tensor("blk.1.ffn_gate.weight");  // n_in 256: sigma 1/16
    ASSERT_NE(w, nullptr);
    ASSERT_TRUE(is_iquant_grid(w->type)) << dtype_name(w->type);
    const int64_t n = w->ne[0] * w->ne[1];
    std::vector<float> x(static_cast<size_t>(n));
    ASSERT_TRUE(dequantize_row(w->type, w->data, x.data(), n).is_ok());
    double ss = 0;
    for (float v : x) {
      ASSERT_TRUE(std::isfinite(v));
      ss += static_cast<double>(v) * v;
    }
    const double rms = std::sqrt(ss / static_cast<double>(n));
    EXPECT_GT(rms, 0.5 / 16) << rms;
    EXPECT_LT(rms, 2.0 / 16) << rms;
    r = run_kiln("run -m '" + path + "' --tokens 1,2,3,4,5,6,7,8,9 -n 4 --temp 0 --ids --ignore-eos -t 2");
    EXPECT_EQ(r.code, 0) << r.out;
    fs::remove(path);
  }
}

TEST(CliSynth, QwenShapesAndOverrides) {
  check_synth("tiny-qwen3", "q4_k_m", "", 2, true, "qwen3");
  check_synth("tiny-qwen2", "q8_0", "", 2, false, "qwen2");
  // 16 layers exercise the q4_k_m "more bits" pattern; overrides shrink a big shape.
  check_synth("qwen3-0.6b", "q4_k_m", "--layers 16 --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64 --n-vocab 2000",
              16, true, "qwen3");
  check_synth("llama3-8b", "q4_0", "--layers 3 --embd 256 --ff 768 --heads 4 --kv-heads 1 --n-vocab 700", 3, false,
              "llama");
}

// The Qwen3.5 and Gemma 3 shapes (shrunk): their own tensors and keys, and kiln loads and runs what it writes.
TEST(CliSynth, Qwen35AndGemma3ShapesLoadAndRun) {
  struct Case {
    const char* shape;
    const char* arch;
  };
  for (const Case c : {Case{"qwen3.5-0.8b", "qwen35"}, Case{"gemma3-4b", "gemma3"}}) {
    SCOPED_TRACE(c.shape);
    const std::string path = temp_path(std::string(c.shape) + ".gguf");
    auto r = run_kiln(std::string("synth --shape ") + c.shape +
                      " --type q8_0 -t 2 --layers 4 --embd 256 --ff 512 --heads 2 --kv-heads 1 --n-vocab 2000 -o '" +
                      path + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ(*f->get_str("general.architecture"), c.arch);
    const std::string a = c.arch;
    if (a == "qwen35") {
      EXPECT_EQ(*f->get_u32(a + ".full_attention_interval"), 4u);
      EXPECT_EQ(*f->get_u32(a + ".rope.dimension_count"), 64u);
      EXPECT_NE(f->find_tensor("blk.0.ssm_conv1d.weight"), nullptr);
      EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight"), nullptr);  // a Gated DeltaNet layer
      const gguf::TensorInfo* q = f->find_tensor("blk.3.attn_q.weight");
      ASSERT_NE(q, nullptr);
      EXPECT_EQ(q->ne[1], 2 * 2 * 256);  // query | gate per head
    } else {
      EXPECT_EQ(*f->get_u32(a + ".attention.sliding_window"), 1024u);
      EXPECT_NE(f->find_tensor("blk.3.post_ffw_norm.weight"), nullptr);
      EXPECT_NE(f->find_tensor("blk.3.post_attention_norm.weight"), nullptr);
    }
    r = run_kiln("run -m '" + path + "' --tokens 1,2,3,4,5,6,7,8,9 -n 4 --temp 0 --ids --ignore-eos -t 2");
    EXPECT_EQ(r.code, 0) << r.out;
    fs::remove(path);
  }
}

// The ternary types (every matrix but token_embd and output): kiln loads and runs what it writes.
TEST(CliSynth, TernaryTypesLoadAndRun) {
  for (const char* t : {"tq1_0", "tq2_0"}) {
    SCOPED_TRACE(t);
    const std::string path = temp_path(std::string("tiny-") + t + "-run.gguf");
    auto r = run_kiln(std::string("synth --shape tiny --type ") + t + " -t 2 -o '" + path + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_kiln("run -m '" + path + "' --tokens 1,2,3,4,5,6,7,8,9 -n 4 --temp 0 --ids --ignore-eos -t 2");
    EXPECT_EQ(r.code, 0) << r.out;
    fs::remove(path);
  }
}

// The MoE shapes: the expert keys, an f32 router, expert stacks [n_in, n_out, n_expert] in the types llama.cpp's
// quantizer picks (Q4_K_M with 8 experts: attn_k / attn_v Q8_0, attn_output Q5_K, ffn_down_exps Q6_K on the "more
// bits" layers; mxfp4: MXFP4 experts, Q8_0 dense matrices), and kiln loads and runs what it writes.
TEST(CliSynth, QwenMoeShapesLoadAndRun) {
  struct Case {
    std::string args, type;
    uint32_t experts, used, ff_exp;
  };
  for (const Case& c : {Case{"tiny-qwen3moe", "q4_k_m", 8, 2, 256}, Case{"tiny-qwen3moe", "mxfp4", 8, 2, 256},
                        Case{"qwen3moe-30b-a3b --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64 "
                             "--experts 16 --experts-used 4 --expert-ff 256 --n-vocab 2000", "q4_k_m", 16, 4, 256}}) {
    SCOPED_TRACE(c.args + " " + c.type);
    const std::string path = temp_path("moe.gguf");
    auto r = run_kiln("synth --shape " + c.args + " --type " + c.type + " -t 2 -o '" + path + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ(*f->get_str("general.architecture"), "qwen3moe");
    EXPECT_EQ(*f->get_u32("qwen3moe.expert_count"), c.experts);
    EXPECT_EQ(*f->get_u32("qwen3moe.expert_used_count"), c.used);
    EXPECT_EQ(*f->get_u32("qwen3moe.expert_feed_forward_length"), c.ff_exp);
    const int64_t e = *f->get_u32("qwen3moe.embedding_length");
    EXPECT_EQ(f->find_tensor("blk.0.ffn_gate.weight"), nullptr);
    auto type_of = [&](const std::string& n, std::vector<int64_t> shape) {
      const gguf::TensorInfo* t = f->find_tensor(n);
      EXPECT_NE(t, nullptr) << n;
      if (!t) return DType::F32;
      EXPECT_EQ(std::vector<int64_t>(t->ne, t->ne + t->n_dims), shape) << n;
      return t->type;
    };
    EXPECT_EQ(type_of("blk.1.ffn_gate_inp.weight", {e, c.experts}), DType::F32);
    const DType gate = type_of("blk.0.ffn_gate_exps.weight", {e, c.ff_exp, c.experts});
    EXPECT_EQ(type_of("blk.0.ffn_up_exps.weight", {e, c.ff_exp, c.experts}), gate);
    const DType down0 = type_of("blk.0.ffn_down_exps.weight", {c.ff_exp, e, c.experts});
    const DType down1 = type_of("blk.1.ffn_down_exps.weight", {c.ff_exp, e, c.experts});
    const DType attn_k = f->find_tensor("blk.0.attn_k.weight")->type, attn_o = f->find_tensor("blk.0.attn_output.weight")->type;
    if (c.type == "mxfp4") {
      EXPECT_EQ(gate, DType::MXFP4);
      EXPECT_EQ(down1, DType::MXFP4);
      EXPECT_EQ(attn_o, DType::Q8_0);
    } else {
      EXPECT_EQ(gate, DType::Q4_K);
      EXPECT_EQ(down0, DType::Q4_K);
      EXPECT_EQ(down1, DType::Q6_K);  // use_more_bits(1, 2)
      EXPECT_EQ(attn_k, c.experts == 8 ? DType::Q8_0 : DType::Q4_K);
      EXPECT_EQ(attn_o, c.experts == 8 ? DType::Q5_K : DType::Q4_K);
    }
    r = run_kiln("run -m '" + path + "' --tokens 1,2,3,4,5,6,7,8,9 -n 4 --temp 0 --ids --ignore-eos -t 2");
    EXPECT_EQ(r.code, 0) << r.out;
    fs::remove(path);
  }
  auto r = run_kiln("synth --shape tiny --experts 4 -o '" + temp_path("x.gguf") + "'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--experts: shape tiny has no experts"), std::string::npos) << r.out;
  r = run_kiln("synth --shape tiny-qwen3moe --experts-used 9 -o '" + temp_path("x.gguf") + "'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--experts-used 9 is more than the 8 experts"), std::string::npos) << r.out;
}

// The type llama.cpp's quantizer gives a tiny-gptoss tensor (4 layers, rows of 288 that are not K-quant blocks, so
// Q4_K falls back to Q5_0 and Q6_K to Q8_0; attn_output's rows are 8 x 64 = 512). F32: norms, biases, sinks and the
// router.
DType gptoss_expected_type(const std::string& t, const std::string& name, int layer) {
  const bool f32 = name.find("norm") != std::string::npos || name.find("bias") != std::string::npos ||
                   name.find("sinks") != std::string::npos || name.find("ffn_gate_inp") != std::string::npos;
  if (f32) return DType::F32;
  if (t == "f16") return DType::F16;
  if (t == "q8_0") return DType::Q8_0;
  const bool experts = name.find("_exps.") != std::string::npos;
  if (t == "mxfp4") return experts ? DType::MXFP4 : DType::Q8_0;
  // q4_k_m: use_more_bits(layer, 4) holds for layers 2 and 3
  if (name == "output.weight") return DType::Q8_0;
  if (name.find("attn_output") != std::string::npos) return DType::Q4_K;
  const bool more = layer >= 2;
  if ((name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos) && more)
    return DType::Q8_0;
  return DType::Q5_0;
}

// tiny-gptoss with every type: llama.cpp's gpt-oss keys and tensors (shapes, types), the tensor list is exactly
// what kiln's gpt-oss manifest binds, `kiln info` shows the hyperparameters, kiln loads it with the derived
// settings and its logits over a prompt past the sliding window are finite.
TEST(CliSynth, GptOssTinyEveryTypeLoadsAndRuns) {
  for (const std::string type : {"f16", "q8_0", "q4_k_m", "mxfp4"}) {
    SCOPED_TRACE(type);
    const std::string path = temp_path("gptoss-" + type + ".gguf");
    auto r = run_kiln("synth --shape tiny-gptoss --type " + type + " -t 2 -o '" + path + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    const std::string a = "gpt-oss.";
    EXPECT_EQ(*f->get_str("general.architecture"), "gpt-oss");
    EXPECT_EQ(*f->get_u32(a + "block_count"), 4u);
    EXPECT_EQ(*f->get_u32(a + "embedding_length"), 288u);
    EXPECT_EQ(*f->get_u32(a + "attention.head_count"), 8u);
    EXPECT_EQ(*f->get_u32(a + "attention.head_count_kv"), 2u);
    EXPECT_EQ(*f->get_u32(a + "attention.key_length"), 64u);
    EXPECT_EQ(*f->get_u32(a + "attention.sliding_window"), 16u);
    EXPECT_EQ(*f->get_u32(a + "expert_count"), 16u);
    EXPECT_EQ(*f->get_u32(a + "expert_used_count"), 4u);
    EXPECT_EQ(*f->get_u32(a + "expert_feed_forward_length"), 288u);
    EXPECT_EQ(*f->get_str(a + "rope.scaling.type"), "yarn");
    EXPECT_EQ(*f->get_f32(a + "rope.scaling.factor"), 32.0f);
    EXPECT_EQ(*f->get_u32(a + "rope.scaling.original_context_length"), 4096u);
    EXPECT_EQ(*f->get_f32(a + "rope.freq_base"), 150000.0f);
    EXPECT_EQ(*f->get_str("tokenizer.ggml.pre"), "gpt-4o");

    // Shapes and types against llama.cpp's LLM_ARCH_OPENAI_MOE tensors.
    const int64_t e = 288, q = 512, kv = 128, x = 16, ff = 288, nv = 1024;
    std::map<std::string, std::pair<std::vector<int64_t>, int>> want = {
        {"token_embd.weight", {{e, nv}, 0}}, {"output_norm.weight", {{e}, 0}}, {"output.weight", {{e, nv}, 0}}};
    for (int i = 0; i < 4; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      for (const auto& [n, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"attn_norm.weight", {e}}, {"attn_q.weight", {e, q}}, {"attn_q.bias", {q}},
               {"attn_k.weight", {e, kv}}, {"attn_k.bias", {kv}}, {"attn_v.weight", {e, kv}}, {"attn_v.bias", {kv}},
               {"attn_output.weight", {q, e}}, {"attn_output.bias", {e}}, {"attn_sinks.weight", {8}},
               {"post_attention_norm.weight", {e}}, {"ffn_gate_inp.weight", {e, x}}, {"ffn_gate_inp.bias", {x}},
               {"ffn_gate_exps.weight", {e, ff, x}}, {"ffn_gate_exps.bias", {ff, x}},
               {"ffn_up_exps.weight", {e, ff, x}}, {"ffn_up_exps.bias", {ff, x}},
               {"ffn_down_exps.weight", {ff, e, x}}, {"ffn_down_exps.bias", {e, x}}})
        want[p + n] = {shape, i};
    }
    EXPECT_EQ(f->tensors().size(), want.size());
    for (const auto& [n, w] : want) {
      const gguf::TensorInfo* t = f->find_tensor(n);
      ASSERT_NE(t, nullptr) << n;
      EXPECT_EQ(std::vector<int64_t>(t->ne, t->ne + t->n_dims), w.first) << n;
      EXPECT_EQ(t->type, gptoss_expected_type(type, n, w.second)) << n << " is " << dtype_name(t->type);
    }

    // Exactly the tensors kiln's gpt-oss loader binds, every required one present with its shape.
    HParams hp;
    hp.arch = "gpt-oss";
    const ArchDef* arch = find_arch(hp.arch);
    ASSERT_NE(arch, nullptr);
    ASSERT_TRUE(read_common_hparams(*f, hp).is_ok());
    ASSERT_TRUE(arch->read_hparams(*f, hp).is_ok());
    Weights w;
    w.layers.resize(static_cast<size_t>(hp.n_layer));
    std::set<std::string> bound;
    for (const TensorSpec& spec : arch->manifest(hp, w)) {
      const gguf::TensorInfo* t = f->find_tensor(spec.name);
      if (!t) {
        EXPECT_FALSE(spec.required) << spec.name;
        continue;
      }
      bound.insert(spec.name);
      EXPECT_EQ(std::vector<int64_t>(t->ne, t->ne + t->n_dims), spec.shape) << spec.name;
    }
    for (const gguf::TensorInfo& t : f->tensors()) EXPECT_TRUE(bound.count(t.name)) << t.name << " is not read";

    auto info = run_kiln("info --json '" + path + "'", false);
    ASSERT_EQ(info.code, 0);
    auto j = nlohmann::json::parse(info.out);
    EXPECT_EQ(j["architecture"], "gpt-oss");
    EXPECT_EQ(j["hparams"]["expert_count"], 16);
    EXPECT_EQ(j["hparams"]["attention.sliding_window"], 16);
    EXPECT_EQ(j["hparams"]["rope.scaling.type"], "yarn");
    EXPECT_EQ(j["vocab"]["pre"], "gpt-4o");

    {  // the loaded model is released before the CLI runs load it again
      auto m = Model::load(path, LoadOptions{});
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      const HParams& mh = m.value()->hparams();
      EXPECT_EQ(mh.n_expert, 16);
      EXPECT_EQ(mh.n_expert_used, 4);
      EXPECT_EQ(mh.layer_swa, (std::vector<uint8_t>{1, 0, 1, 0}));  // even layers local
      EXPECT_TRUE(mh.attn_sinks);
      EXPECT_FLOAT_EQ(mh.rope_freq_scale, 1.0f / 32);
      EXPECT_EQ(mh.n_ctx_orig_yarn, 4096);
      EXPECT_FALSE(mh.tied_embeddings);
    }

    // 40 positions: the local layers' window of 16 matters from position 16 on.
    std::string ids;
    for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(7 + 23 * i);
    const std::string out = temp_path("gptoss-" + type + ".logits");
    r = run_kiln("logits -m '" + path + "' --tokens " + ids + " --all -b 16 -t 2 -o '" + out + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    const std::vector<uint8_t> bytes = test::read_file(out);
    ASSERT_EQ(bytes.size(), 40u * nv * 4);
    std::vector<float> logits(bytes.size() / 4);
    std::memcpy(logits.data(), bytes.data(), bytes.size());
    double sum_sq = 0;
    for (float v : logits) {
      ASSERT_TRUE(std::isfinite(v));
      sum_sq += static_cast<double>(v) * v;
    }
    EXPECT_GT(sum_sq / static_cast<double>(logits.size()), 1e-4);  // not all zero
    r = run_kiln("run -m '" + path + "' --tokens 1,2,3,4,5,6,7,8,9 -n 4 --temp 0 --ids --ignore-eos -t 2");
    EXPECT_EQ(r.code, 0) << r.out;
    fs::remove(out);
    fs::remove(path);
  }
}

// The harmony vocabulary of the gpt-oss shapes: the BPE tokens, pads, then o200k_harmony's special block at the end
// (at its real ids with the full 201088 tokens), BOS <|startoftext|>, EOS <|return|>, padding <|endoftext|>.
TEST(CliSynth, GptOssHarmonyVocabulary) {
  struct Case {
    std::string extra;
    int64_t n_vocab, first;  // the special block starts at `first` (0: wherever it fits)
  };
  for (const Case& c : {Case{"", 1024, 0}, Case{"--n-vocab 201088", 201088, 199998}}) {
    SCOPED_TRACE(c.extra);
    const std::string path = temp_path("gptoss-vocab.gguf");
    auto r = run_kiln("synth --shape tiny-gptoss --layers 1 -t 2 " + c.extra + " -o '" + path + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok());
    const auto tokens = *f->get_str_array("tokenizer.ggml.tokens");
    const auto types = *f->get_i32_array("tokenizer.ggml.token_type");
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), c.n_vocab);
    const int64_t first = std::find(tokens.begin(), tokens.end(), "<|startoftext|>") - tokens.begin();
    ASSERT_LT(first + 20, c.n_vocab);
    if (c.first) {  // pads between the BPE tokens and the special block
      EXPECT_EQ(first, c.first);
      EXPECT_EQ(tokens[first - 1], "[PAD" + std::to_string(first - 1) + "]");
    }
    const std::map<int64_t, std::string> named = {{1, "<|endoftext|>"}, {2, "<|reserved_200000|>"},
                                                  {4, "<|return|>"},    {5, "<|constrain|>"},
                                                  {7, "<|channel|>"},   {8, "<|start|>"},
                                                  {9, "<|end|>"},       {10, "<|message|>"},
                                                  {14, "<|call|>"},     {20, "<|endofprompt|>"}};
    for (const auto& [k, text] : named) {
      EXPECT_EQ(tokens[first + k], text);
      EXPECT_EQ(types[first + k], 3) << text;
    }
    EXPECT_EQ(*f->get_u32("tokenizer.ggml.bos_token_id"), first);
    EXPECT_EQ(*f->get_u32("tokenizer.ggml.eos_token_id"), first + 4);
    EXPECT_EQ(*f->get_u32("tokenizer.ggml.padding_token_id"), first + 1);
    if (c.n_vocab == 201088) {
      EXPECT_EQ(tokens.back(), "<|reserved_201087|>");
    }
    // kiln's tokenizer reads it: harmony markers are single tokens, <|return|> and <|call|> end generation.
    r = run_kiln("tokenize -m '" + path + "' --ids -p '<|start|>assistant<|channel|>final<|message|>Hi<|return|>'");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(std::to_string(first + 8)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::to_string(first + 4)), std::string::npos) << r.out;
    fs::remove(path);
  }
}

TEST(CliSynth, DeterministicForASeed) {
  const std::string a = temp_path("a.gguf"), b = temp_path("b.gguf"), c = temp_path("c.gguf");
  ASSERT_EQ(run_kiln("synth --shape tiny --type q4_k_m -t 1 --seed 7 -o '" + a + "'").code, 0);
  ASSERT_EQ(run_kiln("synth --shape tiny --type q4_k_m -t 2 --seed 7 -o '" + b + "'").code, 0);
  ASSERT_EQ(run_kiln("synth --shape tiny --type q4_k_m -t 2 --seed 8 -o '" + c + "'").code, 0);
  EXPECT_EQ(test::read_file(a), test::read_file(b));
  EXPECT_NE(test::read_file(a), test::read_file(c));
  for (auto& p : {a, b, c}) fs::remove(p);
}

TEST(CliSynth, CopiesAndPadsAVocabulary) {
  auto src = gguf::File::open(kVocab);
  ASSERT_TRUE(src.is_ok());
  auto src_tokens = *src->get_str_array("tokenizer.ggml.tokens");
  const std::string path = temp_path("vocab.gguf");
  // The vocabulary (50257) is larger than tiny's 1024: its size is used, and said so.
  auto r = run_kiln("synth --shape tiny --type q8_0 --vocab '" + kVocab + "' -o '" + path + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("50257"), std::string::npos) << r.out;
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(*f->get_str_array("tokenizer.ggml.tokens"), src_tokens);
  EXPECT_EQ(f->find_tensor("token_embd.weight")->ne[1], 50257);
  for (const auto& kv : src->kvs()) {
    if (kv.key.rfind("tokenizer.", 0) == 0) {
      EXPECT_TRUE(f->has(kv.key)) << kv.key;
    }
  }
  // Explicit larger --n-vocab pads with control tokens.
  r = run_kiln("synth --shape tiny --type q8_0 --vocab '" + kVocab + "' --n-vocab 50300 -o '" + path + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  auto tokens = *f->get_str_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 50300u);
  EXPECT_EQ(tokens[50299], "[PAD50299]");
  EXPECT_EQ((*f->get_i32_array("tokenizer.ggml.token_type"))[50299], 3);
  EXPECT_EQ(f->find_tensor("output.weight")->ne[1], 50300);
  // Explicit smaller --n-vocab is an error.
  r = run_kiln("synth --shape tiny --vocab '" + kVocab + "' --n-vocab 1000 -o '" + path + "'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--n-vocab"), std::string::npos) << r.out;
  fs::remove(path);
}

TEST(CliSynth, BuiltinVocabulary) {
  const std::string path = temp_path("builtin.gguf");
  ASSERT_EQ(run_kiln("synth --shape tiny -o '" + path + "'").code, 0);
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(*f->get_str("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->get_str("tokenizer.ggml.pre"), "gpt-2");
  auto tokens = *f->get_str_array("tokenizer.ggml.tokens");
  auto types = *f->get_i32_array("tokenizer.ggml.token_type");
  auto merges = *f->get_str_array("tokenizer.ggml.merges");
  ASSERT_EQ(tokens.size(), 1024u);
  EXPECT_EQ(tokens[0], "!");      // GPT-2's byte order: printable bytes first
  EXPECT_EQ(tokens[188], "Ā");    // byte 0 maps to U+0100
  EXPECT_GE(merges.size(), 200u);
  const uint32_t eot = *f->get_u32("tokenizer.ggml.eos_token_id");
  EXPECT_EQ(*f->get_u32("tokenizer.ggml.bos_token_id"), eot);
  EXPECT_EQ(tokens[eot], "<|endoftext|>");
  EXPECT_EQ(types[eot], 3);
  EXPECT_EQ(tokens[1023], "[PAD1023]");
  // Every merge's result is a token.
  std::set<std::string> have(tokens.begin(), tokens.end());
  for (const auto& m : merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos);
    EXPECT_TRUE(have.count(m.substr(0, sp) + m.substr(sp + 1))) << m;
  }
  fs::remove(path);
}

TEST(CliSynth, BadArgumentsNameTheOption) {
  const std::string out = "-o '" + temp_path("bad.gguf") + "'";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"synth --shape nope " + out, "--shape"},
      {"synth --shape tiny --type q5_k " + out, "--type"},
      {"synth --shape tiny --type iq3_s " + out, "does not write them"},  // decoded, never written
      {"synth --shape tiny --type IQ1_M " + out, "iq1_m"},
      {"synth --shape tiny --type q4_k_m --embd 100 " + out, "--embd"},
      {"synth --shape tiny --layers 0 " + out, "--layers"},
      {"synth --shape tiny --kv-heads 3 " + out, "--kv-heads"},
      {"synth --shape tiny --layers x " + out, "--layers"},
      {"synth --shape tiny", "-o"},
      {"synth " + out, "--shape"},
      {"synth --shape tiny --n-vocab 10 " + out, "--n-vocab"},
      {"synth --shape tiny --vocab /nonexistent.gguf " + out, "--vocab"},
      {"synth --shape tiny --bogus " + out, "--bogus"},
  };
  for (const Case& c : cases) {
    auto r = run_kiln(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << " -> " << r.out;
  }
  EXPECT_FALSE(fs::exists(temp_path("bad.gguf")));
}

}  // namespace
}  // namespace kiln
