// kiln info FILE [--json]: what a GGUF file holds (header, architecture and hyperparameters, vocabulary,
// metadata with long arrays summarized, tensor table, totals).
#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/args.h"
#include "gguf/gguf.h"

namespace kiln::cli {
namespace {

using gguf::Array;
using gguf::File;
using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

constexpr size_t kArrayHead = 8;         // array items shown
constexpr size_t kMaxTextString = 160;   // longer strings are cut in text mode (chat templates)

json to_json(const Value& v) {
  switch (v.type()) {
    case ValueType::U8: return std::get<uint8_t>(v.v);
    case ValueType::I8: return std::get<int8_t>(v.v);
    case ValueType::U16: return std::get<uint16_t>(v.v);
    case ValueType::I16: return std::get<int16_t>(v.v);
    case ValueType::U32: return std::get<uint32_t>(v.v);
    case ValueType::I32: return std::get<int32_t>(v.v);
    case ValueType::U64: return std::get<uint64_t>(v.v);
    case ValueType::I64: return std::get<int64_t>(v.v);
    case ValueType::F32: return std::get<float>(v.v);
    case ValueType::F64: return std::get<double>(v.v);
    case ValueType::BOOL: return std::get<bool>(v.v);
    case ValueType::STRING: return v.str();
    case ValueType::ARRAY: {
      // {"array_of": type, "count": n, "head": [first items]}; nested arrays summarized the same way.
      const Array& a = v.arr();
      json head = json::array();
      for (size_t i = 0; i < a.items.size() && i < kArrayHead; ++i) head.push_back(to_json(a.items[i]));
      return json{{"array_of", gguf::value_type_name(a.type)}, {"count", a.items.size()}, {"head", head}};
    }
  }
  return nullptr;
}

std::string text_value(const Value& v) {
  if (v.is_string()) {
    std::string s = gguf::quote_string(v.str());
    if (s.size() > kMaxTextString) s = s.substr(0, kMaxTextString) + strprintf("... (%zu bytes)", v.str().size());
    return s;
  }
  if (v.is_array()) {
    const Array& a = v.arr();
    std::string s = strprintf("[%s x %zu] ", gguf::value_type_name(a.type), a.items.size());
    std::string items = v.to_string(kArrayHead);
    if (items.size() > kMaxTextString) items = items.substr(0, kMaxTextString) + "...";
    return s + items;
  }
  return v.to_string();
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return strprintf("%.2f GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return strprintf("%.2f MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return strprintf("%.2f KiB", static_cast<double>(b) / (1ull << 10));
  return strprintf("%" PRIu64 " B", b);
}

struct Summary {
  std::string arch;
  int64_t n_vocab = -1;
  std::string tok_model, tok_pre;
  uint64_t n_params = 0, n_bytes = 0;
  double bpw = 0;
  // <arch>.nextn_predict_layers: multi-token-prediction blocks after the trunk (--spec-type draft-mtp); their
  // tensors (the blocks' blk.N.* of N >= block_count - nextn) and bytes.
  int64_t n_nextn = 0;
  size_t nextn_tensors = 0;
  uint64_t nextn_bytes = 0;
};

Summary summarize(const File& f) {
  Summary s;
  if (const Value* a = f.find("general.architecture"); a && a->is_string()) s.arch = a->str();
  if (const Value* t = f.find("tokenizer.ggml.tokens"); t && t->is_array()) s.n_vocab = static_cast<int64_t>(t->arr().items.size());
  if (const Value* m = f.find("tokenizer.ggml.model"); m && m->is_string()) s.tok_model = m->str();
  if (const Value* p = f.find("tokenizer.ggml.pre"); p && p->is_string()) s.tok_pre = p->str();
  int64_t n_block = 0;
  if (!s.arch.empty()) {
    if (auto nn = f.get_i64(s.arch + ".nextn_predict_layers")) s.n_nextn = *nn;
    if (auto bc = f.get_i64(s.arch + ".block_count")) n_block = *bc;
  }
  for (const auto& t : f.tensors()) {
    s.n_params += static_cast<uint64_t>(t.n_elements());
    s.n_bytes += t.nbytes;
    if (s.n_nextn > 0 && t.name.rfind("blk.", 0) == 0 && std::strtoll(t.name.c_str() + 4, nullptr, 10) >= n_block - s.n_nextn) {
      ++s.nextn_tensors;
      s.nextn_bytes += t.nbytes;
    }
  }
  s.bpw = s.n_params ? 8.0 * static_cast<double>(s.n_bytes) / static_cast<double>(s.n_params) : 0.0;
  return s;
}

bool is_arch_key(const std::string& key, const std::string& arch) {
  return !arch.empty() && key.size() > arch.size() + 1 && key.compare(0, arch.size(), arch) == 0 &&
         key[arch.size()] == '.';
}

void print_json(const File& f, const Summary& s, const Status& error) {
  json j;
  if (!error) j["error"] = error.to_string();
  j["path"] = f.path();
  j["file_size"] = f.file_size();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  j["architecture"] = s.arch.empty() ? json(nullptr) : json(s.arch);
  json hp = json::object();
  for (const auto& kv : f.kvs())
    if (is_arch_key(kv.key, s.arch)) hp[kv.key.substr(s.arch.size() + 1)] = to_json(kv.value);
  j["hparams"] = hp;
  j["vocab"] = {{"size", s.n_vocab < 0 ? json(nullptr) : json(s.n_vocab)},
                {"model", s.tok_model.empty() ? json(nullptr) : json(s.tok_model)},
                {"pre", s.tok_pre.empty() ? json(nullptr) : json(s.tok_pre)}};
  json md = json::object();
  for (const auto& kv : f.kvs()) md[kv.key] = to_json(kv.value);
  j["metadata"] = md;
  json ts = json::array();
  for (const auto& t : f.tensors()) {
    json shape = json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    ts.push_back({{"name", t.name}, {"type", dtype_name(t.type)}, {"shape", shape}, {"bytes", t.nbytes},
                  {"offset", f.data_offset() + t.offset}});
  }
  j["tensors"] = ts;
  j["totals"] = {{"tensors", f.tensors().size()}, {"params", s.n_params}, {"bytes", s.n_bytes},
                 {"bits_per_weight", s.bpw}};
  if (!error) j["complete"] = false;  // metadata and tensor infos up to the error only
  // Token strings need not be valid UTF-8: replace bad sequences rather than fail.
  std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

void print_text(const File& f, const Summary& s, const Status& error) {
  if (!error)
    std::printf("(damaged file: what follows is what was read intact before the error at the end)\n\n");
  std::printf("file:        %s (%s)\n", f.path().c_str(), human_bytes(f.file_size()).c_str());
  std::printf("gguf:        version %u, alignment %" PRIu64 ", data at offset %" PRIu64 "\n", f.version(),
              f.alignment(), f.data_offset());
  std::printf("arch:        %s\n", s.arch.empty() ? "(none)" : s.arch.c_str());
  for (const auto& kv : f.kvs())
    if (is_arch_key(kv.key, s.arch)) std::printf("  %-40s %s\n", kv.key.c_str() + s.arch.size() + 1, text_value(kv.value).c_str());
  if (s.n_vocab >= 0)
    std::printf("vocab:       %" PRId64 " tokens, model %s, pre %s\n", s.n_vocab,
                s.tok_model.empty() ? "(none)" : s.tok_model.c_str(), s.tok_pre.empty() ? "(none)" : s.tok_pre.c_str());
  else
    std::printf("vocab:       (none)\n");
  if (s.n_nextn > 0)
    std::printf("mtp:         %" PRId64 " multi-token-prediction layer%s (%zu tensors, %s): --spec-type draft-mtp\n",
                s.n_nextn, s.n_nextn == 1 ? "" : "s", s.nextn_tensors, human_bytes(s.nextn_bytes).c_str());
  std::printf("\nmetadata (%zu keys):\n", f.kvs().size());
  for (const auto& kv : f.kvs())
    std::printf("  %-44s %-7s %s\n", kv.key.c_str(), gguf::value_type_name(kv.value.type()), text_value(kv.value).c_str());
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  size_t w = 4;
  for (const auto& t : f.tensors()) w = std::max(w, t.name.size());
  std::printf("  %-*s %-7s %-24s %12s\n", static_cast<int>(w), "name", "type", "shape", "bytes");
  for (const auto& t : f.tensors())
    std::printf("  %-*s %-7s %-24s %12" PRIu64 "\n", static_cast<int>(w), t.name.c_str(), dtype_name(t.type),
                t.shape_string().c_str(), t.nbytes);
  std::printf("\ntotals:      %zu tensors, %" PRIu64 " params (%.3f M), %" PRIu64 " bytes (%s), %.3f bits per weight\n",
              f.tensors().size(), s.n_params, static_cast<double>(s.n_params) / 1e6, s.n_bytes,
              human_bytes(s.n_bytes).c_str(), s.bpw);
}

int run_info(int argc, char** argv) {
  std::string path;
  bool as_json = false;
  ArgParser p("info", "Shows what a GGUF file holds: header, architecture, vocabulary, metadata, tensors, totals.");
  p.positional("FILE", &path, "the GGUF file");
  p.flag({"--json"}, &as_json, "print one JSON object");
  if (Status st = p.parse(argc, argv); !st) return fail("info", st);
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  // A damaged file (truncated inside its tensor data, a bad field after the metadata) still shows the header,
  // metadata and tensor infos read intact before the error; then the error, exit status 1.
  File partial;
  auto opened = File::open(path, &partial);
  const Status error = opened.status();
  if (!opened && (!partial.mapping() || partial.version() == 0)) return fail("info", error);  // no header
  const File& f = opened ? *opened : partial;
  const Summary s = summarize(f);
  if (as_json)
    print_json(f, s, error);
  else
    print_text(f, s, error);
  std::fflush(stdout);
  return error ? 0 : fail("info", error);
}

}  // namespace

KILN_REGISTER_COMMAND("info", "show a GGUF file's metadata, tensors and totals", run_info);

}  // namespace kiln::cli
