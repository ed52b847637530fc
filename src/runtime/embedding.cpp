// Pooling names, normalization and the rerank pair prompt (runtime/embedding.h).
#include "runtime/embedding.h"

#include <cmath>

namespace kiln {

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kNone: return "none";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
    case Pooling::kLast: return "last";
    case Pooling::kRank: return "rank";
  }
  return "?";
}

Result<Pooling> parse_pooling(std::string_view s, const char* what) {
  for (Pooling p : {Pooling::kNone, Pooling::kMean, Pooling::kCls, Pooling::kLast, Pooling::kRank})
    if (s == pooling_name(p)) return p;
  return make_error(ErrorCode::kInvalidArgument, "%s: '%.*s' is not a pooling type (none, mean, cls, last, rank)", what,
                    static_cast<int>(s.size()), s.data());
}

Status check_normalize(int32_t mode, const char* what) {
  if (mode < -1 || mode > 64)
    return make_error(ErrorCode::kInvalidArgument, "%s: %d is not a normalization (-1 none, 0 max-abs, 1 taxicab, 2 "
                      "euclidean, p > 2 the p-norm up to 64)", what, mode);
  return Status::ok();
}

void normalize(std::span<float> v, int32_t mode) {
  double norm = 1.0;  // the divisor (-1: none)
  if (mode == 0) {
    double mx = 0;
    for (float x : v) mx = std::max(mx, static_cast<double>(std::fabs(x)));
    norm = mx / 32760.0;
  } else if (mode == 2) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    norm = std::sqrt(s);
  } else if (mode >= 1) {
    double s = 0;
    for (float x : v) s += std::pow(std::fabs(static_cast<double>(x)), mode);
    norm = std::pow(s, 1.0 / mode);
  }
  const float k = norm > 0 ? static_cast<float>(1.0 / norm) : 0.0f;
  if (mode != -1)
    for (float& x : v) x *= k;
}

namespace {

// tmpl with every {query} and {document} replaced in one left-to-right pass (replaced text is never rescanned).
std::string fill(const std::string& tmpl, const std::string& query, const std::string& doc) {
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl.compare(i, 7, "{query}") == 0) {
      out += query;
      i += 7;
    } else if (tmpl.compare(i, 10, "{document}") == 0) {
      out += doc;
      i += 10;
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

}  // namespace

std::vector<int32_t> embedding_tokens(const Tokenizer& tok, std::string_view text) {
  return tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
}

std::vector<int32_t> rerank_prompt(const Tokenizer& tok, const std::string& tmpl, const std::string& query,
                                   const std::string& doc) {
  if (!tmpl.empty()) return tok.encode(fill(tmpl, query, doc), /*add_special=*/false, /*parse_special=*/true);
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos() >= 0) ids.push_back(tok.bos());
  for (int32_t t : tok.encode(query, false, false)) ids.push_back(t);
  const int32_t eos = tok.eos() >= 0 ? tok.eos() : tok.sep();
  if (tok.add_eos() && eos >= 0) ids.push_back(eos);
  if (tok.add_sep() && tok.sep() >= 0) ids.push_back(tok.sep());
  for (int32_t t : tok.encode(doc, false, false)) ids.push_back(t);
  if (tok.add_eos() && eos >= 0) ids.push_back(eos);
  return ids;
}

}  // namespace kiln
