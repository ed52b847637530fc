// Tokenizer throughput: encodes a text of a given size with a GGUF vocabulary and reports the median of N runs.
//   bench_tokenize VOCAB.gguf [--bytes N (default 1048576)] [--runs R (default 5)] FILE...
// The FILEs are concatenated and repeated until N bytes (cut at a UTF-8 boundary), e.g. the English texts in
// /usr/share/common-licenses. Also checks decode(encode(text)) == text and prints ids per byte.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf [--bytes N] [--runs R] FILE...\n", argv[0]);
    return 1;
  }
  size_t target = 1 << 20;
  int runs = 5;
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bytes") && i + 1 < argc) target = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::atoi(argv[++i]);
    else files.push_back(argv[i]);
  }
  std::string corpus;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus += ss.str();
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "no input text\n");
    return 1;
  }
  std::string text;
  while (text.size() < target) text += corpus;
  size_t cut = target;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);

  auto file = kiln::gguf::File::open(argv[1]);
  if (!file) {
    std::fprintf(stderr, "%s\n", file.status().to_string().c_str());
    return 1;
  }
  kiln::Timer load_timer;
  auto tok = kiln::Tokenizer::from_gguf(*file);
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  const double load_s = load_timer.seconds();

  std::vector<double> times;
  std::vector<int32_t> ids;
  for (int r = 0; r < runs; ++r) {
    kiln::Timer t;
    ids = (*tok)->encode(text, false, false);
    times.push_back(t.seconds());
  }
  std::sort(times.begin(), times.end());
  const bool lossless = (*tok)->decode(ids) == text;
  std::printf("vocab %s (%s/%s): load %.3f s; %zu bytes -> %zu tokens; encode median %.3f s (min %.3f, max %.3f) "
              "over %d runs = %.2f MB/s; round trip %s\n",
              argv[1], (*tok)->model_name().c_str(), (*tok)->pre_name().c_str(), load_s, text.size(), ids.size(),
              times[times.size() / 2], times.front(), times.back(), runs, text.size() / times[times.size() / 2] / 1e6,
              lossless ? "exact" : "DIFFERS");
  return 0;
}
