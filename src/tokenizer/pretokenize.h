// BPE pre-tokenizers: the text is cut into words by a sequence of regexes, as llama.cpp does it: each regex is
// applied to every piece left by the previous one, and both its matches and the text between them become pieces
// (so no byte is ever dropped). Regexes run in PCRE2 (UTF + UCP, JIT when available), compiled once per process
// and shared by every tokenizer using the same pre-tokenizer.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace kiln::tok {

struct Span {
  size_t begin, end;  // byte offsets, end exclusive
};

// What a `tokenizer.ggml.pre` name implies besides its regexes (llama.cpp's per-name settings).
struct PreTokenizerSpec {
  std::string name;                  // canonical group name ("llama3", "gpt2", ...)
  std::vector<std::string> regexes;  // as the tokenizer writes them (before rewrite_regex_for_pcre2)
  bool newline_runs_only = false;    // split into runs of '\n' / runs of anything else, no regex (gemma4)
  bool byte_encode = true;           // GPT-2 byte-level symbols (false: raw UTF-8 with <0xNN> byte fallback)
  bool escape_whitespace = false;    // ' ' -> U+2581 before splitting (gemma4)
  bool ignore_merges = false;        // a word that is itself a token is emitted whole (llama3)
  bool force_add_bos = false;        // add_bos defaults to true for this pre-tokenizer
};

// Looks up a tokenizer.ggml.pre value; an unknown name is kUnsupported, naming it.
Result<PreTokenizerSpec> pretokenizer_spec(const std::string& pre);

class PreTokenizer {
 public:
  // Compiles (once per process, cached by group name) the regexes of `spec`.
  static Result<std::shared_ptr<const PreTokenizer>> get(const PreTokenizerSpec& spec);

  // Splits `text` (valid UTF-8, see normalize_utf8) into word spans that cover it entirely, in order.
  void split(std::string_view text, std::vector<Span>* words) const;

  struct Impl;
  explicit PreTokenizer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

// Rewrites a tokenizer regex for PCRE2: \s and \S become explicit sets of the Unicode White_Space code points
// (PCRE2 10.42's \s in UCP mode misses U+0085, which llama.cpp and the HF tokenizers treat as space).
std::string rewrite_regex_for_pcre2(const std::string& re);

}  // namespace kiln::tok
