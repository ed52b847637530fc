// Placement: which backend holds what. Per layer: its weights, its KV storage and the workspace its ops run in;
// separately the input (token embedding lookup) and the output (final norm + output projection, logits/argmax).
// Activations cross a boundary between two backends through copy_between (backend.h). The caller picks the
// devices (DeviceRequest: --device, -ngl) and Model::load resolves them with the model's layer count, or the caller
// passes an explicit Placement (tests: layers split across two CPU backend instances).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "util/status.h"

namespace kiln {

struct Placement {
  std::vector<std::shared_ptr<Backend>> layers;  // [n_layer]
  std::shared_ptr<Backend> input, output;

  bool empty() const { return layers.empty(); }
  // Every layer, the input and the output are set, and there are n_layer layers.
  Status check(int64_t n_layer) const;
  // The distinct backend instances, in first-use order (input, layers, output).
  std::vector<Backend*> backends() const;
  // Layers on a backend other than the CPU (what llama-bench reports as n_gpu_layers).
  int64_t n_offloaded() const;
  // "cpu", "cuda:0", or "cpu: layers 0-9, cuda:0: layers 10-31 + output".
  std::string describe() const;
};

// What the user asked for.
struct DeviceRequest {
  std::string device = "auto";  // --device: auto | cpu | cuda | cuda:N
  // -ngl (llama.cpp's meaning): the last N layers, then the output, go on the device; the rest and the token
  // embedding stay on the CPU. -1: everything on the device (input and output too). Ignored for --device cpu.
  int n_gpu_layers = -1;
  BackendOptions backend;  // CPU threads, reference ops
};

// Creates the backends (one device instance + a CPU instance when layers stay on the CPU) and assigns layers.
// With every layer and the output on the device, the token embedding goes there too (no host round trip per step;
// llama.cpp keeps it on the CPU).
Result<Placement> place_layers(const DeviceRequest& req, int64_t n_layer);

}  // namespace kiln
