// Backend registry: every backend this build has registers a factory here (the CPU backend always; the CUDA backend
// in a KILN_CUDA build, from its own library at start-up: BackendRegistration). Callers above the backend layer (CLI,
// server, tests) and the generic placement code list devices, create backends and their communicators through it,
// by the device id the --device flag takes: "cpu", "cuda" (= "cuda:0"), "cuda:N"; none of them names a specific
// backend's headers (scripts/check_layers.sh).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"
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
  // The communicators of a tensor-parallel group whose ranks are backends of this kind (one per rank, in rank
  // order; backend/comm.h): the in-process group on the CPU, NCCL on GPUs. Errors say what is missing.
  Result<std::vector<std::unique_ptr<Communicator>>> (*make_group)(const std::vector<Backend*>& ranks);
  // The lines `kiln devices` prints for this kind ("cpu:  ...", "cuda: 0: ..."), each ending in a newline.
  Result<std::string> (*report)();
};

// The factories of this build, CPU first, then those registered at start-up in registration order.
const std::vector<const BackendFactory*>& backend_factories();
// The factory of a kind ("cpu", "cuda"); null when this build has none.
const BackendFactory* find_backend_factory(const std::string& kind);
// Registers a backend library's factory; a static BackendRegistration in that library calls it before main (its
// library is linked whole, src/CMakeLists.txt: kiln_backends).
void register_backend_factory(const BackendFactory* f);
struct BackendRegistration {
  explicit BackendRegistration(const BackendFactory* f) { register_backend_factory(f); }
};
// Every device of every factory, in order.
Result<std::vector<DeviceInfo>> list_devices();
// Creates a backend by device id. "auto": the first GPU when one is present, else the CPU. Errors name the id and
// list what exists.
Result<std::unique_ptr<Backend>> create_backend(const std::string& device, const BackendOptions& opts);
// The id "auto" resolves to now ("cuda:0" or "cpu").
std::string resolve_device(const std::string& device);
// The communicators of a tensor-parallel group on `ranks`, all created from device ids of one kind (`device`, the
// first rank's id): the factory of that kind makes them.
Result<std::vector<std::unique_ptr<Communicator>>> make_comm_group(const std::string& device,
                                                                   const std::vector<Backend*>& ranks);

}  // namespace kiln
