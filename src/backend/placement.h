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
#include "backend/comm.h"
#include "backend/registry.h"
#include "util/status.h"

namespace kiln {

struct Placement {
  std::vector<std::shared_ptr<Backend>> layers;  // [n_layer]
  std::shared_ptr<Backend> input, output;
  // Tensor parallel (set by the model when it runs split by tensors): every rank's backend, rank order. The
  // fields above then describe rank 0 (each rank holds every layer's shards); describe() names all ranks.
  std::vector<std::shared_ptr<Backend>> tp_ranks;

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

// --split-mode (llama.cpp's names; its "row" is kiln's "tensor"):
//   none    one device (the main GPU) holds every layer (-ngl: the rest on the CPU)
//   layer   consecutive layers (and their KV) per device, in --tensor-split proportions (pipeline)
//   tensor  every device holds a shard of every layer's matrices (model/tensor_parallel.h); one all-reduce after
//           attention and one after the FFN. Needs NCCL between GPUs; on the CPU, ranks in one process
//           (--device cpu,cpu: two CPU ranks, the in-process communicator of backend/comm.h).
enum class SplitMode { kNone, kLayer, kTensor };
// "none" | "layer" | "tensor"; the error names --split-mode.
Result<SplitMode> parse_split_mode(const std::string& s);
const char* split_mode_name(SplitMode m);
// "3,1" -> {3, 1}: non-negative finite numbers, at least one > 0; the error names --tensor-split.
Result<std::vector<float>> parse_tensor_split(const std::string& s);
// "cpu,cpu" / "cuda:0,cuda:1" -> the ids; "cuda" with several GPUs present and a split mode other than none ->
// every GPU; one id otherwise. Errors name --device.
Result<std::vector<std::string>> resolve_device_list(const std::string& device, SplitMode mode, int main_gpu);

// What the user asked for.
struct DeviceRequest {
  std::string device = "auto";  // --device: auto | cpu | cuda | cuda:N, or a comma list (split modes)
  // -ngl (llama.cpp's meaning): the last N layers, then the output, go on the device; the rest and the token
  // embedding stay on the CPU. -1: everything on the device (input and output too). Ignored for --device cpu.
  int n_gpu_layers = -1;
  BackendOptions backend;  // CPU threads, reference ops
  SplitMode split_mode = SplitMode::kNone;  // --split-mode
  // --tensor-split: one proportion per device of the list (empty: equal). Layer mode: each device's share of the
  // offloaded layers, as llama.cpp; tensor mode: must be equal (kiln shards matrices evenly).
  std::vector<float> tensor_split;
  // --main-gpu: split mode none with --device auto|cuda: the GPU used (cuda:N); layer/tensor: must be a GPU
  // present (checked), otherwise no effect (the first device of the list holds the input and the logits).
  int main_gpu = 0;
};

// A request against the n_devices its --device resolves to (resolve_device_list): one --tensor-split proportion per
// device; for split mode tensor at least 2 devices, equal shares and -ngl -1. The CLI runs it before anything loads,
// make_tensor_parallel_group again. Errors name the flag.
Status check_split_request(const DeviceRequest& req, size_t n_devices);

// The ranks of a tensor-parallel group: one backend and one communicator per rank (rank order).
struct TensorParallelGroup {
  std::vector<std::shared_ptr<Backend>> ranks;
  std::vector<std::shared_ptr<Communicator>> comms;
  bool empty() const { return ranks.empty(); }
  int size() const { return static_cast<int>(ranks.size()); }
};
// The group a DeviceRequest with SplitMode::kTensor names: CPU ranks (--device cpu,cpu,...) with the in-process
// communicator, or CUDA ranks (one per GPU) with NCCL. Errors: fewer than 2 devices, unequal --tensor-split
// shares, CPU and GPU ranks mixed, -ngl other than -1, a build without NCCL for GPU ranks.
Result<TensorParallelGroup> make_tensor_parallel_group(const DeviceRequest& req);

// Creates the backends (one device instance + a CPU instance when layers stay on the CPU) and assigns layers.
// Split mode layer with several devices: the offloaded layers (the last -ngl) in consecutive runs per device, in
// --tensor-split proportions (default equal), the output on the last device. Split mode tensor is not a
// placement: the model builds a TensorParallelGroup instead (an error here).
// With every layer and the output on the device, the token embedding goes there too (no host round trip per step;
// llama.cpp keeps it on the CPU).
Result<Placement> place_layers(const DeviceRequest& req, int64_t n_layer);

}  // namespace kiln
