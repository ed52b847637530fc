// WordPiece (tokenizer.ggml.model "bert"), as llama.cpp runs it: BERT normalization (lowercase, accents stripped
// to the first code point of their NFD form, control characters dropped), split at whitespace, punctuation,
// ASCII symbols and CJK ideographs, then each word prefixed with U+2581 and cut greedily into the longest tokens;
// a word that cannot be cut entirely becomes [UNK].
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kiln::tok {

void wordpiece_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

}  // namespace kiln::tok
