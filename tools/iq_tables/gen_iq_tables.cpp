// Writes src/quant/iq_grids.inc: the grid and sign tables of the i-quant formats, recovered from a libggml-base
// build by dequantizing crafted blocks (README.md says how to run it). Each table entry is found by decoding a
// block whose scale makes the decoded value equal the grid value (or a known multiple of it), with the entry's
// index in the first group and every other field zero, and reading the first group's 8 (or 4) outputs back.
//   usage: gen_iq_tables /path/to/libggml-base.so > src/quant/iq_grids.inc
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

namespace {

// The leading fields of ggml's type-traits record (ggml.h), as far as the converter pointer.
struct TypeTraits {
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  void (*to_float)(const void* x, float* y, int64_t k);
};
using GetTraits = const TypeTraits* (*)(int type);

enum : int { kIq2Xxs = 16, kIq2Xs = 17, kIq3Xxs = 18, kIq1S = 19, kIq3S = 21, kIq2S = 22 };
constexpr uint16_t kHalfOne = 0x3C00;

GetTraits g_traits;

// Decodes one 256-element block of `type` given its bytes.
std::vector<float> decode(int type, const std::vector<uint8_t>& blk) {
  const TypeTraits* t = g_traits(type);
  if (!t || !t->to_float || blk.size() != t->type_size) {
    std::fprintf(stderr, "type %d: no converter or block size %zu != %zu\n", type, blk.size(), t ? t->type_size : 0);
    std::exit(1);
  }
  std::vector<float> y(256);
  t->to_float(blk.data(), y.data(), 256);
  return y;
}

std::vector<uint8_t> block(size_t bytes, bool half_scale_at_0 = true) {
  std::vector<uint8_t> b(bytes, 0);
  if (half_scale_at_0) std::memcpy(b.data(), &kHalfOne, 2);
  return b;
}

// Converts the first n outputs divided by `unit`, minus `offset`, to exact integers (fails loudly otherwise).
uint64_t pack(const std::vector<float>& y, int n, float unit, float offset, bool is_signed) {
  uint64_t v = 0;
  for (int j = 0; j < n; ++j) {
    const float g = y[j] / unit - offset;
    if (g != std::nearbyint(g) || (is_signed ? (g < -128 || g > 127) : (g < 0 || g > 255))) {
      std::fprintf(stderr, "output %d = %g is not an integer grid value\n", j, static_cast<double>(y[j]));
      std::exit(1);
    }
    v |= static_cast<uint64_t>(static_cast<uint8_t>(static_cast<int>(g))) << (8 * j);
  }
  return v;
}

void put_u16(std::vector<uint8_t>& b, size_t off, uint16_t v) { std::memcpy(b.data() + off, &v, 2); }
void put_u32(std::vector<uint8_t>& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }

// One table as an initializer-list macro: `#define NAME \` then the entries, per_line a line.
void emit(const char* name, const std::vector<uint64_t>& v, int bytes, int per_line) {
  std::printf("#define %s \\\n", name);
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % per_line == 0) std::printf("  ");
    std::printf("0x%0*llx", 2 * bytes, static_cast<unsigned long long>(v[i]));
    if (i + 1 == v.size()) std::printf("\n\n");
    else std::printf(i % per_line == static_cast<size_t>(per_line) - 1 ? ", \\\n" : ", ");
  }
}

void check_unique(const char* name, const std::vector<uint64_t>& v) {
  if (std::set<uint64_t>(v.begin(), v.end()).size() != v.size()) {
    std::fprintf(stderr, "%s: duplicate entries\n", name);
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s /path/to/libggml-base.so > iq_grids.inc\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  g_traits = reinterpret_cast<GetTraits>(dlsym(lib, "ggml_get_type_traits"));
  if (!g_traits) {
    std::fprintf(stderr, "dlsym ggml_get_type_traits: %s\n", dlerror());
    return 1;
  }

  // IQ2_XXS: group 0's first index byte; scale nibble 0 gives the unit d * 0.5 * 0.25.
  std::vector<uint64_t> g2xxs(256), g2xs(512), g2s(1024), g3xxs(256), g3s(512), g1s(2048), signs(128);
  for (int i = 0; i < 256; ++i) {
    auto b = block(66);
    b[2] = static_cast<uint8_t>(i);
    g2xxs[i] = pack(decode(kIq2Xxs, b), 8, 0.125f, 0, false);
  }
  // Sign patterns: grid entry 0 (no zero bytes) with 7-bit sign index k in group 0.
  for (int k = 0; k < 128; ++k) {
    auto b = block(66);
    put_u32(b, 6, static_cast<uint32_t>(k));
    const std::vector<float> y = decode(kIq2Xxs, b);
    uint64_t s = 0;
    for (int j = 0; j < 8; ++j) s |= static_cast<uint64_t>(y[j] < 0) << j;
    signs[k] = s;
  }
  // IQ2_XS: 9-bit index in the low bits of qs[0] (u16 at byte 2); scales at 66, nibble 0: unit 0.125.
  for (int i = 0; i < 512; ++i) {
    auto b = block(74);
    put_u16(b, 2, static_cast<uint16_t>(i));
    g2xs[i] = pack(decode(kIq2Xs, b), 8, 0.125f, 0, false);
  }
  // IQ2_S: low 8 index bits in qs[0] (byte 2), bits 8-9 in qh[0] bits 0-1 (byte 66); unit 0.125.
  for (int i = 0; i < 1024; ++i) {
    auto b = block(82);
    b[2] = static_cast<uint8_t>(i & 255);
    b[66] = static_cast<uint8_t>(i >> 8);
    g2s[i] = pack(decode(kIq2S, b), 8, 0.125f, 0, false);
  }
  // IQ3_XXS: index byte qs[0] (byte 2) -> elements 0-3; scale nibble 0: unit d * 0.5 * 0.5.
  for (int i = 0; i < 256; ++i) {
    auto b = block(98);
    b[2] = static_cast<uint8_t>(i);
    g3xxs[i] = pack(decode(kIq3Xxs, b), 4, 0.25f, 0, false);
  }
  // IQ3_S: low 8 index bits in qs[0] (byte 2), bit 8 in qh[0] bit 0 (byte 66); scale 0: unit d * 1.
  for (int i = 0; i < 512; ++i) {
    auto b = block(110);
    b[2] = static_cast<uint8_t>(i & 255);
    b[66] = static_cast<uint8_t>(i >> 8);
    g3s[i] = pack(decode(kIq3S, b), 4, 1.0f, 0, false);
  }
  // IQ1_S: low 8 index bits in qs[0] (byte 2), bits 8-10 in qh[0] bits 0-2 (u16 at byte 34); scale field 0 and
  // delta sign 0: value = d * (grid + 1/8).
  for (int i = 0; i < 2048; ++i) {
    auto b = block(50);
    b[2] = static_cast<uint8_t>(i & 255);
    put_u16(b, 34, static_cast<uint16_t>(i >> 8));
    g1s[i] = pack(decode(kIq1S, b), 8, 1.0f, 0.125f, true);
  }
  check_unique("iq2xxs", g2xxs);
  check_unique("iq2xs", g2xs);
  check_unique("iq2s", g2s);
  check_unique("iq3xxs", g3xxs);
  check_unique("iq3s", g3s);
  check_unique("iq1s", g1s);
  check_unique("signs", signs);

  std::printf(
      "// Generated by tools/iq_tables/gen_iq_tables from libggml-base's dequantizers (crafted blocks, one grid index\n"
      "// or sign index at a time; tools/iq_tables/README.md). Do not edit: regenerate. The i-quant grid and sign\n"
      "// tables as initializer lists, one macro per table, for the host tables (quant/iq_grids.cpp) and the CUDA\n"
      "// backend's device copies. Meaning of each table: quant/iq_grids.h.\n"
      "#pragma once\n\n");
  emit("KILN_IQ2XXS_GRID", g2xxs, 8, 6);
  emit("KILN_IQ2XS_GRID", g2xs, 8, 6);
  emit("KILN_IQ2S_GRID", g2s, 8, 6);
  emit("KILN_IQ3XXS_GRID", g3xxs, 4, 10);
  emit("KILN_IQ3S_GRID", g3s, 4, 10);
  emit("KILN_IQ1S_GRID", g1s, 8, 6);
  std::vector<uint64_t> s8(signs.begin(), signs.end());
  emit("KILN_IQ_SIGNS", s8, 1, 16);
  return 0;
}
