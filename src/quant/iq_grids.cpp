// The i-quant grid and sign tables (quant/iq_grids.h), from the generated initializer lists of quant/iq_grids.inc.
#include "quant/iq_grids.h"

#include <array>

#include "quant/iq_grids.inc"

namespace kiln {

namespace {
constexpr uint64_t kIq1sLiteral[2048] = {KILN_IQ1S_GRID};
constexpr std::array<uint64_t, 2048> iq1s_times8_plus1() {
  std::array<uint64_t, 2048> t{};
  for (int i = 0; i < 2048; ++i)
    for (int j = 0; j < 8; ++j) {
      const int g = static_cast<int8_t>(static_cast<uint8_t>(kIq1sLiteral[i] >> (8 * j)));
      t[i] |= static_cast<uint64_t>(static_cast<uint8_t>(8 * g + 1)) << (8 * j);
    }
  return t;
}
}  // namespace

alignas(64) const uint64_t kIq2xxsGrid[256] = {KILN_IQ2XXS_GRID};
alignas(64) const uint64_t kIq2xsGrid[512] = {KILN_IQ2XS_GRID};
alignas(64) const uint64_t kIq2sGrid[1024] = {KILN_IQ2S_GRID};
alignas(64) const uint32_t kIq3xxsGrid[256] = {KILN_IQ3XXS_GRID};
alignas(64) const uint32_t kIq3sGrid[512] = {KILN_IQ3S_GRID};
alignas(64) const uint64_t kIq1sGrid[2048] = {KILN_IQ1S_GRID};
alignas(64) constinit const std::array<uint64_t, 2048> kIq1sGrid8p1 = iq1s_times8_plus1();
alignas(64) const uint8_t kIqSigns[128] = {KILN_IQ_SIGNS};

}  // namespace kiln
