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
  // Mixture-of-experts layers whose expert tensors live apart from the layer (--cpu-moe: in host memory while the
  // layer runs on a GPU): experts[il] holds layer il's expert stacks, their biases and its router, and runs its
  // moe_ffn (model/forward.h, pieces::moe_ffn). Empty, or nullptr at il: with the layer.
  std::vector<std::shared_ptr<Backend>> experts;  // [n_layer] or empty

  bool empty() const { return layers.empty(); }
  // Every layer, the input and the output are set, there are n_layer layers, and experts is empty or n_layer long.
  Status check(int64_t n_layer) const;
  // The backend holding layer il's expert tensors: experts[il] when set, else the layer's.
  Backend* experts_of(int64_t il) const {
    const size_t i = static_cast<size_t>(il);
    return i < experts.size() && experts[i] ? experts[i].get() : layers[i].get();
  }
  // The distinct backend instances, in first-use order (input, then per layer its backend and its experts',
  // output).
  std::vector<Backend*> backends() const;
  // Layers on a backend other than the CPU (what llama-bench reports as n_gpu_layers).
  int64_t n_offloaded() const;
  // Layers whose experts live apart from the layer.
  int64_t n_experts_apart() const;
  // "cpu", "cuda:0", or "cpu #0: input + layers 0-9; cuda:0 #1: layers 10-31 + output"; experts apart from their
  // layer are named with the backend holding them: "cpu #0: experts of layers 0-31; cuda:0 #1: ...".
  std::string describe() const;
};

// --override-tensor / -ot PATTERN=BUFTYPE (llama.cpp's flag): tensors whose name the regular expression PATTERN
// matches (std::regex_search, ECMAScript grammar, as llama.cpp) are placed on buffer type BUFTYPE. kiln supports
// BUFTYPE CPU on expert tensors (is_expert_tensor) only.
struct TensorOverride {
  std::string pattern;  // as given
  std::string buftype;  // "CPU"
};
// "PATTERN=BUFTYPE[,PATTERN=BUFTYPE...]" (split at commas, each at its first '=') -> the overrides. Errors name -ot:
// no '=', an empty pattern, a pattern that is not a regular expression, a buffer type other than CPU (any case).
Result<std::vector<TensorOverride>> parse_tensor_overrides(const std::string& value);

// Where the expert tensors of mixture-of-experts layers go (--cpu-moe, --n-cpu-moe, -ot). Only layers that run on a
// device are affected: a layer on the CPU keeps its experts.
struct ExpertRequest {
  int64_t n_cpu_moe = 0;  // the experts of layers [0, n_cpu_moe) on the CPU; --cpu-moe: kAllLayers
  std::vector<TensorOverride> overrides;  // -ot, in command-line order
  static constexpr int64_t kAllLayers = INT64_MAX;
  bool empty() const { return n_cpu_moe == 0 && overrides.empty(); }
};

// An expert tensor (what --cpu-moe moves and -ot may override): blk.N.ffn_{gate,up,down}_exps.{weight,bias}, i.e. a
// blk.N.* name holding "_exps". Its layer's router (blk.N.ffn_gate_inp.*) is not one, but goes with them
// (goes_with_experts): Backend::moe_ffn is one op over the router and the expert stacks.
bool is_expert_tensor(const std::string& name);
bool goes_with_experts(const std::string& name);
// Per layer, whether `req` puts its expert tensors on the CPU, given the model's tensor names: --n-cpu-moe N the
// layers [0, min(N, n_layer)); -ot the layer of every tensor a pattern matches (a match on any of a layer's expert
// tensors moves all of them and the router). Errors: a pattern that matches a tensor other than an expert tensor
// (names -ot, the pattern and the tensor), a bad pattern or buffer type (as parse_tensor_overrides).
Result<std::vector<bool>> resolve_expert_layers(const ExpertRequest& req, const std::vector<std::string>& names,
                                                int64_t n_layer);
// Sets p.experts for the layers of `on_cpu` whose backend is not host memory: a CPU backend of the placement (the
// first one, e.g. the one -ngl keeps layers on), else a new one with `opts`. The others stay with their layer.
Status place_experts(const std::vector<bool>& on_cpu, const BackendOptions& opts, Placement& p);

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
  ExpertRequest experts;  // --cpu-moe, --n-cpu-moe, -ot
};

// A request against the n_devices its --device resolves to (resolve_device_list): one --tensor-split proportion per
// device; for split mode tensor at least 2 devices, equal shares, -ngl -1 and no expert placement. The CLI runs it
// before anything loads, make_tensor_parallel_group again. Errors name the flag.
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
