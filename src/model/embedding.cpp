// EmbeddingInfo (model/embedding.h): the pooling key, the classification head, the rerank prompt.
#include "model/embedding.h"

#include <algorithm>

#include "quant/reference.h"

namespace kiln {
namespace {

// Rows `rows` of a [n_embd, n_rows] tensor of the file, dequantized to f32, appended to out.
Status dequantize_rows(const gguf::TensorInfo& t, const std::vector<int64_t>& rows, std::vector<float>* out) {
  if (!can_dequantize(t.type))
    return make_error(ErrorCode::kUnsupported, "tensor '%s' has type %s, which kiln cannot dequantize",
                      t.name.c_str(), dtype_name(t.type));
  KILN_ASSIGN_OR_RETURN(const uint64_t row_bytes, dtype_row_bytes(t.type, t.ne[0]));
  if (t.data == nullptr || row_bytes * static_cast<uint64_t>(t.ne[1]) > t.nbytes)
    return make_error(ErrorCode::kInvalidFile, "tensor '%s': %llu bytes for shape %s", t.name.c_str(),
                      static_cast<unsigned long long>(t.nbytes), t.shape_string().c_str());
  for (int64_t r : rows) {
    out->resize(out->size() + static_cast<size_t>(t.ne[0]));
    KILN_TRY(dequantize_row(t.type, t.data + static_cast<uint64_t>(r) * row_bytes,
                            out->data() + out->size() - static_cast<size_t>(t.ne[0]), t.ne[0]));
  }
  return Status::ok();
}

int32_t find_token(const Tokenizer& tok, const std::string& text) {
  for (int32_t i = 0; i < tok.n_vocab(); ++i)
    if (tok.token_text(i) == text) return i;
  return -1;
}

// cls.output.weight [n_embd, n_cls] (+ cls.output.bias [n_cls]).
Status read_cls_output(const gguf::File& f, const gguf::TensorInfo& w, EmbeddingInfo* e) {
  if (w.n_dims > 2 || w.ne[0] != e->n_embd || w.ne[1] < 1 || w.ne[1] > 65536)
    return make_error(ErrorCode::kInvalidFile, "tensor 'cls.output.weight' has shape %s: expected [%lld, n_labels] "
                      "(n_labels in [1, 65536])", w.shape_string().c_str(), static_cast<long long>(e->n_embd));
  e->n_cls = w.ne[1];
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < e->n_cls; ++r) rows.push_back(r);
  KILN_TRY(dequantize_rows(w, rows, &e->cls_w));
  if (const gguf::TensorInfo* b = f.find_tensor("cls.output.bias")) {
    if (b->n_dims != 1 || b->ne[0] != e->n_cls)
      return make_error(ErrorCode::kInvalidFile, "tensor 'cls.output.bias' has shape %s: expected [%lld]",
                        b->shape_string().c_str(), static_cast<long long>(e->n_cls));
    gguf::TensorInfo one = *b;  // a [n_cls] vector read as one row
    one.ne[1] = 1;
    KILN_TRY(dequantize_rows(one, {0}, &e->cls_b));
  }
  e->cls_source = e->dense_w.empty() ? "cls.output.weight" : "cls.weight, cls.output.weight";
  return Status::ok();
}

}  // namespace

Result<EmbeddingInfo> read_embedding_info(const Model& model) {
  const gguf::File& f = model.file();
  const HParams& hp = model.hparams();
  EmbeddingInfo e;
  e.n_embd = hp.n_embd;
  const std::string pkey = hp.arch + ".pooling_type";
  if (f.has(pkey)) {
    KILN_ASSIGN_OR_RETURN(const int64_t p, f.get_i64(pkey));
    if (p < 0 || p > 4)
      return make_error(ErrorCode::kInvalidFile, "%s is %lld: must be 0 (none), 1 (mean), 2 (cls), 3 (last) or 4 "
                        "(rank)", pkey.c_str(), static_cast<long long>(p));
    e.pooling_type = static_cast<int32_t>(p);
  }
  const std::string lkey = hp.arch + ".classifier.output_labels";
  if (f.has(lkey)) {
    KILN_ASSIGN_OR_RETURN(e.labels, f.get_str_array(lkey));
  }
  KILN_ASSIGN_OR_RETURN(e.rerank_template, f.get_str_or("tokenizer.chat_template.rerank", ""));
  if (const gguf::TensorInfo* d = f.find_tensor("cls.weight")) {
    if (d->n_dims != 2 || d->ne[0] != e.n_embd || d->ne[1] != e.n_embd)
      return make_error(ErrorCode::kInvalidFile, "tensor 'cls.weight' has shape %s: expected [%lld, %lld]",
                        d->shape_string().c_str(), static_cast<long long>(e.n_embd), static_cast<long long>(e.n_embd));
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < e.n_embd; ++r) rows.push_back(r);
    KILN_TRY(dequantize_rows(*d, rows, &e.dense_w));
    if (const gguf::TensorInfo* b = f.find_tensor("cls.bias")) {
      if (b->n_dims != 1 || b->ne[0] != e.n_embd)
        return make_error(ErrorCode::kInvalidFile, "tensor 'cls.bias' has shape %s: expected [%lld]",
                          b->shape_string().c_str(), static_cast<long long>(e.n_embd));
      gguf::TensorInfo one = *b;
      one.ne[1] = 1;
      KILN_TRY(dequantize_rows(one, {0}, &e.dense_b));
    }
    e.n_cls = e.n_embd;  // the dense layer's outputs, unless cls.output.weight follows
    e.cls_source = "cls.weight";
  }
  if (const gguf::TensorInfo* w = f.find_tensor("cls.output.weight")) {
    KILN_TRY(read_cls_output(f, *w, &e));
  } else if (hp.arch == "qwen3" && e.dense_w.empty()) {
    // The Qwen3-Reranker recipe: the logits of "yes" and "no" from the output projection (token_embd when tied).
    const Tokenizer& tok = model.tokenizer();
    const int32_t yes = find_token(tok, "yes"), no = find_token(tok, "no");
    const gguf::TensorInfo* out = f.find_tensor("output.weight");
    if (!out) out = f.find_tensor("token_embd.weight");
    if (yes >= 0 && no >= 0 && out && out->ne[0] == e.n_embd && out->ne[1] > std::max(yes, no)) {
      KILN_TRY(dequantize_rows(*out, {yes, no}, &e.cls_w));
      e.n_cls = 2;
      e.cls_source = "the output rows of the tokens 'yes' and 'no'";
      if (e.labels.empty()) e.labels = {"yes", "no"};
    }
  }
  e.cls_softmax = e.n_cls > 0 && hp.arch == "qwen3";
  e.rank_last = hp.arch == "qwen3";
  if (!e.labels.empty() && e.n_cls > 0 && static_cast<int64_t>(e.labels.size()) != e.n_cls)
    return make_error(ErrorCode::kInvalidFile, "%s has %zu labels for a head of %lld outputs", lkey.c_str(),
                      e.labels.size(), static_cast<long long>(e.n_cls));
  return e;
}

}  // namespace kiln
