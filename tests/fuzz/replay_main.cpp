// Driver for fuzz targets without libFuzzer: runs every file of the corpus folder given as argv[1], then
// deterministic mutations of each (byte flips, truncations, splices, random length/count fields), so a plain
// gcc build still pushes hostile inputs through the same entry point. Exit status 0 means no crash; sanitizer
// builds (KILN_SANITIZE) turn memory errors into failures.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS_PER_FILE]\n", argv[0]);
    return 2;
  }
  const int per_file = argc > 2 ? std::atoi(argv[2]) : 400;
  std::vector<std::vector<uint8_t>> corpus;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(argv[1], ec)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  if (ec || corpus.empty()) {
    std::fprintf(stderr, "no corpus files in %s\n", argv[1]);
    return 2;
  }
  std::mt19937_64 rng(12345);
  size_t runs = 0;
  for (auto& seed : corpus) {
    LLVMFuzzerTestOneInput(seed.data(), seed.size());
    ++runs;
    for (int m = 0; m < per_file; ++m) {
      std::vector<uint8_t> x = seed;
      int n_mut = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < n_mut && !x.empty(); ++k) {
        size_t pos = rng() % x.size();
        switch (rng() % 6) {
          case 0: x[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
          case 1: x[pos] = static_cast<uint8_t>(rng()); break;
          case 2: x.resize(pos); break;
          case 3: {  // an extreme little-endian u64 (lengths, counts, dims, offsets)
            static const uint64_t vals[] = {0, 1, 0xffffffffull, 0x7fffffffffffffffull, ~0ull, 1ull << 40};
            uint64_t v = vals[rng() % 6];
            for (size_t b = 0; b < 8 && pos + b < x.size(); ++b) x[pos + b] = static_cast<uint8_t>(v >> (8 * b));
            break;
          }
          case 4: {  // splice from another corpus file
            auto& other = corpus[rng() % corpus.size()];
            if (!other.empty()) {
              size_t from = rng() % other.size();
              size_t len = std::min<size_t>(other.size() - from, 1 + rng() % 64);
              x.insert(x.begin() + static_cast<long>(pos), other.begin() + static_cast<long>(from),
                       other.begin() + static_cast<long>(from + len));
            }
            break;
          }
          default: x.erase(x.begin() + static_cast<long>(pos)); break;
        }
      }
      LLVMFuzzerTestOneInput(x.data(), x.size());
      ++runs;
    }
  }
  std::printf("replayed %zu inputs from %zu corpus files without a crash\n", runs, corpus.size());
  return 0;
}
