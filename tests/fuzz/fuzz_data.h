// Test data for the fuzz targets: tests/data through $KILN_TEST_DATA_DIR, else relative to this header, and the
// vocabularies of tests/data/tokenizer (a load failure aborts: the target cannot run without them).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace kiln::fuzz {

// tests/fuzz (the folder of this header: corpora live below it).
inline std::string fuzz_dir() {
  std::string here = __FILE__;  // .../tests/fuzz/fuzz_data.h
  const size_t slash = here.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : here.substr(0, slash);
}

inline std::string data_dir() {
  if (const char* d = std::getenv("KILN_TEST_DATA_DIR")) return d;
  return fuzz_dir() + "/../data";
}

// tests/data/tokenizer/ggml-vocab-<name>.gguf as a Tokenizer; `who` prefixes the abort message.
inline std::unique_ptr<Tokenizer> load_vocab(const char* name, const char* who) {
  const std::string path = data_dir() + "/tokenizer/ggml-vocab-" + name + ".gguf";
  auto f = gguf::File::open(path);
  if (!f) {
    std::fprintf(stderr, "%s: %s\n", who, f.status().to_string().c_str());
    std::abort();
  }
  auto t = Tokenizer::from_gguf(*f);
  if (!t) {
    std::fprintf(stderr, "%s: %s\n", who, t.status().to_string().c_str());
    std::abort();
  }
  return std::move(t).value();
}

}  // namespace kiln::fuzz
