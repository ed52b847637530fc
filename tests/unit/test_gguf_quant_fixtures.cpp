// kiln's reference (de)quantization against llama.cpp's fixture models (tests/data/models subset always, the full
// matrix at KILN_FIXTURES_DIR when present):
//  - every quantized tensor of every fixture-<arch>-<type>.gguf, dequantized, is compared with the same tensor of
//    the F16 source fixture-<arch>-f16.gguf: ||dequant - f16|| / ||f16|| must stay within 1.1x the per-type
//    `dequant_rel_rmse_max_by_type` of manifest.json (llama.cpp's own max over these tensors; the 10% covers
//    nothing but printing precision, since dequantization is deterministic: a wrong layout gives ~0.3 to 1.5);
//  - Q8_0 exactness: quantizing the F16 source with kiln's Q8_0 reproduces llama-quantize's bytes, tensor by tensor
//    (and so do kiln's Q4_0/Q4_1/Q5_0/Q5_1, which use llama.cpp's reference rounding too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "quant/reference.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// "q4_K" -> "Q4_K": the manifest's spelling.
std::string upper_name(DType t) {
  std::string s = dtype_name(t);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::map<std::string, double> load_thresholds(const std::string& models_dir) {
  std::ifstream f(models_dir + "/manifest.json");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::map<std::string, double> out;
  if (j.is_discarded() || !j.contains("dequant_rel_rmse_max_by_type")) return out;
  for (auto& [k, v] : j["dequant_rel_rmse_max_by_type"].items()) out[k] = v.get<double>();
  return out;
}

std::vector<float> dequantize_tensor(const gguf::TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  Status st = dequantize_row(t.type, t.data, out.data(), t.n_elements());
  EXPECT_TRUE(st.is_ok()) << t.name << ": " << st.to_string();
  return out;
}

// Fixture models present in `dir`: (arch, type stem) pairs, e.g. ("llama", "q4_k_m").
std::vector<std::pair<std::string, std::string>> list_models(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("fixture-", 0) != 0 || e.path().extension() != ".gguf") continue;
    const std::string stem = name.substr(8, name.size() - 8 - 5);  // "<arch>-<type>"
    const size_t dash = stem.find('-');
    if (dash == std::string::npos) continue;
    out.emplace_back(stem.substr(0, dash), stem.substr(dash + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct TypeStats {
  double max_rel_rmse = 0;
  int tensors = 0;
};

// Compares every non-F32 tensor of every quantized model in `dir` with its F16 source (in `src_dir`, default
// `dir`); returns the number of models compared. `stats` collects the max relative RMSE per type.
int check_dequant_against_f16(const std::string& dir, std::map<std::string, TypeStats>& stats,
                              std::string src_dir = "") {
  if (src_dir.empty()) src_dir = dir;
  const auto thresholds = load_thresholds(dir);
  EXPECT_FALSE(thresholds.empty()) << "no dequant_rel_rmse_max_by_type in " << dir << "/manifest.json";
  int compared = 0;
  for (const auto& [arch, type] : list_models(dir)) {
    if (type == "f16") continue;
    const std::string src_path = src_dir + "/fixture-" + arch + "-f16.gguf";
    const std::string q_path = dir + "/fixture-" + arch + "-" + type + ".gguf";
    if (!fs::exists(src_path)) {
      std::printf("note: fixture-%s-%s not compared: no F16 source fixture-%s-f16.gguf in %s\n", arch.c_str(),
                  type.c_str(), arch.c_str(), src_dir.c_str());
      continue;
    }
    auto src = gguf::File::open(src_path);
    auto q = gguf::File::open(q_path);
    EXPECT_TRUE(src.is_ok()) << src.status().to_string();
    EXPECT_TRUE(q.is_ok()) << q.status().to_string();
    if (!src.is_ok() || !q.is_ok()) continue;
    ++compared;
    for (const gguf::TensorInfo& t : q->tensors()) {
      if (t.type == DType::F32) continue;  // norms, rope factors: stored unquantized
      const gguf::TensorInfo* s = src->find_tensor(t.name);
      EXPECT_NE(s, nullptr) << q_path << ": tensor " << t.name << " missing from the F16 source";
      if (s == nullptr) continue;
      EXPECT_EQ(s->n_elements(), t.n_elements()) << t.name;
      if (s->n_elements() != t.n_elements()) continue;
      EXPECT_TRUE(can_dequantize(t.type)) << q_path << ": " << t.name << " has type " << dtype_name(t.type);
      if (!can_dequantize(t.type)) continue;
      const std::vector<float> ref = dequantize_tensor(*s);
      const std::vector<float> got = dequantize_tensor(t);
      const double rel = std::sqrt(test::nmse(got.data(), ref.data(), ref.size()));
      const std::string tn = upper_name(t.type);
      auto it = thresholds.find(tn);
      EXPECT_NE(it, thresholds.end()) << "manifest has no threshold for " << tn;
      if (it != thresholds.end()) {
        EXPECT_LE(rel, 1.1 * it->second) << q_path << ": " << t.name << " (" << tn << ") rel RMSE " << rel
                                         << " vs llama.cpp's max " << it->second;
      }
      TypeStats& ts = stats[tn];
      ts.max_rel_rmse = std::max(ts.max_rel_rmse, rel);
      ++ts.tensors;
    }
  }
  return compared;
}

void print_stats(const std::map<std::string, TypeStats>& stats, const std::string& dir) {
  const auto thresholds = load_thresholds(dir);
  std::printf("%-6s %8s %14s %14s\n", "type", "tensors", "kiln max rel", "llama.cpp max");
  for (const auto& [name, s] : stats) {
    auto it = thresholds.find(name);
    std::printf("%-6s %8d %14.6f %14.6f\n", name.c_str(), s.tensors, s.max_rel_rmse,
                it == thresholds.end() ? NAN : it->second);
  }
}

// Quantizes every tensor of type `type` in fixture-<arch>-<stem>.gguf from the F16 source (in `src_dir`, default
// `dir`) with kiln's quantizer and compares bytes. Valid for the types whose kiln quantizer is llama.cpp's reference
// rounding (Q8_0, the legacy Q4_0/Q4_1/Q5_0/Q5_1, MXFP4 and TQ1_0/TQ2_0), which is what llama-quantize runs without
// an imatrix.
void check_exact(const std::string& dir, const std::string& arch, const std::string& stem, DType type,
                 const std::string& src_dir = "") {
  const std::string src_path = (src_dir.empty() ? dir : src_dir) + "/fixture-" + arch + "-f16.gguf";
  const std::string q_path = dir + "/fixture-" + arch + "-" + stem + ".gguf";
  auto src = gguf::File::open(src_path);
  auto q = gguf::File::open(q_path);
  ASSERT_TRUE(src.is_ok()) << src.status().to_string();
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  const size_t block_bytes = static_cast<size_t>(dtype_type_size(type));
  int checked = 0;
  for (const gguf::TensorInfo& t : q->tensors()) {
    if (t.type != type) continue;
    const gguf::TensorInfo* s = src->find_tensor(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    ASSERT_EQ(s->n_elements(), t.n_elements()) << t.name;
    const std::vector<float> x = dequantize_tensor(*s);
    std::vector<uint8_t> mine(t.nbytes);
    ASSERT_TRUE(quantize_row(type, x.data(), mine.data(), t.n_elements()).is_ok());
    size_t bad = 0, first_bad = 0;
    const size_t n_blocks = t.nbytes / block_bytes;
    for (size_t b = 0; b < n_blocks; ++b) {
      if (std::memcmp(mine.data() + b * block_bytes, t.data + b * block_bytes, block_bytes) != 0) {
        if (bad++ == 0) first_bad = b;
      }
    }
    EXPECT_EQ(bad, 0u) << q_path << ": " << t.name << ": " << bad << " of " << n_blocks
                       << " blocks differ, first at block " << first_bad;
    ++checked;
  }
  EXPECT_GT(checked, 0) << q_path << " holds no " << dtype_name(type) << " tensor";
  std::printf("%s: %d %s tensors byte-identical to llama-quantize's\n", q_path.c_str(), checked, dtype_name(type));
}

// kiln's k-quant and IQ4 quantizers (not byte-compatible by design) against llama-quantize's on the same tensors:
// for every such tensor of every model in `dir`, kiln quantizes the F16 source (in `src_dir`, default `dir`) to the
// same type and its relative RMSE must be within `tolerance` x llama.cpp's relative RMSE on that tensor. Returns
// the per-type worst ratio.
std::map<std::string, double> check_kquant_error_level(const std::string& dir, double tolerance,
                                                       const std::string& src_dir = "") {
  std::map<std::string, double> worst;
  for (const auto& [arch, type] : list_models(dir)) {
    const std::string src_path = (src_dir.empty() ? dir : src_dir) + "/fixture-" + arch + "-f16.gguf";
    const std::string q_path = dir + "/fixture-" + arch + "-" + type + ".gguf";
    if (type == "f16" || !fs::exists(src_path)) continue;
    auto src = gguf::File::open(src_path);
    auto q = gguf::File::open(q_path);
    EXPECT_TRUE(src.is_ok() && q.is_ok()) << q_path;
    if (!src.is_ok() || !q.is_ok()) continue;
    for (const gguf::TensorInfo& t : q->tensors()) {
      if (t.type != DType::Q2_K && t.type != DType::Q3_K && t.type != DType::Q4_K && t.type != DType::Q5_K &&
          t.type != DType::Q6_K && t.type != DType::IQ4_NL && t.type != DType::IQ4_XS)
        continue;
      const gguf::TensorInfo* s = src->find_tensor(t.name);
      if (s == nullptr || s->n_elements() != t.n_elements()) continue;  // reported by the dequant test
      const std::vector<float> ref = dequantize_tensor(*s);
      const std::vector<float> theirs = dequantize_tensor(t);
      std::vector<uint8_t> mine_q(t.nbytes);
      EXPECT_TRUE(quantize_row(t.type, ref.data(), mine_q.data(), t.n_elements()).is_ok());
      std::vector<float> mine(ref.size());
      EXPECT_TRUE(dequantize_row(t.type, mine_q.data(), mine.data(), t.n_elements()).is_ok());
      const double rel_mine = std::sqrt(test::nmse(mine.data(), ref.data(), ref.size()));
      const double rel_theirs = std::sqrt(test::nmse(theirs.data(), ref.data(), ref.size()));
      EXPECT_LE(rel_mine, tolerance * rel_theirs)
          << q_path << ": " << t.name << " (" << dtype_name(t.type) << "): kiln rel RMSE " << rel_mine
          << ", llama.cpp " << rel_theirs;
      double& w = worst[upper_name(t.type)];
      w = std::max(w, rel_mine / rel_theirs);
    }
  }
  for (const auto& [name, r] : worst) std::printf("%s: kiln / llama.cpp rel RMSE, worst tensor: %.3f\n", name.c_str(), r);
  return worst;
}

TEST(GgufQuantFixtures, SubsetDequantWithinLlamaCppError) {
  std::map<std::string, TypeStats> stats;
  const int n = check_dequant_against_f16(test::data_path("models"), stats);
  EXPECT_GT(n, 0);
  print_stats(stats, test::data_path("models"));
}

// The subset's Q8_0 file, and the Q8_0 and Q4_0 matrices of the mixed fixture (tests/data/models-quant).
TEST(GgufQuantFixtures, SubsetQ8_0AndQ4_0ExactLlama) {
  check_exact(test::data_path("models"), "llama", "q8_0", DType::Q8_0);
  check_exact(test::data_path("models-quant"), "llama", "mix", DType::Q8_0, test::data_path("models"));
  check_exact(test::data_path("models-quant"), "llama", "mix", DType::Q4_0, test::data_path("models"));
}

TEST(GgufQuantFixtures, FullMatrixDequantWithinLlamaCppError) {
  KILN_REQUIRE_FIXTURES();
  const std::string dir = test::fixtures_dir() + "/models";
  std::map<std::string, TypeStats> stats;
  const int n = check_dequant_against_f16(dir, stats);
  EXPECT_GE(n, 14);  // llama: 11 quantized copies (incl. bf16); qwen2, qwen3: 4 each
  print_stats(stats, dir);
}

TEST(GgufQuantFixtures, FullMatrixQ8_0Exact) {
  KILN_REQUIRE_FIXTURES();
  for (const char* arch : {"llama", "qwen2", "qwen3"})
    check_exact(test::fixtures_dir() + "/models", arch, "q8_0", DType::Q8_0);
  for (const char* arch : {"gemma3", "qwen35"})  // models-next/
    check_exact(test::fixtures_dir() + "/models-next", arch, "q8_0", DType::Q8_0);
}

TEST(GgufQuantFixtures, ModelsNextDequantWithinLlamaCppError) {
  KILN_REQUIRE_FIXTURES();
  const std::string dir = test::fixtures_dir() + "/models-next";
  std::map<std::string, TypeStats> stats;
  const int n = check_dequant_against_f16(dir, stats);
  EXPECT_GE(n, 4);  // gemma3, qwen35: q8_0 and q4_k_m each
  print_stats(stats, dir);
}

TEST(GgufQuantFixtures, FullMatrixLegacyQuantizersExact) {
  KILN_REQUIRE_FIXTURES();
  const std::string dir = test::fixtures_dir() + "/models";
  check_exact(dir, "llama", "q4_0", DType::Q4_0);
  check_exact(dir, "llama", "q4_1", DType::Q4_1);
  check_exact(dir, "llama", "q5_0", DType::Q5_0);
  check_exact(dir, "llama", "q5_1", DType::Q5_1);
  check_exact(dir, "qwen2", "q4_0", DType::Q4_0);
  check_exact(dir, "qwen3", "q4_0", DType::Q4_0);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Tolerance 1.1: kiln's quantizers must be at llama.cpp's error level (its reference quantizers weight errors by
// |x| + rms, kiln minimizes the plain squared error, so per tensor kiln is typically at or below llama.cpp's).
TEST(GgufQuantFixtures, SubsetKQuantizersAtLlamaCppErrorLevel) {
  EXPECT_FALSE(check_kquant_error_level(test::data_path("models"), 1.1).empty());
}

TEST(GgufQuantFixtures, FullMatrixKQuantizersAtLlamaCppErrorLevel) {
  KILN_REQUIRE_FIXTURES();
  EXPECT_EQ(check_kquant_error_level(test::fixtures_dir() + "/models", 1.1).size(), 5u);  // Q2_K..Q6_K
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// tests/data/models-quant (tools/quant_fixture): the llama F16 source (tests/data/models) quantized by llama-quantize
// into one file with a type per matrix: layer 0 IQ4_NL, IQ4_XS, Q8_0, MXFP4, TQ1_0, TQ2_0, Q4_0 (reference
// rounding), layer 1 the seven i-quant grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M),
// token_embd IQ3_XXS, output IQ4_XS.
TEST(GgufQuantFixtures, CodebookTypesDequantWithinLlamaCppError) {
  std::map<std::string, TypeStats> stats;
  EXPECT_EQ(check_dequant_against_f16(test::data_path("models-quant"), stats, test::data_path("models")), 1);
  print_stats(stats, test::data_path("models-quant"));
  for (const char* t : {"IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0", "Q8_0", "Q4_0", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                        "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"})
    EXPECT_GT(stats[t].tensors, 0) << t;
}

TEST(GgufQuantFixtures, Mxfp4QuantizerExactLlama) {
  check_exact(test::data_path("models-quant"), "llama", "mix", DType::MXFP4, test::data_path("models"));
}

TEST(GgufQuantFixtures, TernaryQuantizersExactLlama) {
  check_exact(test::data_path("models-quant"), "llama", "mix", DType::TQ1_0, test::data_path("models"));
  check_exact(test::data_path("models-quant"), "llama", "mix", DType::TQ2_0, test::data_path("models"));
}

// kiln's IQ4 search (plain squared error) against llama.cpp's (errors weighted by x^2), tensor by tensor.
TEST(GgufQuantFixtures, Iq4QuantizersAtLlamaCppErrorLevel) {
  const auto worst = check_kquant_error_level(test::data_path("models-quant"), 1.1, test::data_path("models"));
  EXPECT_EQ(worst.count("IQ4_NL") + worst.count("IQ4_XS"), 2u);
}

}  // namespace
}  // namespace kiln
