// Chat templates: detection by markers (on the templates the fixture vocabularies carry and on the reference
// templates of each format) and the exact prompt text each format renders.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "template/chat_formats.h"

namespace {

using kiln::ChatFormat;
using kiln::ChatMessage;

const std::vector<ChatMessage> kConv = {
    {"system", "Be brief."}, {"user", " Hi there \n"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

TEST(ChatTemplate, DetectsByMarkers) {
  struct Case {
    const char* src;
    ChatFormat f;
  };
  const Case cases[] = {
      {"{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}",
       ChatFormat::kChatML},
      {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", ChatFormat::kLlama3},
      {"{{ bos_token }}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}",
       ChatFormat::kMistral},
      {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' }}", ChatFormat::kLlama2},
      {"{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}", ChatFormat::kGemma},
      {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\\n' + "
       "message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}",
       ChatFormat::kPhi3},
  };
  for (const auto& c : cases) {
    auto f = kiln::detect_chat_format(c.src);
    ASSERT_TRUE(f.is_ok()) << c.src;
    EXPECT_EQ(*f, c.f) << c.src;
  }
  auto bad = kiln::detect_chat_format("{{ messages }}");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("<|im_start|>"), std::string::npos);
  EXPECT_FALSE(kiln::detect_chat_format("").is_ok());
}

TEST(ChatTemplate, Names) {
  for (ChatFormat f : {ChatFormat::kLlama3, ChatFormat::kChatML, ChatFormat::kMistral, ChatFormat::kGemma,
                       ChatFormat::kPhi3, ChatFormat::kLlama2}) {
    auto back = kiln::chat_format_from_name(kiln::chat_format_name(f));
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(*back, f);
  }
  EXPECT_FALSE(kiln::chat_format_from_name("vicuna").is_ok());
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kLlama3, kConv, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(std::string(kiln::chat_format_bos_text(ChatFormat::kLlama3)), "<|begin_of_text|>");
}

TEST(ChatTemplate, ChatML) {
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kChatML, kConv, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there \n<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kChatML, {{"user", "x"}}, true),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Mistral) {
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kMistral, kConv, true),
            "<s>[INST] Be brief.\n\n Hi there \n [/INST]Hello!</s>[INST] 2+2? [/INST]");
}

TEST(ChatTemplate, Gemma) {
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kGemma, kConv, true),
            "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, Phi3) {
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kPhi3, kConv, true),
            "<s><|system|>\nBe brief.<|end|>\n<|user|>\n Hi there \n<|end|>\n<|assistant|>\n"
            "Hello!<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kLlama2, kConv, true),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
  EXPECT_EQ(kiln::apply_chat_template(ChatFormat::kLlama2, {{"user", "q"}}, true), "<s>[INST] q [/INST]");
}

}  // namespace
