// The vocabulary as read from GGUF (tokenizer.ggml.*), with llama.cpp's derived per-token attributes, special
// ids, add-BOS/EOS defaults and end-of-generation set, plus the special-token partition of input text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln::tok {

// Token attributes (llama.cpp's llama_token_attr bits): the GGUF token type plus what kiln derives from the
// vocabulary (EOG tokens forced to control, "unused" control tokens, strip rules around special tokens).
enum Attr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,  // whitespace left of the token is dropped when it is matched in text
  kAttrRstrip = 1u << 8,  // whitespace right of the token is dropped
};

enum class VocabKind { kSpm, kBpe, kWpm };

struct Vocab {
  VocabKind kind = VocabKind::kBpe;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre as written ("" when absent; "gemma4" for model gemma4)

  std::vector<std::string> text;      // by id; empty strings replaced by "[EMPTY_<id>]" as llama.cpp does
  std::vector<float> score;           // by id (0 when the file has no scores)
  std::vector<TokenType> type;        // by id, as stored (kUndefined when absent)
  std::vector<uint32_t> attr;         // by id, Attr bits
  std::unordered_map<std::string_view, int32_t> to_id;  // views into `text`; duplicates: the last id wins
  size_t max_token_len = 0;

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  // Fill-in-the-middle markers (tokenizer.ggml.fim_*_token_id, else found by their text): prefix, suffix,
  // middle, pad, repo, file separator; -1 when the vocabulary has none.
  int32_t fim[6] = {-1, -1, -1, -1, -1, -1};
  bool add_bos = false, add_eos = false, add_sep = false;
  bool add_space_prefix = false;   // SPM: a space is prepended to text that starts the input or follows a special
  bool escape_whitespace = false;  // ' ' <-> U+2581 (SPM always; BPE gemma4)
  bool wpm_lowercase = true;      // WordPiece normalizer (tokenizer.ggml.normalizer.lowercase)
  bool wpm_strip_accents = true;  // (tokenizer.ggml.normalizer.strip_accents, default: = lowercase)
  std::unordered_set<int32_t> eog;
  // Control / user-defined / unknown tokens, longest text first (ties by id): the special-token partition order.
  std::vector<int32_t> specials;
  std::string chat_template;

  int32_t find(std::string_view s) const {
    auto it = to_id.find(s);
    return it == to_id.end() ? -1 : it->second;
  }
  bool has(int32_t id, uint32_t a) const { return (attr[id] & a) != 0; }
  // The byte a <0xNN> byte token stands for (-1 when `id` is not a well-formed byte token).
  int byte_value(int32_t id) const;
  // The token for a raw byte: "<0xNN>", else the one-byte string (llama.cpp's byte_to_token); -1 when neither.
  int32_t byte_token(uint8_t b) const;
};

// Loads the vocabulary; errors name the missing or malformed key.
Result<Vocab> load_vocab(const gguf::File& file);

// A piece of input text: raw text [begin, end) or one special token.
struct Fragment {
  int32_t token;  // -1 for raw text
  size_t begin, end;
};

// Splits `text` at special tokens exactly as llama.cpp's tokenizer_st_partition: for each special token in
// `specials` order, every remaining raw fragment is cut at its non-overlapping occurrences (left to right).
// Control and unknown tokens take part only when parse_special; user-defined tokens always do.
void partition_special(const Vocab& vocab, std::string_view text, bool parse_special, std::vector<Fragment>* out);

}  // namespace kiln::tok
