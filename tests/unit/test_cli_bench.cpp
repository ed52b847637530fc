// kiln bench: llama-bench's output formats and field names; grammar decoding (a JSON schema, GBNF; the masked argmax
// on the device or the rows masked on the host) and its flags' errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/test_util.h"

namespace {

using kiln::test::CmdResult;
CmdResult kiln(const std::string& args) { return kiln::test::run_kiln(args); }

std::string model() { return kiln::test::data_path("models/fixture-llama-q8_0.gguf"); }

TEST(CliBench, JsonHasLlamaBenchFields) {
  CmdResult r = kiln("bench -m '" + model() + "' -p 8,16 -n 4 -d 0,8 -r 2 -t 1 -o json");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  // Per depth: pp8, pp16, tg4.
  ASSERT_EQ(j.size(), 6u);
  const char* tests[] = {"pp8", "pp16", "tg4", "pp8 @ d8", "pp16 @ d8", "tg4 @ d8"};
  for (size_t i = 0; i < j.size(); ++i) {
    auto& e = j[i];
    SCOPED_TRACE(e.dump());
    for (const char* k : {"model_type", "model_size", "model_n_params", "backends", "n_threads", "n_batch", "n_ubatch",
                          "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "avg_ns", "stddev_ns", "samples_ts",
                          "samples_ns", "model_filename", "type_k", "type_v", "test_time"})
      EXPECT_TRUE(e.contains(k)) << k;
    EXPECT_EQ(e["test"], tests[i]);
    EXPECT_EQ(e["n_threads"], 1);
    EXPECT_EQ(e["type_k"], "f16");
    EXPECT_EQ(e["type_v"], "f16");
    // The real placement: CPU with no offloaded layer, or CUDA with some (auto picks a GPU when there is one).
    EXPECT_TRUE(e["backends"] == "CPU" || e["backends"] == "CUDA") << e["backends"];
    EXPECT_EQ(e["backends"] == "CPU", e["n_gpu_layers"] == 0) << e.dump();
    EXPECT_EQ(e["model_type"], "llama ?B Q8_0");  // what llama-bench says for this file
    EXPECT_EQ(e["model_n_params"], 2086176);      // llama-bench: 2086176
    EXPECT_EQ(e["model_size"], 2220416);          // llama-bench: 2220416 (tensor data bytes)
    EXPECT_EQ(e["n_depth"], i < 3 ? 0 : 8);
    EXPECT_EQ(e["samples_ts"].size(), 2u);
    EXPECT_EQ(e["samples_ns"].size(), 2u);
    EXPECT_GT(e["avg_ts"].get<double>(), 0);
    EXPECT_GE(e["stddev_ts"].get<double>(), 0);
    // avg_ts is the mean of the per-sample rates.
    double mean = (e["samples_ts"][0].get<double>() + e["samples_ts"][1].get<double>()) / 2;
    EXPECT_NEAR(e["avg_ts"].get<double>(), mean, mean * 1e-4);
  }
  EXPECT_EQ(j[0]["n_prompt"], 8);
  EXPECT_EQ(j[0]["n_gen"], 0);
  EXPECT_EQ(j[2]["n_prompt"], 0);
  EXPECT_EQ(j[2]["n_gen"], 4);
}

TEST(CliBench, MarkdownAndCsv) {
  CmdResult md = kiln("bench -m '" + model() + "' -p 8 -n 2 -r 1 -t 1");
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_NE(md.out.find("| model "), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("t/s"), std::string::npos);
  EXPECT_NE(md.out.find("pp8"), std::string::npos);
  EXPECT_NE(md.out.find("tg2"), std::string::npos);
  EXPECT_NE(md.out.find("2.12 MiB"), std::string::npos);  // llama-bench: 2.12 MiB, 2.09 M
  EXPECT_NE(md.out.find("2.09 M"), std::string::npos);
  EXPECT_NE(md.out.find(" ± "), std::string::npos);
  CmdResult csv = kiln("bench -m '" + model() + "' -p 8 -n 0 -r 1 -t 1 -o csv");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  std::istringstream lines(csv.out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  EXPECT_NE(header.find("n_prompt,n_gen,n_depth"), std::string::npos) << header;
  EXPECT_NE(header.find("avg_ts,stddev_ts"), std::string::npos) << header;
  EXPECT_EQ(std::count(header.begin(), header.end(), ','), std::count(row.begin(), row.end(), ',')) << row;
}

// -np P: P sequences decode together; the rate counts P tokens per pass, each sequence at the depth.
TEST(CliBench, ParallelSequences) {
  CmdResult r = kiln("bench -m '" + model() + "' -p 8 -n 3 -np 1,5 -d 0,20 -r 2 -t 1 -o json");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 6u);
  const char* tests[] = {"pp8", "tg3", "tg3 np5", "pp8 @ d20", "tg3 @ d20", "tg3 np5 @ d20"};
  const int par[] = {1, 1, 5, 1, 1, 5};
  for (size_t i = 0; i < j.size(); ++i) {
    auto& e = j[i];
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(e["test"], tests[i]);
    EXPECT_EQ(e["n_parallel"], par[i]);
    for (size_t k = 0; k < 2; ++k)  // rate = tokens of all sequences / time
      EXPECT_NEAR(e["samples_ts"][k].get<double>(),
                  1e9 * (e["n_prompt"].get<double>() + par[i] * e["n_gen"].get<double>()) / e["samples_ns"][k].get<double>(),
                  1e-6 * e["samples_ts"][k].get<double>());
  }
}

// -ctk / -ctv: llama-bench's names, K and V independently (on the CPU, which stores every cache type).
TEST(CliBench, CacheTypes) {
  CmdResult r = kiln("bench -m '" + model() + "' --device cpu -p 8 -n 2 -r 1 -t 1 -o json -ctk q4_0 -ctv iq4_nl");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  for (auto& e : j) {
    EXPECT_EQ(e["type_k"], "q4_0") << e.dump();
    EXPECT_EQ(e["type_v"], "iq4_nl") << e.dump();
  }
  CmdResult csv = kiln("bench -m '" + model() + "' --device cpu -p 8 -n 0 -r 1 -t 1 -o csv --kv-type bf16");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  EXPECT_NE(csv.out.find("\"bf16\",\"bf16\""), std::string::npos) << csv.out;
  CmdResult bad = kiln("bench -m '" + model() + "' -ctv q4_k");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("-ctv: 'q4_k' is not a KV cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)"),
            std::string::npos) << bad.err;
  EXPECT_TRUE(bad.out.empty()) << bad.out;
}

// A grammar flag: each tg test twice, greedy free and under the grammar, the mask time on stderr and in the json.
TEST(CliBench, GrammarDecoding) {
  const std::string dir = ::testing::TempDir();
  const std::string sf = dir + "/bench_schema.json", gf = dir + "/bench_grammar.gbnf";
  std::ofstream(sf) << R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string",
    "maxLength": 5}}, "required": ["a", "b"], "additionalProperties": false})";
  std::ofstream(gf) << "root ::= [a-z]{1,6} \".\"\n";
  for (const std::string flags : {"-jf '" + sf + "'", "--grammar-file '" + gf + "' --mask-path host",
                                  "-jf '" + sf + "' --device cpu --mask-path device"}) {
    SCOPED_TRACE(flags);
    CmdResult r = kiln("bench -m '" + model() + "' -p 0 -n 6 -d 4 -np 1,3 -r 2 -t 1 -o json " + flags);
    ASSERT_EQ(r.rc, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 4u);
    const char* tests[] = {"tg6 greedy @ d4", "tg6 grammar @ d4", "tg6 np3 greedy @ d4", "tg6 np3 grammar @ d4"};
    for (size_t i = 0; i < j.size(); ++i) {
      SCOPED_TRACE(j[i].dump());
      EXPECT_EQ(j[i]["test"], tests[i]);
      EXPECT_GT(j[i]["avg_ts"].get<double>(), 0);
      EXPECT_EQ(j[i].contains("mask_ns_per_token"), i % 2 == 1);
    }
    EXPECT_NE(r.err.find("tg6 np3 grammar @ d4: token masks"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(flags.find("host") != std::string::npos ? "masked on the host" : "on the device"),
              std::string::npos) << r.err;
  }
  CmdResult md = kiln("bench -m '" + model() + "' -p 0 -n 4 -np 2 -r 1 -t 1 -jf '" + sf + "'");
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_NE(md.out.find("tg4 np2 greedy"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("tg4 np2 grammar"), std::string::npos) << md.out;
  // Errors name the flag.
  const std::pair<std::string, std::string> bad[] = {
      {"--mask-path gpu -jf '" + sf + "'", "--mask-path: 'gpu' is not device or host"},
      {"--mask-path host", "--mask-path: needs a grammar"},
      {"--grammar-file /nonexistent/g.gbnf", "--grammar-file"},
      {"--grammar 'root ::= ('", "--grammar"}};
  for (const auto& [a, want] : bad) {
    CmdResult r = kiln("bench -m '" + model() + "' -p 0 -n 2 " + a);
    EXPECT_EQ(r.rc, 1) << a;
    EXPECT_NE(r.err.find(want), std::string::npos) << a << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(CliBench, BadOptions) {
  for (std::string a : {"-o xml", "-p 8,x", "-r 0", "-p 0 -n 0", "-b 0", "-np 0", "-np 257", "-np 2,x"}) {
    CmdResult r = kiln("bench -m '" + model() + "' " + a);
    EXPECT_EQ(r.rc, 1) << a;
    EXPECT_NE(r.err.find("kiln bench: error"), std::string::npos) << a << ": " << r.err;
  }
}

}  // namespace
