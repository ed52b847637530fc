#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "tokenizer/unicode.h"

namespace kiln::tok {

namespace {

// The regexes come from the models' tokenizer.json files (as llama.cpp carries them, with (?i:...) groups already
// expanded into explicit case classes).
const char* const kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const char* const kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o (o200k): tokenizer.json's case-aware letter runs with (?i:...) contractions, as llama.cpp rewrites them
// for its regex engine: an "upper" letter is a letter other than a-z, a "lower" one a letter other than A-Z.
const char* const kGpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek's letter class (the scripts with case), written as code point ranges.
const char* const kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
const char* const kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

struct Group {
  const char* group;
  std::vector<const char*> names;  // tokenizer.ggml.pre values
  std::vector<std::string> regexes;
  bool ignore_merges = false;
  bool force_add_bos = false;
};

const std::vector<Group>& groups() {
  static const std::vector<Group> g = {
      {"default", {"default", ""},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
      {"llama3",
       {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
       {kLlama3}, /*ignore_merges=*/true, /*force_add_bos=*/true},
      {"dbrx", {"dbrx", "smaug-bpe"}, {kLlama3}},
      {"chatglm4", {"glm4", "chatglm-bpe"}, {kLlama3}},
      {"deepseek-llm", {"deepseek-llm"},
       {R"([\r\n])", kDeepseekLetters, R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", kCjk, R"(\p{N}+)"}},
      {"deepseek-coder", {"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {"deepseek-v3", {"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"falcon", {"falcon"},
       {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {"starcoder",
       {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva", "mellum2"},
       {R"(\p{N})", kGpt2}},
      {"gpt2",
       {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "exaone4", "mpt", "olmo", "jais", "trillion", "granite-docling", "jina-v1-en", "jina-v2-code",
        "roberta-bpe"},
       {kGpt2}},
      {"qwen2", {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2"}, {kQwen2}},
      {"qwen35", {"qwen35"}, {kQwen35}},
      {"gpt-4o", {"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
  };
  return g;
}

// \s as a class body: the Unicode White_Space code points (\t..\r, U+0085 and the Z categories).
constexpr const char* kSpaceBody = R"(\t-\r\x{85}\p{Z})";
// "(?:" + a look-ahead refusing the non-ASCII White_Space code points; closed with ")" after the guarded class.
constexpr const char* kNonAsciiSpaceGuard = R"((?:(?![\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]))";

}  // namespace

Result<PreTokenizerSpec> pretokenizer_spec(const std::string& pre) {
  if (pre == "gemma4" || pre == "granite-embed-multi-311m") {
    PreTokenizerSpec s;
    s.name = "gemma4";
    s.newline_runs_only = true;
    s.byte_encode = false;
    s.escape_whitespace = true;
    return s;
  }
  for (const auto& g : groups()) {
    for (const char* n : g.names) {
      if (pre == n) {
        PreTokenizerSpec s;
        s.name = g.group;
        s.regexes = g.regexes;
        s.ignore_merges = g.ignore_merges;
        s.force_add_bos = g.force_add_bos;
        return s;
      }
    }
  }
  return make_error(ErrorCode::kUnsupported, "tokenizer.ggml.pre: unknown pre-tokenizer '%s'", pre.c_str());
}

namespace {

// Whether the class body starting at re[i] (just after '[') up to its ']' names a code point >= 0x80, either as
// a literal byte or as \x{HEX}.
bool class_has_non_ascii(const std::string& re, size_t i) {
  bool non_ascii = false;
  if (i < re.size() && re[i] == '^') ++i;
  if (i < re.size() && re[i] == ']') ++i;  // a leading ']' is a member
  for (; i < re.size() && re[i] != ']'; ++i) {
    if (static_cast<unsigned char>(re[i]) >= 0x80) non_ascii = true;
    if (re[i] == '\\' && i + 1 < re.size()) {
      if (re[i + 1] == 'x' && i + 2 < re.size() && re[i + 2] == '{') {
        const size_t close = re.find('}', i + 3);
        if (close != std::string::npos && std::strtoul(re.substr(i + 3, close - i - 3).c_str(), nullptr, 16) >= 0x80)
          non_ascii = true;
      }
      ++i;
    }
  }
  return non_ascii;
}

}  // namespace

std::string rewrite_regex_for_pcre2(const std::string& re) {
  // llama.cpp matches a regex without \p{..} classes against text in which every non-ASCII whitespace code point
  // was replaced by U+000B, so there a class of non-ASCII members never matches such whitespace (e.g. DeepSeek's
  // [\x{3000}-\x{3002}] does not match U+3000): those classes get a guard.
  const bool guard_classes = re.find("\\p{") == std::string::npos;
  std::string out;
  out.reserve(re.size() + 64);
  bool in_class = false, guarded = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char e = re[i + 1];
      if (e == 's') {
        if (in_class) {
          out += kSpaceBody;
        } else {
          out += '[';
          out += kSpaceBody;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kSpaceBody;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      guarded = guard_classes && class_has_non_ascii(re, i + 1);
      if (guarded) out += kNonAsciiSpaceGuard;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];
      continue;
    }
    if (c == ']' && in_class) {
      in_class = false;
      out += c;
      if (guarded) out += ')';
      guarded = false;
      continue;
    }
    out += c;
  }
  return out;
}

struct PreTokenizer::Impl {
  struct Regex {
    pcre2_code* code = nullptr;
    ~Regex() {
      if (code) pcre2_code_free(code);
    }
  };
  bool newline_runs_only = false;
  std::vector<std::unique_ptr<Regex>> regexes;
};

Result<std::shared_ptr<const PreTokenizer>> PreTokenizer::get(const PreTokenizerSpec& spec) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const PreTokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(spec.name); it != cache.end()) return it->second;

  auto impl = std::make_shared<Impl>();
  impl->newline_runs_only = spec.newline_runs_only;
  for (const auto& src : spec.regexes) {
    const std::string re = rewrite_regex_for_pcre2(src);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto rx = std::make_unique<Impl::Regex>();
    rx->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (!rx->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return make_error(ErrorCode::kInternal, "pre-tokenizer '%s': regex '%s' does not compile at offset %zu: %s",
                        spec.name.c_str(), re.c_str(), static_cast<size_t>(err_off),
                        reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(rx->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
    impl->regexes.push_back(std::move(rx));
  }
  auto p = std::make_shared<const PreTokenizer>(std::move(impl));
  cache.emplace(spec.name, p);
  return std::shared_ptr<const PreTokenizer>(p);
}

namespace {

struct MatchData {
  pcre2_match_data* md;
  MatchData() : md(pcre2_match_data_create(4, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
};

// Cuts [piece.begin, piece.end) of `text` with `code`: matches and the gaps between them, in order.
void split_piece(const pcre2_code* code, std::string_view text, Span piece, pcre2_match_data* md,
                 std::vector<Span>* out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
  const size_t len = piece.end - piece.begin;
  size_t pos = 0, last = 0;
  while (pos < len) {
    const int rc = pcre2_match(code, subject, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // no match (or a matcher limit: the rest stays one piece)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t mb = ov[0], me = ov[1];
    if (me == mb) {  // empty match: not a piece; step over one code point
      pos = mb + utf8_len(static_cast<uint8_t>(text[piece.begin + mb]));
      continue;
    }
    if (mb > last) out->push_back({piece.begin + last, piece.begin + mb});
    out->push_back({piece.begin + mb, piece.begin + me});
    last = pos = me;
  }
  if (last < len) out->push_back({piece.begin + last, piece.end});
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<Span>* words) const {
  words->clear();
  if (text.empty()) return;
  if (impl_->newline_runs_only) {
    size_t i = 0;
    while (i < text.size()) {
      const bool nl = text[i] == '\n';
      const size_t start = i;
      while (i < text.size() && (text[i] == '\n') == nl) ++i;
      words->push_back({start, i});
    }
    return;
  }
  thread_local MatchData md;
  std::vector<Span> cur{{0, text.size()}}, next;
  for (const auto& rx : impl_->regexes) {
    next.clear();
    next.reserve(cur.size() * 2);
    for (const Span& piece : cur) split_piece(rx->code, text, piece, md.md, &next);
    cur.swap(next);
  }
  *words = std::move(cur);
}

}  // namespace kiln::tok
