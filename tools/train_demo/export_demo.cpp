// kiln_export_demo: writes the demo model as a GGUF (llama architecture, llama.cpp's key and tensor names) from
// what train.py produced and the tokenizer bpe.py trained.
//
//   kiln_export_demo --weights DIR --tokenizer DIR --type q8_0|f16 -o FILE.gguf
//
// --weights DIR:   config.json (hyperparameters) and model-NNNNN.safetensors (f32 tensors under their GGUF names,
//                  PyTorch shape [out, in] row-major, which is ggml ne = [in, out]: the shape is reversed, the
//                  bytes are not touched).
// --tokenizer DIR: vocab.txt (one token per line, GPT-2 byte-to-unicode text; id = line number) and merges.txt
//                  ("left right" per line, by rank).
// 2-D weights are stored as --type (Q8_0 through kiln's reference quantizer, which reproduces llama.cpp's bytes),
// 1-D norm weights stay F32 (as llama.cpp's quantizer leaves them).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/reference.h"
#include "util/mmap_file.h"
#include "util/status.h"

namespace kiln {
namespace {

using json = nlohmann::json;

struct F32Tensor {
  std::vector<int64_t> shape;  // PyTorch order (outermost first)
  const float* data = nullptr;  // into a mapping held by Safetensors::maps
};

struct Safetensors {
  std::vector<std::shared_ptr<MappedFile>> maps;
  std::map<std::string, F32Tensor> tensors;
};

Result<json> read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error(ErrorCode::kIo, "%s: cannot open", path.c_str());
  json j = json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(ErrorCode::kInvalidFile, "%s: not valid JSON", path.c_str());
  return j;
}

// safetensors: u64 little-endian header size N, N bytes of JSON {name: {dtype, shape, data_offsets: [b, e]}},
// then the data; offsets are relative to byte 8 + N.
Status read_safetensors(const std::string& path, Safetensors& out) {
  KILN_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  const uint8_t* p = map->data();
  const uint64_t size = map->size();
  if (size < 8) return make_error(ErrorCode::kInvalidFile, "%s: %llu bytes, too short", path.c_str(),
                                  static_cast<unsigned long long>(size));
  uint64_t n = 0;
  std::memcpy(&n, p, 8);
  if (n > size - 8) return make_error(ErrorCode::kInvalidFile, "%s: header size %llu exceeds the file",
                                      path.c_str(), static_cast<unsigned long long>(n));
  json h = json::parse(p + 8, p + 8 + n, nullptr, false);
  if (h.is_discarded() || !h.is_object())
    return make_error(ErrorCode::kInvalidFile, "%s: header at byte 8 is not a JSON object", path.c_str());
  const uint64_t data_begin = 8 + n;
  for (auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    const bool well_formed = t.is_object() && t.contains("dtype") && t["dtype"] == "F32" && t.contains("shape") &&
                             t["shape"].is_array() && t.contains("data_offsets") && t["data_offsets"].is_array() &&
                             t["data_offsets"].size() == 2 && t["data_offsets"][0].is_number_unsigned() &&
                             t["data_offsets"][1].is_number_unsigned();
    if (!well_formed)
      return make_error(ErrorCode::kInvalidFile, "%s: tensor %s: expected dtype F32, a shape and two data_offsets",
                        path.c_str(), name.c_str());
    F32Tensor ft;
    uint64_t count = 1;
    for (auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) return make_error(ErrorCode::kInvalidFile, "%s: tensor %s: bad shape",
                                                     path.c_str(), name.c_str());
      ft.shape.push_back(d.get<int64_t>());
      count *= d.get<uint64_t>();
      if (count > size) return make_error(ErrorCode::kInvalidFile, "%s: tensor %s: shape larger than the file",
                                          path.c_str(), name.c_str());
    }
    const uint64_t b = t["data_offsets"][0].get<uint64_t>(), e = t["data_offsets"][1].get<uint64_t>();
    if (e < b || e - b != count * 4 || (data_begin + b) % 4 != 0)
      return make_error(ErrorCode::kInvalidFile,
                        "%s: tensor %s: data_offsets [%llu, %llu) do not hold %llu aligned floats", path.c_str(),
                        name.c_str(), static_cast<unsigned long long>(b), static_cast<unsigned long long>(e),
                        static_cast<unsigned long long>(count));
    if (e > size - data_begin)
      return make_error(ErrorCode::kInvalidFile, "%s: tensor %s: data ends at byte %llu, the file has %llu",
                        path.c_str(), name.c_str(), static_cast<unsigned long long>(data_begin + e),
                        static_cast<unsigned long long>(size));
    ft.data = reinterpret_cast<const float*>(p + data_begin + b);
    out.tensors[name] = ft;
  }
  out.maps.push_back(std::move(map));
  return Status::ok();
}

Result<std::vector<std::string>> read_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kIo, "%s: cannot open", path.c_str());
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  return lines;
}

Status run(const std::string& weights_dir, const std::string& tok_dir, DType type, const std::string& out_path) {
  KILN_ASSIGN_OR_RETURN(json cfg, read_json(weights_dir + "/config.json"));
  for (const char* k : {"n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_ctx", "bos_id", "eos_id",
                        "n_shards"})
    if (!cfg.contains(k) || !cfg[k].is_number_unsigned() || cfg[k].get<uint64_t>() > UINT32_MAX)
      return make_error(ErrorCode::kInvalidFile, "%s/config.json: %s must be an integer in [0, 2^32)",
                        weights_dir.c_str(), k);
  for (const char* k : {"rms_eps", "rope_freq_base"})
    if (!cfg.contains(k) || !cfg[k].is_number())
      return make_error(ErrorCode::kInvalidFile, "%s/config.json: %s must be a number", weights_dir.c_str(), k);
  if (cfg["n_head"].get<uint32_t>() == 0 || cfg["n_embd"].get<uint32_t>() % cfg["n_head"].get<uint32_t>() != 0)
    return make_error(ErrorCode::kInvalidFile, "%s/config.json: n_embd must be a multiple of n_head",
                      weights_dir.c_str());
  auto u32 = [&](const char* k) { return cfg[k].get<uint32_t>(); };

  Safetensors st;
  for (uint32_t i = 0; i < u32("n_shards"); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "/model-%05u.safetensors", i);
    KILN_TRY(read_safetensors(weights_dir + name, st));
  }
  KILN_ASSIGN_OR_RETURN(auto tokens, read_lines(tok_dir + "/vocab.txt"));
  KILN_ASSIGN_OR_RETURN(auto merges, read_lines(tok_dir + "/merges.txt"));
  if (tokens.size() != u32("n_vocab"))
    return make_error(ErrorCode::kInvalidArgument, "%s/vocab.txt: %zu tokens, config.json says n_vocab %u",
                      tok_dir.c_str(), tokens.size(), u32("n_vocab"));

  gguf::Writer w;
  w.set("general.architecture", "llama");
  w.set("general.name", "kiln-demo");
  w.set("general.description", "kiln's embedded demo model: a small Llama trained on the King James Bible");
  w.set("general.file_type", static_cast<uint32_t>(type == DType::Q8_0 ? 7 : 1));  // llama_ftype MOSTLY_Q8_0 / F16
  if (type == DType::Q8_0) w.set("general.quantization_version", static_cast<uint32_t>(2));
  const uint32_t head_dim = u32("n_embd") / u32("n_head");
  w.set("llama.vocab_size", u32("n_vocab"));
  w.set("llama.context_length", u32("n_ctx"));
  w.set("llama.embedding_length", u32("n_embd"));
  w.set("llama.block_count", u32("n_layer"));
  w.set("llama.feed_forward_length", u32("n_ff"));
  w.set("llama.attention.head_count", u32("n_head"));
  w.set("llama.attention.head_count_kv", u32("n_head_kv"));
  w.set("llama.attention.layer_norm_rms_epsilon", cfg["rms_eps"].get<float>());
  w.set("llama.rope.freq_base", cfg["rope_freq_base"].get<float>());
  w.set("llama.rope.dimension_count", head_dim);

  const uint32_t bos = u32("bos_id"), eos = u32("eos_id");
  gguf::Array tok_arr{gguf::ValueType::STRING, {}}, type_arr{gguf::ValueType::I32, {}},
      merge_arr{gguf::ValueType::STRING, {}};
  for (size_t i = 0; i < tokens.size(); ++i) {
    tok_arr.items.emplace_back(tokens[i]);
    const bool control = i == bos || i == eos;
    type_arr.items.emplace_back(static_cast<int32_t>(control ? 3 : 1));  // CONTROL : NORMAL
  }
  for (auto& m : merges) merge_arr.items.emplace_back(m);
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", "gpt-2");
  w.set("tokenizer.ggml.tokens", std::move(tok_arr));
  w.set("tokenizer.ggml.token_type", std::move(type_arr));
  w.set("tokenizer.ggml.merges", std::move(merge_arr));
  w.set("tokenizer.ggml.bos_token_id", bos);
  w.set("tokenizer.ggml.eos_token_id", eos);
  w.set("tokenizer.ggml.add_bos_token", true);
  w.set("tokenizer.ggml.add_eos_token", false);

  std::vector<std::string> names = {"token_embd.weight", "output_norm.weight"};
  for (uint32_t il = 0; il < u32("n_layer"); ++il)
    for (const char* t : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                          "ffn_down"})
      names.push_back("blk." + std::to_string(il) + "." + t + ".weight");
  if (st.tensors.size() != names.size())
    return make_error(ErrorCode::kInvalidFile, "%s: %zu tensors in the safetensors shards, expected %zu",
                      weights_dir.c_str(), st.tensors.size(), names.size());

  for (const std::string& name : names) {
    auto it = st.tensors.find(name);
    if (it == st.tensors.end())
      return make_error(ErrorCode::kNotFound, "%s: tensor %s missing", weights_dir.c_str(), name.c_str());
    const F32Tensor& t = it->second;
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());  // ggml order: innermost first
    if (ne.size() == 1) {
      KILN_TRY(w.add_tensor(name, DType::F32, ne, t.data));
      continue;
    }
    if (ne.size() != 2) return make_error(ErrorCode::kInvalidFile, "tensor %s: %zu dims, expected 1 or 2",
                                          name.c_str(), ne.size());
    KILN_ASSIGN_OR_RETURN(uint64_t row_bytes, dtype_row_bytes(type, ne[0]));
    const int64_t n_in = ne[0];
    const float* src = t.data;
    // Rows are independent, so any chunk boundary is first rounded out to whole rows.
    auto fill = [src, n_in, row_bytes, type](uint8_t* dst, uint64_t begin, uint64_t n) {
      std::vector<uint8_t> row(row_bytes);
      for (uint64_t r = begin / row_bytes; r * row_bytes < begin + n; ++r) {
        (void)quantize_row(type, src + r * n_in, row.data(), n_in);  // n_in is a block multiple: checked above
        const uint64_t rb = r * row_bytes;
        const uint64_t lo = std::max(rb, begin), hi = std::min(rb + row_bytes, begin + n);
        std::memcpy(dst + (lo - begin), row.data() + (lo - rb), hi - lo);
      }
    };
    KILN_TRY(w.add_tensor(name, type, ne, fill));
  }
  return w.write(out_path, 2);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  std::string weights, tok, type_name = "q8_0", out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&](std::string& v) {
      if (i + 1 >= argc) return false;
      v = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "--weights") ok = next(weights);
    else if (a == "--tokenizer") ok = next(tok);
    else if (a == "--type") ok = next(type_name);
    else if (a == "-o") ok = next(out);
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "usage: kiln_export_demo --weights DIR --tokenizer DIR --type q8_0|f16 -o FILE.gguf\n");
      return 2;
    }
  }
  if (weights.empty() || tok.empty() || out.empty()) {
    std::fprintf(stderr, "usage: kiln_export_demo --weights DIR --tokenizer DIR --type q8_0|f16 -o FILE.gguf\n");
    return 2;
  }
  auto type = kiln::dtype_from_name(type_name);
  if (!type || (*type != kiln::DType::Q8_0 && *type != kiln::DType::F16)) {
    std::fprintf(stderr, "kiln_export_demo: --type %s: expected q8_0 or f16\n", type_name.c_str());
    return 2;
  }
  kiln::Status s = kiln::run(weights, tok, *type, out);
  if (!s) {
    std::fprintf(stderr, "kiln_export_demo: %s\n", s.to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return 0;
}
