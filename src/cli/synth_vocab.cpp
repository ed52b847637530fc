// Tokenizer metadata for `kiln synth`: a built-in byte-level BPE, or a copy of another GGUF's tokenizer padded to
// the model's vocabulary size.
#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "cli/synth.h"

namespace kiln::cli::synth {
namespace {

constexpr int kTokenNormal = 1, kTokenControl = 3;
constexpr size_t kMaxMerges = 384;

// The merges are learned from this text (word-internal pairs, most frequent first).
constexpr std::string_view kTrainingText =
    "The kiln is a furnace that turns soft clay into hard stone. Potters shape the clay on a wheel, let the pieces "
    "dry in the shade, and then load them into the kiln. The fire starts slowly, because water that is still "
    "inside the clay would turn to steam and crack the walls of a pot. After a few hours the temperature rises "
    "and the clay changes its nature: the minerals melt together and the body becomes strong. Many potters fire "
    "their work twice. The first firing makes bisque, which is porous and easy to glaze; the second firing melts "
    "the glaze into glass. The colors of the glaze depend on the metals in it and on the air inside the kiln. "
    "With plenty of oxygen, copper gives green; without it, copper turns red. A good potter watches the flame, "
    "listens to the fire, and learns from every firing. When the kiln cools down, the door is opened and the "
    "finished pieces are taken out, one by one, and there is always a surprise waiting inside. In 1998 there "
    "were 365 kilns in the valley; today there are more than 2000, and the number is still growing.\n"
    "Language models read text as tokens. A tokenizer splits the words into pieces that it has seen before, and "
    "the model predicts the next piece from the previous ones. The pieces are learned from a large amount of "
    "text: the most frequent pairs of symbols are merged first, then the pairs of those pairs, and so on, until "
    "the vocabulary is full. Common words become single tokens, while rare words are spelled with several "
    "smaller pieces. Every byte has a token of its own, so any text can be encoded, even text in a language the "
    "tokenizer has never seen.";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// GPT-2's byte-to-unicode table: printable bytes map to themselves, the other 68 to U+0100 onwards. `order` lists
// the bytes in GPT-2's vocabulary order (the printable ones first).
struct ByteMap {
  std::string of[256];
  std::vector<int> order;
  ByteMap() {
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff); };
    for (int b = 0; b < 256; ++b)
      if (printable(b)) order.push_back(b);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) {
        of[b] = utf8(static_cast<uint32_t>(b));
      } else {
        of[b] = utf8(256u + static_cast<uint32_t>(n++));
        order.push_back(b);
      }
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Splits text GPT-2 style into words: an optional leading space plus a run of letters, of digits or of other
// non-space bytes; other whitespace stands alone.
std::vector<std::string> split_words(std::string_view text) {
  auto cls = [](unsigned char c) { return std::isalpha(c) ? 0 : std::isdigit(c) ? 1 : std::isspace(c) ? 2 : 3; };
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && cls(static_cast<unsigned char>(text[j + 1])) != 2) ++j;
    const int c = cls(static_cast<unsigned char>(text[j]));
    ++j;
    if (c != 2)
      while (j < text.size() && cls(static_cast<unsigned char>(text[j])) == c) ++j;
    words.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

struct LearnedBpe {
  std::vector<std::string> merges;      // "A B"
  std::vector<std::string> new_tokens;  // merge results, first occurrence order
};

LearnedBpe learn_bpe() {
  const ByteMap& bm = byte_map();
  std::map<std::string, int> freq;
  for (const std::string& w : split_words(kTrainingText)) freq[w]++;
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (auto& [w, n] : freq) {
    std::vector<std::string> syms;
    for (unsigned char c : w) syms.push_back(bm.of[c]);
    words.push_back({std::move(syms), n});
  }
  LearnedBpe out;
  std::set<std::string> seen;
  while (out.merges.size() < kMaxMerges) {
    std::map<std::pair<std::string, std::string>, int> pairs;  // ordered: ties go to the smallest pair
    for (auto& [syms, n] : words)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    if (pairs.empty()) break;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [a, b] = best->first;
    const std::string ab = a + b;
    for (auto& [syms, n] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          merged.push_back(ab);
          ++i;
        } else {
          merged.push_back(syms[i]);
        }
      }
      syms = std::move(merged);
    }
    out.merges.push_back(a + " " + b);
    if (seen.insert(ab).second) out.new_tokens.push_back(ab);
  }
  return out;
}

const LearnedBpe& learned() {
  static const LearnedBpe l = learn_bpe();
  return l;
}

// "[PAD<id>]", made unique against `taken` should a vocabulary already hold that text.
std::string pad_token(int64_t id, const std::unordered_set<std::string>& taken) {
  std::string s = "[PAD" + std::to_string(id) + "]";
  while (taken.count(s)) s.insert(s.size() - 1, "_");
  return s;
}

// o200k_harmony's special tokens from id 199998 on ("": "<|reserved_ID|>"); its ids 200021..201087 are reserved too.
constexpr int64_t kHarmonyFirstId = 199998, kHarmonySpecials = 201088 - kHarmonyFirstId;
constexpr const char* kHarmonyNamed[] = {
    "<|startoftext|>", "<|endoftext|>", "", "", "<|return|>", "<|constrain|>", "", "<|channel|>", "<|start|>",
    "<|end|>", "<|message|>", "", "", "", "<|call|>", "", "", "", "", "", "<|endofprompt|>"};
constexpr int64_t kHarmonyBos = 0, kHarmonyPad = 1, kHarmonyEos = 4;  // <|startoftext|>, <|endoftext|>, <|return|>

int64_t bpe_size() { return 256 + static_cast<int64_t>(learned().new_tokens.size()); }

}  // namespace

int64_t builtin_vocab_size(bool harmony) {
  return bpe_size() + (harmony ? static_cast<int64_t>(std::size(kHarmonyNamed)) : 1);
}

Status add_builtin_vocab(gguf::Writer& w, int64_t n_vocab, bool harmony) {
  if (n_vocab < builtin_vocab_size(harmony))
    return make_error(ErrorCode::kInvalidArgument, "--n-vocab %lld is smaller than the built-in vocabulary (%lld tokens)",
                      static_cast<long long>(n_vocab), static_cast<long long>(builtin_vocab_size(harmony)));
  const ByteMap& bm = byte_map();
  const LearnedBpe& bpe = learned();
  gguf::Array tokens, types, merges;
  tokens.type = gguf::ValueType::STRING;
  types.type = gguf::ValueType::I32;
  merges.type = gguf::ValueType::STRING;
  std::unordered_set<std::string> taken;
  auto add = [&](std::string s, int type) {
    taken.insert(s);
    tokens.items.emplace_back(std::move(s));
    types.items.emplace_back(int32_t{type});
  };
  for (int b : bm.order) add(bm.of[b], kTokenNormal);
  for (const std::string& t : bpe.new_tokens) add(t, kTokenNormal);
  auto size = [&] { return static_cast<int64_t>(tokens.items.size()); };
  for (const std::string& m : bpe.merges) merges.items.emplace_back(m);
  w.set("tokenizer.ggml.model", "gpt2");
  if (!harmony) {
    const auto eot = static_cast<uint32_t>(size());
    add("<|endoftext|>", kTokenControl);
    while (size() < n_vocab) add(pad_token(size(), taken), kTokenControl);
    w.set("tokenizer.ggml.pre", "gpt-2");
    w.set("tokenizer.ggml.bos_token_id", eot);
    w.set("tokenizer.ggml.eos_token_id", eot);
  } else {
    // The special block ends the vocabulary as in o200k_harmony (at its ids when n_vocab is 201088), shortened to
    // what fits above the BPE tokens; pads fill the gap below it.
    const int64_t n_special = std::min(kHarmonySpecials, n_vocab - bpe_size());
    const int64_t first = n_vocab - n_special;
    while (size() < first) add(pad_token(size(), taken), kTokenControl);
    for (int64_t k = 0; k < n_special; ++k) {
      const bool named = k < static_cast<int64_t>(std::size(kHarmonyNamed)) && *kHarmonyNamed[k];
      add(named ? kHarmonyNamed[k] : "<|reserved_" + std::to_string(kHarmonyFirstId + k) + "|>", kTokenControl);
    }
    w.set("tokenizer.ggml.pre", "gpt-4o");
    w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(first + kHarmonyBos));
    w.set("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(first + kHarmonyEos));
    w.set("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(first + kHarmonyPad));
  }
  w.set("tokenizer.ggml.tokens", std::move(tokens));
  w.set("tokenizer.ggml.token_type", std::move(types));
  w.set("tokenizer.ggml.merges", std::move(merges));
  w.set("tokenizer.ggml.add_bos_token", false);
  return Status::ok();
}

Result<int64_t> vocab_size(const gguf::File& vocab) {
  const gguf::Value* t = vocab.find("tokenizer.ggml.tokens");
  if (!t || !t->is_array() || t->arr().type != gguf::ValueType::STRING)
    return make_error(ErrorCode::kInvalidFile, "%s: no tokenizer.ggml.tokens string array (not a vocabulary GGUF)",
                      vocab.path().c_str());
  return static_cast<int64_t>(t->arr().items.size());
}

Status copy_vocab(gguf::Writer& w, const gguf::File& vocab, int64_t n_vocab) {
  KILN_ASSIGN_OR_RETURN(const int64_t n_have, vocab_size(vocab));
  if (n_have > n_vocab)
    return make_error(ErrorCode::kInvalidArgument, "vocabulary %s has %lld tokens, more than the model's %lld",
                      vocab.path().c_str(), static_cast<long long>(n_have), static_cast<long long>(n_vocab));
  std::unordered_set<std::string> taken;
  for (const gguf::Value& t : vocab.find("tokenizer.ggml.tokens")->arr().items) taken.insert(t.str());
  for (const gguf::KeyValue& kv : vocab.kvs()) {
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    gguf::Value v = kv.value;
    const bool per_token = kv.key == "tokenizer.ggml.tokens" || kv.key == "tokenizer.ggml.scores" ||
                           kv.key == "tokenizer.ggml.token_type";
    if (per_token && v.is_array()) {
      gguf::Array& a = std::get<gguf::Array>(v.v);
      if (static_cast<int64_t>(a.items.size()) != n_have)
        return make_error(ErrorCode::kInvalidFile, "%s: %s has %zu items for %lld tokens", vocab.path().c_str(),
                          kv.key.c_str(), a.items.size(), static_cast<long long>(n_have));
      for (int64_t id = n_have; id < n_vocab; ++id) {
        switch (a.type) {
          case gguf::ValueType::STRING: a.items.emplace_back(pad_token(id, taken)); break;
          case gguf::ValueType::F32: a.items.emplace_back(-1e4f); break;  // pads never win a score comparison
          case gguf::ValueType::I32: a.items.emplace_back(int32_t{kTokenControl}); break;
          case gguf::ValueType::U32: a.items.emplace_back(uint32_t{kTokenControl}); break;
          default:
            return make_error(ErrorCode::kUnsupported, "%s: cannot pad %s (array of %s)", vocab.path().c_str(),
                              kv.key.c_str(), gguf::value_type_name(a.type));
        }
      }
    }
    w.set(kv.key, std::move(v));
  }
  return Status::ok();
}

}  // namespace kiln::cli::synth
