// Backend registry: every backend this build has registers a factory here (the CPU backend always; the CUDA backend
// in a KILN_CUDA build). Callers above the backend layer (CLI, server, tests) list devices and create backends
// through it, by the device id the --device flag takes: "cpu", "cuda" (= "cuda:0"), "cuda:N".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace kiln {

struct BackendOptions {
  int n_threads = 0;       // CPU: worker threads (0: all cores)
  bool reference = false;  // CPU: the scalar reference ops (tests)
};

struct DeviceInfo {
  std::string id;           // "cpu", "cuda:0"
  std::string description;  // e.g. "avx512, 16 threads" / "NVIDIA H200, sm_90, 132 SMs"
  uint64_t memory_total = 0, memory_free = 0;  // bytes (0: unknown / host memory)
};

struct BackendFactory {
  const char* kind;  // "cpu", "cuda": the id prefix
  // Devices of this kind present now (may be empty: a CUDA build on a machine without a GPU).
  Result<std::vector<DeviceInfo>> (*devices)();
  // A new backend instance on device `index` (each call: its own memory and streams/threads).
  Result<std::unique_ptr<Backend>> (*create)(int index, const BackendOptions& opts);
};

// The factories of this build, CPU first.
const std::vector<const BackendFactory*>& backend_factories();
// Every device of every factory, in order.
Result<std::vector<DeviceInfo>> list_devices();
// Creates a backend by device id. "auto": the first GPU when one is present, else the CPU. Errors name the id and
// list what exists.
Result<std::unique_ptr<Backend>> create_backend(const std::string& device, const BackendOptions& opts);
// The id "auto" resolves to now ("cuda:0" or "cpu").
std::string resolve_device(const std::string& device);

}  // namespace kiln
