#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>

#include "tokenizer/pretokenize.h"

namespace kiln::tok {

namespace {

constexpr const char* kPrefix = "tokenizer.ggml.";

std::string key(const char* name) { return std::string(kPrefix) + name; }

uint32_t attr_from_type(int32_t t) {
  switch (t) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

// Optional special-token id: absent or negative -> keep `*id`; out of range -> keep `*id` (llama.cpp warns).
Status read_special_id(const gguf::File& f, const char* name, size_t n_vocab, int32_t* id) {
  const std::string k = key(name);
  const gguf::Value* v = f.find(k);
  if (!v) return Status::ok();
  if (!v->is_integer())
    return make_error(ErrorCode::kInvalidFile, "metadata key '%s' is %s, expected an integer token id", k.c_str(),
                      gguf::value_type_name(v->type()));
  KILN_ASSIGN_OR_RETURN(int64_t x, f.get_i64(k));
  if (x >= 0 && static_cast<uint64_t>(x) < n_vocab) *id = static_cast<int32_t>(x);
  return Status::ok();
}

bool contains(const std::string& s, std::initializer_list<const char*> subs) {
  for (const char* x : subs)
    if (s.find(x) != std::string::npos) return true;
  return false;
}

// End-of-generation texts (llama.cpp's list: EOS/EOT/EOM markers of the common chat formats).
bool is_eog_text(std::string_view t) {
  static const char* const kEog[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
      "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
      "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"),
      "[e~["};
  for (const char* e : kEog)
    if (t == e) return true;
  return false;
}

bool is_eot_text(std::string_view t) {
  static const char* const kEot[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
      "[EOT]", ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"), "<end_of_utterance>"};
  for (const char* e : kEot)
    if (t == e) return true;
  return false;
}

// Fill-in-the-middle markers: the first token (by id) of each kind is forced to control, as llama.cpp does.
const std::vector<std::vector<const char*>>& fim_texts() {
  static const std::vector<std::vector<const char*>> k = {
      {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
       "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"},
      {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>", "<SUF>",
       "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"},
      {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
       "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"},
      {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
      {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
      {"<|file_sep|>"},
  };
  return k;
}

}  // namespace

int Vocab::byte_value(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= text.size()) return -1;
  const std::string& t = text[id];
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

int32_t Vocab::byte_token(uint8_t b) const {
  static const char* hex = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
  const int32_t id = find(std::string_view(buf, 6));
  if (id >= 0) return id;
  const char c = static_cast<char>(b);
  return find(std::string_view(&c, 1));
}

Result<Vocab> load_vocab(const gguf::File& f) {
  Vocab v;
  KILN_ASSIGN_OR_RETURN(v.model, f.get_str(key("model")));
  KILN_ASSIGN_OR_RETURN(v.pre, f.get_str_or(key("pre"), ""));

  // Per-model defaults (llama.cpp's): special ids and flags before the file's own keys override them.
  if (v.model == "llama") {
    v.kind = VocabKind::kSpm;
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_space_prefix = true;
    v.escape_whitespace = true;
    v.add_bos = true;
  } else if (v.model == "bert") {
    v.kind = VocabKind::kWpm;
    v.bos = 101, v.unk = 100, v.sep = 102, v.pad = 0, v.mask = 103;
    v.add_bos = true;
    v.add_sep = true;
  } else if (v.model == "gpt2" || v.model == "gemma4") {
    v.kind = VocabKind::kBpe;
    if (v.model == "gpt2") v.bos = 11, v.eos = 11;
    if (v.model == "gemma4") v.pre = "gemma4";
    KILN_ASSIGN_OR_RETURN(PreTokenizerSpec spec, pretokenizer_spec(v.pre.empty() ? "default" : v.pre));
    v.escape_whitespace = spec.escape_whitespace;
    if (spec.force_add_bos) v.add_bos = true;
  } else {
    return make_error(ErrorCode::kUnsupported,
                      "tokenizer.ggml.model: tokenizer model '%s' is not supported (gpt2, gemma4, llama, bert are)",
                      v.model.c_str());
  }
  KILN_ASSIGN_OR_RETURN(v.add_space_prefix, f.get_bool_or(key("add_space_prefix"), v.add_space_prefix));

  KILN_ASSIGN_OR_RETURN(v.text, f.get_str_array(key("tokens")));
  const size_t n = v.text.size();
  if (n == 0) return make_error(ErrorCode::kInvalidFile, "metadata key '%s' is an empty array", key("tokens").c_str());
  if (n > static_cast<size_t>(INT32_MAX))
    return make_error(ErrorCode::kInvalidFile, "metadata key '%s' has %zu tokens", key("tokens").c_str(), n);

  v.score.assign(n, 0.0f);
  if (f.has(key("scores"))) {
    KILN_ASSIGN_OR_RETURN(auto s, f.get_f32_array(key("scores")));
    if (s.size() < n)
      return make_error(ErrorCode::kInvalidFile, "metadata key '%s' has %zu entries for %zu tokens",
                        key("scores").c_str(), s.size(), n);
    std::copy(s.begin(), s.begin() + n, v.score.begin());
  }
  v.type.assign(n, TokenType::kUndefined);
  v.attr.assign(n, kAttrNormal);
  if (f.has(key("token_type"))) {
    KILN_ASSIGN_OR_RETURN(auto t, f.get_i32_array(key("token_type")));
    if (t.size() < n)
      return make_error(ErrorCode::kInvalidFile, "metadata key '%s' has %zu entries for %zu tokens",
                        key("token_type").c_str(), t.size(), n);
    for (size_t i = 0; i < n; ++i) {
      v.type[i] = static_cast<TokenType>(t[i]);
      v.attr[i] = attr_from_type(t[i]);
    }
  }
  v.to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    if (v.text[i].empty()) v.text[i] = "[EMPTY_" + std::to_string(i) + "]";
    v.max_token_len = std::max(v.max_token_len, v.text[i].size());
  }
  for (size_t i = 0; i < n; ++i) v.to_id[v.text[i]] = static_cast<int32_t>(i);

  // Special ids: a default out of range is dropped; a key out of range keeps the default.
  for (int32_t* id : {&v.bos, &v.eos, &v.unk, &v.sep, &v.pad, &v.mask})
    if (*id >= static_cast<int64_t>(n)) *id = -1;
  int32_t* fim = v.fim;
  KILN_TRY(read_special_id(f, "bos_token_id", n, &v.bos));
  KILN_TRY(read_special_id(f, "eos_token_id", n, &v.eos));
  KILN_TRY(read_special_id(f, "eot_token_id", n, &v.eot));
  KILN_TRY(read_special_id(f, "eom_token_id", n, &v.eom));
  KILN_TRY(read_special_id(f, "unknown_token_id", n, &v.unk));
  KILN_TRY(read_special_id(f, "seperator_token_id", n, &v.sep));
  KILN_TRY(read_special_id(f, "padding_token_id", n, &v.pad));
  KILN_TRY(read_special_id(f, "mask_token_id", n, &v.mask));
  KILN_TRY(read_special_id(f, "fim_pre_token_id", n, &fim[0]));
  KILN_TRY(read_special_id(f, "fim_suf_token_id", n, &fim[1]));
  KILN_TRY(read_special_id(f, "fim_mid_token_id", n, &fim[2]));
  KILN_TRY(read_special_id(f, "fim_pad_token_id", n, &fim[3]));
  KILN_TRY(read_special_id(f, "fim_rep_token_id", n, &fim[4]));
  KILN_TRY(read_special_id(f, "fim_sep_token_id", n, &fim[5]));
  KILN_TRY(read_special_id(f, "prefix_token_id", n, &fim[0]));
  KILN_TRY(read_special_id(f, "suffix_token_id", n, &fim[1]));
  KILN_TRY(read_special_id(f, "middle_token_id", n, &fim[2]));

  KILN_ASSIGN_OR_RETURN(v.add_bos, f.get_bool_or(key("add_bos_token"), v.add_bos));
  KILN_ASSIGN_OR_RETURN(v.add_eos, f.get_bool_or(key("add_eos_token"), v.add_eos));
  KILN_ASSIGN_OR_RETURN(v.add_sep, f.get_bool_or(key("add_sep_token"), v.add_sep));
  if (v.pre == "gemma4") v.add_bos = true;  // llama.cpp overrides it for Gemma 4
  KILN_ASSIGN_OR_RETURN(v.wpm_lowercase, f.get_bool_or(key("normalizer.lowercase"), true));
  KILN_ASSIGN_OR_RETURN(v.wpm_strip_accents, f.get_bool_or(key("normalizer.strip_accents"), v.wpm_lowercase));

  // Markers recognized by text: EOT / EOM / FIM tokens become control tokens.
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v.text[i];
    if (v.eot < 0 && is_eot_text(t)) v.eot = static_cast<int32_t>(i), v.attr[i] |= kAttrControl;
    if (v.eom < 0 && t == "<|eom_id|>") v.eom = static_cast<int32_t>(i), v.attr[i] |= kAttrControl;
    for (size_t k = 0; k < 6; ++k) {
      if (fim[k] >= 0) continue;
      for (const char* m : fim_texts()[k])
        if (t == m) {
          fim[k] = static_cast<int32_t>(i);
          v.attr[i] |= kAttrControl;
        }
    }
  }
  // Control tokens named "...unused..." are unused.
  for (size_t i = 0; i < n; ++i)
    if ((v.attr[i] & kAttrControl) && v.text[i].find("unused") != std::string::npos) v.attr[i] |= kAttrUnused;

  // End of generation: FIM pad/repo/sep, the listed texts (forced to control), EOS, EOT, EOM.
  for (int k : {3, 4, 5})
    if (fim[k] >= 0) v.eog.insert(fim[k]);
  for (size_t i = 0; i < n; ++i)
    if (is_eog_text(v.text[i])) {
      v.eog.insert(static_cast<int32_t>(i));
      v.attr[i] |= kAttrControl;
    }
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v.text[i];
    if (t == "<|channel|>" || t == "<|message|>" || t == "<|start|>" || t == "<|constrain|>")
      v.attr[i] = kAttrUserDefined;  // gpt-oss: always rendered
  }
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id >= 0) v.eog.insert(id);
  {
    // o200k_harmony / solar-open: "<|end|>" is not end of generation when "<|return|>"/"<|call|>" exist.
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = -1, tool_response = -1, s_id = -1;
    for (int32_t id : v.eog) {
      const std::string& t = v.text[id];
      if (t == "<|return|>") has_return = true;
      else if (t == "<|call|>" || t == "<|calls|>") has_call = true;
      else if (t == "<|flush|>") has_flush = true;
      else if (t == "<|end|>") end_id = id;
      else if (t == "<|tool_response>") tool_response = id;
      else if (t == "</s>") s_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
      v.eog.erase(end_id);
      v.attr[end_id] = kAttrUserDefined;
    }
    // gemma4: "</s>" is an ordinary token there.
    if (tool_response >= 0 && s_id >= 0) {
      v.eog.erase(s_id);
      v.attr[s_id] = kAttrNormal;
    }
  }

  for (size_t i = 0; i < n; ++i)
    if (v.attr[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) v.specials.push_back(static_cast<int32_t>(i));
  std::stable_sort(v.specials.begin(), v.specials.end(),
                   [&](int32_t a, int32_t b) { return v.text[a].size() > v.text[b].size(); });

  // Strip rules llama.cpp attaches by model name / pre-tokenizer / architecture.
  {
    KILN_ASSIGN_OR_RETURN(std::string name, f.get_str_or("general.name", ""));
    KILN_ASSIGN_OR_RETURN(std::string arch, f.get_str_or("general.architecture", ""));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    const auto set = [&](const char* t, uint32_t a, bool on) {
      const int32_t id = v.find(t);
      if (id >= 0) v.attr[id] = on ? (v.attr[id] | a) : (v.attr[id] & ~a);
    };
    if (contains(v.pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
        contains(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
      set("<mask>", kAttrLstrip, true);
    } else if (contains(name, {"phi-3", "phi3"})) {
      for (int32_t id : v.specials) v.attr[id] |= kAttrRstrip;
      set("</s>", kAttrRstrip, true);
      for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, kAttrRstrip, false);
    } else if (contains(name, {"modern-bert"})) {
      set("[MASK]", kAttrLstrip, true);
    }
  }

  KILN_ASSIGN_OR_RETURN(v.chat_template, f.get_str_or("tokenizer.chat_template", ""));
  return v;
}

namespace {
bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
}  // namespace

void partition_special(const Vocab& vocab, std::string_view text, bool parse_special, std::vector<Fragment>* out) {
  out->clear();
  if (text.empty()) return;
  out->push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const int32_t id : vocab.specials) {
    const uint32_t a = vocab.attr[id];
    if (!parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
    const std::string& tok = vocab.text[id];
    // Cheap rejection: the token occurs nowhere in the text.
    if (text.find(tok) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fr : *out) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t pos = fr.begin;
      while (pos < fr.end) {
        const size_t m = text.substr(0, fr.end).find(tok, pos);
        if (m == std::string_view::npos) {
          next.push_back({-1, pos, fr.end});
          break;
        }
        size_t left_end = m;
        if (a & kAttrLstrip)
          while (left_end > pos && is_c_space(text[left_end - 1])) --left_end;
        if (left_end > pos) next.push_back({-1, pos, left_end});
        next.push_back({id, m, m + tok.size()});
        pos = m + tok.size();
        if (a & kAttrRstrip)
          while (pos < fr.end && is_c_space(text[pos])) ++pos;
      }
    }
    out->swap(next);
  }
}

}  // namespace kiln::tok
