// Test data for the fuzz targets: tests/data through $KILN_TEST_DATA_DIR, else beside tests/fuzz (KILN_FUZZ_DIR, set
// by the build), and the committed vocabularies (tests/data/tokenizer.tar.xz, unpacked by the build into
// KILN_TEST_VOCAB_DIR; a load failure aborts: the target cannot run without them).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace kiln::fuzz {

// tests/fuzz (corpora live below it), an absolute path from the build (__FILE__ is relative when a compiler
// launcher rewrites paths).
inline std::string fuzz_dir() { return KILN_FUZZ_DIR; }

inline std::string data_dir() {
  if (const char* d = std::getenv("KILN_TEST_DATA_DIR")) return d;
  return fuzz_dir() + "/../data";
}

// ggml-vocab-<name>.gguf of the committed vocabularies as a Tokenizer; `who` prefixes the abort message.
inline std::unique_ptr<Tokenizer> load_vocab(const char* name, const char* who) {
  const std::string path = std::string(KILN_TEST_VOCAB_DIR) + "/ggml-vocab-" + name + ".gguf";
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
