// SentencePiece-style BPE by score (tokenizer.ggml.model "llama"), as llama.cpp runs it: the text (spaces already
// escaped to U+2581) is cut into UTF-8 characters (by lead byte), adjacent pairs whose concatenation is a token
// are merged highest score first (ties: leftmost), and a final piece that is not a token is written as byte
// tokens <0xNN>.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kiln::tok {

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

}  // namespace kiln::tok
