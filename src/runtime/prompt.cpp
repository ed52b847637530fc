#include "runtime/prompt.h"

namespace kiln {

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool add_bos, bool parse_special) {
  std::vector<int32_t> ids = tok.encode(text, /*add_special=*/false, parse_special);
  if (add_bos && tok.add_bos() && tok.bos() >= 0 && (ids.empty() || ids[0] != tok.bos()))
    ids.insert(ids.begin(), tok.bos());
  return ids;
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  return encode_prompt(tok, apply_chat_template(format, messages, add_generation_prompt), /*add_bos=*/true,
                       /*parse_special=*/true);
}

}  // namespace kiln
