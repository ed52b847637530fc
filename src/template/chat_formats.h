// The built-in chat formats (hand-written families: --chat-template NAME, and the fallback for a model file without
// a template, runtime/prompt.h). Pure string formatting; the model's own Jinja template runs in the interpreter
// (template.h). detect_chat_format matches a template's source to a family by its distinctive markers.
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
// appends the assistant header so the model answers next. Rendered as the reference Jinja template of each format
// renders it, including the BOS text where that template writes `bos_token` (see chat_format_bos_text: encode such
// a prompt with add_special off, or BOS appears twice). The reference templates:
//   llama3:  Meta-Llama-3-Instruct (bos_token first, content | trim, <|eot_id|> after each message)
//   chatml:  plain ChatML, no default system message, no BOS
//   mistral: Mistral-7B-Instruct v0.1 ("<s>[INST] u [/INST]a</s>"); a system message is put before the first user
//            message followed by "\n\n" (the template itself rejects system messages)
//   gemma:   gemma-it ("<bos><start_of_turn>user\n..."); system merged into the first user turn + "\n\n"
//   phi3:    the Phi-3-mini template shipped in its GGUF ("<s><|user|>\nu<|end|>\n<|assistant|>\n" after every
//            user message); a system message, which that template drops, is written "<|system|>\ns<|end|>\n"
//   llama2:  Llama-2-chat (<<SYS>> block in the first user turn, "<s>[INST] u [/INST] a </s>" per exchange)
// trim/strip remove ASCII whitespace only.
std::string apply_chat_template(ChatFormat f, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// The BOS text the format's template writes at the start ("" when it writes none).
const char* chat_format_bos_text(ChatFormat f);

}  // namespace kiln
