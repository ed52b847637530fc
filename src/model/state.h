// The ModelState implementation (model/step.h): KV storage, per-backend workspace, pinned staging, execute, fetch.
// Internal to the model layer; Model::create_state is the public way in.
#pragma once

#include <memory>

#include "backend/placement.h"
#include "model/arch.h"
#include "model/step.h"

namespace kiln {

Result<std::unique_ptr<ModelState>> make_model_state(const HParams& hp, const ArchDef& arch, const Weights& w,
                                                     const Placement& place, const StepCaps& caps);
// Bytes of K+V storage for these caps over all layers.
uint64_t kv_storage_bytes(const HParams& hp, const StepCaps& caps);

}  // namespace kiln
