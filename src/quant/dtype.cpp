#include "quant/dtype.h"

#include <cctype>
#include <limits>

namespace kiln {

namespace {

struct Row {
  uint32_t id;
  DTypeTraits traits;
};

// Block sizes and bytes as ggml lays the blocks out (see quant/blocks.h for the ones kiln decodes).
constexpr Row kRows[] = {
    {0, {"f32", 1, 4, false, true}},
    {1, {"f16", 1, 2, false, true}},
    {2, {"q4_0", 32, 18, true, true}},
    {3, {"q4_1", 32, 20, true, true}},
    {6, {"q5_0", 32, 22, true, true}},
    {7, {"q5_1", 32, 24, true, true}},
    {8, {"q8_0", 32, 34, true, true}},
    {9, {"q8_1", 32, 36, true, true}},
    {10, {"q2_K", 256, 84, true, true}},
    {11, {"q3_K", 256, 110, true, true}},
    {12, {"q4_K", 256, 144, true, true}},
    {13, {"q5_K", 256, 176, true, true}},
    {14, {"q6_K", 256, 210, true, true}},
    {15, {"q8_K", 256, 292, true, true}},
    {16, {"iq2_xxs", 256, 66, true, true}},
    {17, {"iq2_xs", 256, 74, true, true}},
    {18, {"iq3_xxs", 256, 98, true, true}},
    {19, {"iq1_s", 256, 50, true, true}},
    {20, {"iq4_nl", 32, 18, true, true}},
    {21, {"iq3_s", 256, 110, true, true}},
    {22, {"iq2_s", 256, 82, true, true}},
    {23, {"iq4_xs", 256, 136, true, true}},
    {24, {"i8", 1, 1, false, false}},
    {25, {"i16", 1, 2, false, false}},
    {26, {"i32", 1, 4, false, false}},
    {27, {"i64", 1, 8, false, false}},
    {28, {"f64", 1, 8, false, false}},
    {29, {"iq1_m", 256, 56, true, true}},
    {30, {"bf16", 1, 2, false, true}},
    {34, {"tq1_0", 256, 54, true, true}},
    {35, {"tq2_0", 256, 66, true, true}},
    {39, {"mxfp4", 32, 17, true, true}},
};

struct Table {
  const DTypeTraits* by_id[kDTypeIdLimit] = {};
  constexpr Table() {
    for (const Row& r : kRows) by_id[r.id] = &r.traits;
  }
};
constexpr Table kTable;

}  // namespace

const DTypeTraits* dtype_traits(uint32_t id) { return id < kDTypeIdLimit ? kTable.by_id[id] : nullptr; }
const DTypeTraits& dtype_traits(DType t) { return *kTable.by_id[static_cast<uint32_t>(t)]; }
bool dtype_is_valid(uint32_t id) { return dtype_traits(id) != nullptr; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const Row& r : kRows) {
    std::string_view n = r.traits.name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < n.size() && eq; ++i)
      eq = std::tolower(static_cast<unsigned char>(n[i])) == std::tolower(static_cast<unsigned char>(name[i]));
    if (eq) return static_cast<DType>(r.id);
  }
  return std::nullopt;
}

Result<uint64_t> dtype_row_bytes(DType t, int64_t n) {
  const DTypeTraits& tr = dtype_traits(t);
  if (n < 0 || n % tr.block_size != 0)
    return make_error(ErrorCode::kInvalidArgument, "row of %lld elements is not a multiple of %s's block size %lld",
                      static_cast<long long>(n), tr.name, static_cast<long long>(tr.block_size));
  const uint64_t blocks = static_cast<uint64_t>(n / tr.block_size);
  if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(tr.type_size))
    return make_error(ErrorCode::kOutOfRange, "row of %lld %s elements overflows 64 bits", static_cast<long long>(n),
                      tr.name);
  return blocks * static_cast<uint64_t>(tr.type_size);
}

}  // namespace kiln
