// Models the server tests make from the llama fixture: another chat template, and the "tool model" whose reply is
// known. Tokens 993 and 994 spell a whole Hermes tool call, and output.weight is zero except row 993 = w and row
// 994 = -w, so greedy decoding always picks one of the two (whichever sign h.w has), and every generated token is a
// tool call.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "unit/test_server_util.h"

namespace kiln::test {

inline const char* kCallA = R"(<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>)";
inline const char* kCallB = R"(<tool_call>{"arguments":{"city":"Paris"},"name":"get_weather"}</tool_call>)";

// A folder for the models of this test process (under the tests' temporary folder).
inline std::string model_dir() {
  static const std::string d = [] {
    std::string p = ::kiln::test::temp_dir() + "kiln_srvtpl_" + std::to_string(::getpid());
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

// The fixture with `tmpl` as tokenizer.chat_template ("": none); tool_model: the two tool-call tokens forced.
inline std::string make_model(const std::string& name, const std::string& tmpl, bool tool_model) {
  const std::string out = model_dir() + "/" + name;
  auto src = gguf::File::open(test::data_path("models/fixture-llama-f16.gguf"));
  EXPECT_TRUE(src.is_ok()) << src.status().to_string();
  gguf::Writer w;
  for (const auto& kv : src->kvs()) {
    if (kv.key == "tokenizer.chat_template") continue;
    gguf::Value v = kv.value;
    if (tool_model && kv.key == "tokenizer.ggml.tokens") {
      auto& a = std::get<gguf::Array>(v.v);
      a.items[993] = std::string(kCallA);
      a.items[994] = std::string(kCallB);
    }
    w.set(kv.key, v);
  }
  if (!tmpl.empty()) w.set("tokenizer.chat_template", tmpl);
  static std::vector<uint16_t> head;  // must outlive write()
  for (const auto& t : src->tensors()) {
    if (tool_model && t.name == "output.weight") {
      const int64_t n_embd = t.ne[0], n_vocab = t.ne[1];
      head.assign(static_cast<size_t>(n_embd * n_vocab), 0);
      const uint16_t* row0 = reinterpret_cast<const uint16_t*>(t.data);
      for (int64_t k = 0; k < n_embd; ++k) {
        head[993 * n_embd + k] = row0[k];
        head[994 * n_embd + k] = static_cast<uint16_t>(row0[k] ^ 0x8000);  // -w
      }
      EXPECT_TRUE(w.add_tensor(t.name, t.type, {n_embd, n_vocab}, head.data()).is_ok());
      continue;
    }
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok());
  }
  EXPECT_TRUE(w.write(out).is_ok());
  return out;
}

// The fixture with tokens 990, 991, 992 renamed to Qwen's fill-in-the-middle markers (the vocabulary then has FIM
// prefix, suffix and middle tokens: /infill is served).
inline std::string make_fim_model(const std::string& name) {
  const std::string out = model_dir() + "/" + name;
  auto src = gguf::File::open(test::data_path("models/fixture-llama-f16.gguf"));
  EXPECT_TRUE(src.is_ok()) << src.status().to_string();
  gguf::Writer w;
  for (const auto& kv : src->kvs()) {
    gguf::Value v = kv.value;
    if (kv.key == "tokenizer.ggml.tokens") {
      auto& a = std::get<gguf::Array>(v.v);
      a.items[990] = std::string("<|fim_prefix|>");
      a.items[991] = std::string("<|fim_suffix|>");
      a.items[992] = std::string("<|fim_middle|>");
    }
    w.set(kv.key, v);
  }
  for (const auto& t : src->tensors())
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok());
  EXPECT_TRUE(w.write(out).is_ok());
  return out;
}

}  // namespace kiln::test
