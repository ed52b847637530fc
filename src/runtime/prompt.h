// Prompt policy, written once for run, chat, perplexity and the server: when a BOS token goes in front, and how a
// conversation becomes tokens.
//   - BOS: added when the tokenizer asks for it (tokenizer.ggml.add_bos_token), the model has one, the caller did
//     not turn it off (--no-bos), and the text does not already start with it (a chat template that writes
//     bos_token itself, or a prompt that spells it out with special-token parsing on).
//   - Text prompts are encoded with special-token parsing on (as llama-cli); perplexity turns it off.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool add_bos = true,
                                   bool parse_special = true);
// The conversation rendered with the chat format, then encode_prompt (BOS not doubled when the format writes it).
std::vector<int32_t> encode_chat(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt = true);

}  // namespace kiln
