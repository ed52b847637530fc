// Helpers for tests that run models through an Engine (parity, tensor parallel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "model/batch.h"
#include "runtime/engine.h"

namespace kiln::test {

// Token ids of a fixture's prompt file (integers separated by commas and/or whitespace).
inline std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream is(s);
  std::vector<int32_t> v;
  for (int32_t x; is >> x;) v.push_back(x);
  return v;
}

// Feeds `ids` as sequence 0 in chunks of n_batch, every position wanting logits; out = [ids.size()][n_vocab].
inline Status run_all(Engine& e, const std::vector<int32_t>& ids, int n_batch, std::vector<float>* out) {
  out->clear();
  Batch b;
  std::vector<float> lg;
  for (size_t s = 0; s < ids.size(); s += static_cast<size_t>(n_batch)) {
    b.clear();
    for (size_t i = s; i < std::min(ids.size(), s + static_cast<size_t>(n_batch)); ++i)
      b.add(ids[i], static_cast<int32_t>(i), 0, true);
    KILN_TRY(e.forward(b, &lg));
    out->insert(out->end(), lg.begin(), lg.end());
  }
  return Status::ok();
}

}  // namespace kiln::test
