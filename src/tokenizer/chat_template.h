// Chat templates: the model's tokenizer.chat_template (Jinja source) is matched to one of the built-in formats
// by its distinctive markers; kiln does not run Jinja.
#pragma once

#include <string>
#include <vector>

#include "util/status.h"

namespace kiln {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFormat { kLlama3, kChatML, kMistral, kGemma, kPhi3, kLlama2 };

// Detects the format from the template source; error (naming what was looked for) when none matches.
Result<ChatFormat> detect_chat_format(const std::string& template_source);
// "llama3", "chatml", ... (for --chat-template NAME)
Result<ChatFormat> chat_format_from_name(const std::string& name);
const char* chat_format_name(ChatFormat f);

// The prompt text (special tokens written out, to be encoded with parse_special on). add_generation_prompt
// appends the assistant header so the model answers next.
std::string apply_chat_template(ChatFormat f, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace kiln
