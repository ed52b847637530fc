// The architecture registry: one line per model/arch/<name>.cpp.
#include <string>

#include "model/arch.h"

namespace kiln {

extern const ArchDef kArchLlama;
extern const ArchDef kArchQwen2;
extern const ArchDef kArchQwen3;
extern const ArchDef kArchGemma3;
extern const ArchDef kArchQwen35;
extern const ArchDef kArchQwen3Moe;
extern const ArchDef kArchGptOss;
extern const ArchDef kArchBert;
extern const ArchDef kArchNomicBert;

namespace {
const ArchDef* const kArchs[] = {
    &kArchLlama,
    &kArchQwen2,
    &kArchQwen3,
    &kArchGemma3,
    &kArchQwen35,
    &kArchQwen3Moe,
    &kArchGptOss,
    &kArchBert,
    &kArchNomicBert,
};
}  // namespace

const ArchDef* find_arch(std::string_view name) {
  for (const ArchDef* a : kArchs)
    if (name == a->name) return a;
  return nullptr;
}

std::string supported_archs() {
  std::string s;
  for (const ArchDef* a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a->name);
  return s;
}

}  // namespace kiln
