// `kiln template`: renders to stdout, exits 1 with a located message on template errors (raise_exception too),
// reads tokenizer.chat_template and the BOS/EOS token text from a GGUF with -m, and --chat-template-file
// overrides the model's template.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "gguf/gguf.h"

namespace {

using kiln::test::run_kiln;

class TemplateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kiln::test::kiln_binary())) << "build kiln_cli first";
    dir_ = ::kiln::test::temp_dir() + "kiln_tplcli_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    write("msgs.json", R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])");
    write("tools.json", R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string dir_;
};

TEST_F(TemplateCli, RendersATemplateFile) {
  const std::string t = kiln::test::data_path("templates/Qwen-Qwen3-0.6B.jinja");
  auto r = run_kiln("template --chat-template-file '" + t + "' --messages '" + dir_ + "/msgs.json'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  r = run_kiln("template --chat-template-file '" + t + "' --messages '" + dir_ +
               "/msgs.json' --no-generation-prompt --chat-template-kwargs '{\"enable_thinking\": false}'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  r = run_kiln("template --chat-template-file '" + t + "' --messages '" + dir_ + "/msgs.json' --tools '" + dir_ +
               "/tools.json' --chat-template-kwargs '{\"enable_thinking\": false}'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}\n</tools>"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<think>\n\n</think>\n\n"), std::string::npos) << r.out;
}

TEST_F(TemplateCli, TemplateErrorsExitNonZeroWithThePosition) {
  // gemma-2 raises for a system message
  const std::string t = kiln::test::data_path("templates/google-gemma-2-2b-it.jinja");
  auto r = run_kiln("template --chat-template-file '" + t + "' --messages '" + dir_ + "/msgs.json'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("google-gemma-2-2b-it.jinja: line 1, column "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raise_exception: System role not supported"), std::string::npos) << r.err;
  const std::string bad = write("bad.jinja", "{% for m in messages %}\n{{ m.content + 1 }}\n{% endfor %}");
  r = run_kiln("template --chat-template-file '" + bad + "' --messages '" + dir_ + "/msgs.json'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("bad.jinja: line 2, column 4: can only concatenate str (not \"int\") to str"), std::string::npos) << r.err;
  r = run_kiln("template --chat-template-file '" + t + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--messages FILE is required"), std::string::npos) << r.err;
  r = run_kiln("template --chat-template-file '" + t + "' --messages '" + dir_ + "/msgs.json' --chat-template-kwargs '[1]'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("must be a JSON object"), std::string::npos) << r.err;
}

TEST_F(TemplateCli, ReadsTheTemplateAndSpecialTokensFromTheModel) {
  // A vocabulary-only GGUF (the llama-spm test vocabulary) with a chat template added.
  auto src = kiln::gguf::File::open(kiln::test::vocab_path("llama-spm"));
  ASSERT_TRUE(src.is_ok()) << src.status().to_string();
  kiln::gguf::Writer w;
  for (const auto& kv : src->kvs()) w.set(kv.key, kv.value);
  w.set("tokenizer.chat_template", std::string("{{ bos_token }}[{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}]{{ eos_token }}"));
  const std::string model = dir_ + "/vocab-with-template.gguf";
  ASSERT_TRUE(w.write(model).is_ok());
  auto r = run_kiln("template -m '" + model + "' --messages '" + dir_ + "/msgs.json'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[system:Be brief.;user:Hi;]</s>");
  r = run_kiln("template -m '" + model + "' --messages '" + dir_ + "/msgs.json' --bos '' --eos END");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "[system:Be brief.;user:Hi;]END");
  // --chat-template-file overrides the model's template; BOS/EOS still come from the model
  const std::string t = write("t.jinja", "{{ bos_token }}{{ messages|length }}");
  r = run_kiln("template -m '" + model + "' --chat-template-file '" + t + "' --messages '" + dir_ + "/msgs.json'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<s>2");
  // a model without a template says so
  r = run_kiln("template -m '" + kiln::test::vocab_path("llama-spm") + "' --messages '" + dir_ + "/msgs.json'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("has no tokenizer.chat_template"), std::string::npos) << r.err;
}

TEST_F(TemplateCli, ParsesAReply) {
  const std::string t = kiln::test::data_path("templates/Qwen-Qwen3-0.6B.jinja");
  const std::string reply = write("reply.txt", "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>");
  auto r = run_kiln("template --chat-template-file '" + t + "' --parse-reply '" + reply + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["content"], "");
  EXPECT_EQ(j["reasoning_content"], "weather");
  ASSERT_EQ(j["tool_calls"].size(), 1u);
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["tool_calls"][0]["function"]["arguments"], "{\"location\":\"Paris\"}");
}

}  // namespace
