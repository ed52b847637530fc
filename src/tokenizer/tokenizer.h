// Text <-> token ids from a GGUF vocabulary (tokenizer.ggml.* metadata), exact against llama.cpp.
//   model "gpt2"  -> byte-level BPE, pre-tokenized by the regexes of `tokenizer.ggml.pre` (PCRE2, UTF mode, JIT),
//                    merges applied by rank with a priority queue
//   model "llama" -> SentencePiece-style BPE by score, byte fallback <0xNN>, leading-space rule
//   model "bert"  -> WordPiece
//   model "gemma4"-> BPE by rank on raw UTF-8 with spaces as U+2581, split at newline runs, <0xNN> byte fallback
// Special (control / user-defined) tokens are matched in the text first when parse_special is on, never split.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "util/status.h"

namespace kiln {

enum class TokenType : int32_t {  // tokenizer.ggml.token_type values
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Reads tokenizer.ggml.* from the file; the error names the missing or malformed key.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& file);

  // add_special: add BOS/EOS as the model's add_bos_token/add_eos_token flags say.
  // parse_special: recognize special tokens written in the text (e.g. "<|im_start|>").
  // Invalid UTF-8 is not an error: bad bytes are encoded as themselves (byte tokens) / U+FFFD as llama.cpp does.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;

  // The bytes a token stands for in output text (byte-level decoded; "<0x0A>" -> "\n"; control tokens -> "" unless
  // render_special). May be an incomplete UTF-8 sequence: use StreamDecoder for streaming.
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  // Concatenated pieces; with a SentencePiece vocabulary (add_space_prefix) the first token's leading space is
  // dropped, as llama.cpp's detokenizer does. No clean-up of spaces before punctuation (that HF option loses text).
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;
  // Whether decode() drops the first token's leading space (the encoder added it: add_space_prefix).
  virtual bool strips_leading_space() const = 0;

  virtual int32_t n_vocab() const = 0;
  virtual const std::string& token_text(int32_t id) const = 0;  // the vocabulary string as stored
  virtual TokenType token_type(int32_t id) const = 0;
  virtual int32_t bos() const = 0;  // -1 when none
  virtual int32_t eos() const = 0;  // -1 when none
  virtual int32_t sep() const = 0;  // the separator of a text pair ([SEP] of WordPiece vocabularies); -1 when none
  virtual bool add_bos() const = 0;
  virtual bool add_eos() const = 0;
  virtual bool add_sep() const = 0;  // a text pair puts sep() between its texts (tokenizer.ggml.add_sep_token)
  // End of generation: EOS, EOT, <|im_end|>, <|eot_id|>, <end_of_turn>, ... as the vocabulary declares them.
  virtual bool is_eog(int32_t id) const = 0;
  // Fill-in-the-middle markers (-1: none): a vocabulary with prefix, suffix and middle supports infill.
  struct FimTokens {
    int32_t pre = -1, suf = -1, mid = -1, pad = -1, rep = -1, sep = -1;
  };
  virtual FimTokens fim() const = 0;
  virtual const std::string& model_name() const = 0;  // tokenizer.ggml.model
  virtual const std::string& pre_name() const = 0;    // tokenizer.ggml.pre
  const std::string& chat_template() const { return chat_template_; }

 protected:
  std::string chat_template_;
};

// Streaming detokenizer: push() returns only complete UTF-8 (never half a code point); flush() returns the rest
// (invalid trailing bytes become U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = false) : tok_(tok), render_special_(render_special) {}
  // Control tokens rendered as their text although render_special is off (a tool-call format's markers).
  void render_as_text(std::vector<int32_t> ids);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_;
  std::vector<int32_t> as_text_;  // sorted
  std::string pending_;
};

}  // namespace kiln
