// Tokenizer: the vocabulary plus one of the three algorithms, behind the public interface of tokenizer.h.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"
#include "tokenizer/wordpiece.h"

namespace kiln {

namespace {

using tok::Fragment;
using tok::Vocab;
using tok::VocabKind;

std::string unescape_whitespace(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Byte-level BPE token text -> bytes. A code point outside the 256-byte alphabet is written as llama.cpp does
// ("[UNK_BYTE_0x<hex>" + text + "]").
std::string decode_byte_level(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const uint32_t cp = decode_utf8(text, &pos);
    const int b = tok::unicode_to_byte(cp);
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out += "[UNK_BYTE_0x";
      const std::string u = cp_to_utf8(cp);
      (void)start;
      for (unsigned char c : u) out += strprintf("%02x", c);
      out += text + "]";
    }
  }
  return out;
}

class TokenizerImpl final : public Tokenizer {
 public:
  TokenizerImpl(Vocab v) : v_(std::move(v)) { chat_template_ = v_.chat_template; }

  Status init(const gguf::File& file) {
    if (v_.kind == VocabKind::kBpe) {
      KILN_ASSIGN_OR_RETURN(bpe_, tok::BpeModel::create(file, v_));
    }
    // Pieces with render_special on, computed once (llama.cpp's token-to-piece cache).
    pieces_.resize(v_.text.size());
    for (size_t i = 0; i < v_.text.size(); ++i) pieces_[i] = make_piece(static_cast<int32_t>(i));
    return Status::ok();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    std::vector<int32_t> out;
    std::vector<Fragment> frags;
    tok::partition_special(v_, text, parse_special, &frags);
    switch (v_.kind) {
      case VocabKind::kSpm: {
        if (add_special && v_.add_bos && v_.bos >= 0) out.push_back(v_.bos);
        bool prev_special = true;  // the input start counts as "after a special token"
        std::string buf;
        for (const Fragment& f : frags) {
          if (f.token >= 0) {
            out.push_back(f.token);
            prev_special = true;
            continue;
          }
          buf.clear();
          if (v_.add_space_prefix && prev_special) buf += "\xE2\x96\x81";
          for (char c : text.substr(f.begin, f.end - f.begin)) {
            if (c == ' ') buf += "\xE2\x96\x81";
            else buf += c;
          }
          tok::spm_encode(v_, buf, &out);
          prev_special = false;
        }
        if (add_special && v_.add_eos && v_.eos >= 0) out.push_back(v_.eos);
        break;
      }
      case VocabKind::kBpe: {
        if (add_special && v_.add_bos && v_.bos >= 0) out.push_back(v_.bos);
        for (const Fragment& f : frags) {
          if (f.token >= 0) out.push_back(f.token);
          else bpe_->encode(text.substr(f.begin, f.end - f.begin), &out);
        }
        if (add_special && v_.add_eos && v_.eos >= 0) out.push_back(v_.eos);
        break;
      }
      case VocabKind::kWpm: {
        // WordPiece: BOS ([CLS]) and SEP ([SEP]) whenever add_special, as llama.cpp does.
        if (add_special && v_.bos >= 0) out.push_back(v_.bos);
        for (const Fragment& f : frags) {
          if (f.token >= 0) out.push_back(f.token);
          else tok::wordpiece_encode(v_, text.substr(f.begin, f.end - f.begin), &out);
        }
        if (add_special && v_.sep >= 0) out.push_back(v_.sep);
        break;
      }
    }
    return out;
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 0 || id >= n_vocab()) return {};
    if (!render_special && v_.has(id, tok::kAttrUnknown | tok::kAttrControl)) return {};
    return pieces_[id];
  }

  int32_t n_vocab() const override { return static_cast<int32_t>(v_.text.size()); }
  const std::string& token_text(int32_t id) const override {
    static const std::string empty;
    return id >= 0 && id < n_vocab() ? v_.text[id] : empty;
  }
  TokenType token_type(int32_t id) const override {
    return id >= 0 && id < n_vocab() ? v_.type[id] : TokenType::kUndefined;
  }
  int32_t bos() const override { return v_.bos; }
  int32_t eos() const override { return v_.eos; }
  FimTokens fim() const override {
    return FimTokens{v_.fim[0], v_.fim[1], v_.fim[2], v_.fim[3], v_.fim[4], v_.fim[5]};
  }
  bool add_bos() const override { return v_.add_bos; }
  bool add_eos() const override { return v_.add_eos; }
  int32_t sep() const override { return v_.sep; }
  bool add_sep() const override { return v_.add_sep; }
  bool is_eog(int32_t id) const override { return v_.eog.count(id) > 0; }
  const std::string& model_name() const override { return v_.model; }
  const std::string& pre_name() const override { return v_.pre; }
  bool strips_leading_space() const override { return v_.add_space_prefix; }

 private:
  // The piece of `id` with special tokens rendered (llama.cpp's token_to_piece with special = true).
  std::string make_piece(int32_t id) const {
    const std::string& t = v_.text[id];
    const uint32_t a = v_.attr[id];
    if (a & (tok::kAttrUnknown | tok::kAttrControl | tok::kAttrUserDefined)) return t;
    if (a & tok::kAttrNormal) {
      if (v_.kind != VocabKind::kBpe || v_.escape_whitespace) return unescape_whitespace(t);
      return decode_byte_level(t);
    }
    if (a & tok::kAttrByte) {
      const int b = v_.byte_value(id);
      return b >= 0 ? std::string(1, static_cast<char>(b)) : std::string();
    }
    return {};
  }

  Vocab v_;
  std::unique_ptr<tok::BpeModel> bpe_;
  std::vector<std::string> pieces_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::File& file) {
  KILN_ASSIGN_OR_RETURN(Vocab v, tok::load_vocab(file));
  auto t = std::make_unique<TokenizerImpl>(std::move(v));
  KILN_TRY(t->init(file).with_context(file.path()));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  bool strip = strips_leading_space();
  for (int32_t id : ids) {
    std::string p = token_to_piece(id, render_special);
    if (strip && !p.empty() && p[0] == ' ') p.erase(0, 1);
    strip = false;
    out += p;
  }
  return out;
}

void StreamDecoder::render_as_text(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  as_text_ = std::move(ids);
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id, render_special_ || std::binary_search(as_text_.begin(), as_text_.end(), id));
  const size_t hold = incomplete_utf8_tail(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace kiln
