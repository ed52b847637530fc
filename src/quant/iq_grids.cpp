// The i-quant grid and sign tables (quant/iq_grids.h), from the generated initializer lists of quant/iq_grids.inc.
#include "quant/iq_grids.h"

#include "quant/iq_grids.inc"

namespace kiln {

alignas(64) const uint64_t kIq2xxsGrid[256] = {KILN_IQ2XXS_GRID};
alignas(64) const uint64_t kIq2xsGrid[512] = {KILN_IQ2XS_GRID};
alignas(64) const uint64_t kIq2sGrid[1024] = {KILN_IQ2S_GRID};
alignas(64) const uint32_t kIq3xxsGrid[256] = {KILN_IQ3XXS_GRID};
alignas(64) const uint32_t kIq3sGrid[512] = {KILN_IQ3S_GRID};
alignas(64) const uint64_t kIq1sGrid[2048] = {KILN_IQ1S_GRID};
alignas(64) const uint8_t kIqSigns[128] = {KILN_IQ_SIGNS};

}  // namespace kiln
