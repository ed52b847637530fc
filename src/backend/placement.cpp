#include "backend/placement.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <regex>

#include "backend/registry.h"
#include "util/thread_pool.h"

namespace kiln {

Result<SplitMode> parse_split_mode(const std::string& s) {
  if (s == "none") return SplitMode::kNone;
  if (s == "layer") return SplitMode::kLayer;
  if (s == "tensor" || s == "row") return SplitMode::kTensor;  // "row": llama.cpp's name for its tensor split
  return make_error(ErrorCode::kInvalidArgument, "--split-mode: '%s' is not none, layer or tensor", s.c_str());
}

const char* split_mode_name(SplitMode m) {
  return m == SplitMode::kLayer ? "layer" : m == SplitMode::kTensor ? "tensor" : "none";
}

Result<std::vector<float>> parse_tensor_split(const std::string& s) {
  std::vector<float> out;
  size_t i = 0;
  double sum = 0;
  while (true) {
    const size_t j = s.find_first_of(",/", i);  // llama.cpp accepts both separators
    const std::string part = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    char* end = nullptr;
    const double v = part.empty() ? -1 : std::strtod(part.c_str(), &end);
    if (part.empty() || !end || *end != '\0' || !std::isfinite(v) || v < 0 || v > 1e6)
      return make_error(ErrorCode::kInvalidArgument, "--tensor-split: '%s' is not a list of proportions >= 0 "
                        "(e.g. 3,1)", s.c_str());
    out.push_back(static_cast<float>(v));
    sum += v;
    if (j == std::string::npos) break;
    i = j + 1;
  }
  if (out.size() > 64) return make_error(ErrorCode::kInvalidArgument, "--tensor-split: more than 64 proportions");
  if (sum <= 0) return make_error(ErrorCode::kInvalidArgument, "--tensor-split: '%s' has no share > 0", s.c_str());
  return out;
}

namespace {

int count_gpus() {
  auto devs = list_devices();
  int n = 0;
  if (devs)
    for (const DeviceInfo& d : *devs) n += d.id.rfind("cuda:", 0) == 0;
  return n;
}

}  // namespace

Result<std::vector<std::string>> resolve_device_list(const std::string& device, SplitMode mode, int main_gpu) {
  std::vector<std::string> ids;
  const int n_gpu = count_gpus();
  if (main_gpu < 0 || (main_gpu > 0 && main_gpu >= n_gpu))
    return make_error(ErrorCode::kInvalidArgument, "--main-gpu: %d is not a GPU of this machine (%d present)",
                      main_gpu, n_gpu);
  if (device.find(',') != std::string::npos) {
    size_t i = 0;
    while (true) {
      const size_t j = device.find(',', i);
      std::string id = device.substr(i, j == std::string::npos ? std::string::npos : j - i);
      if (id.empty() || id == "auto" || id == "cuda")
        return make_error(ErrorCode::kInvalidArgument, "--device: '%s': a list names each device (cpu, cuda:N), "
                          "got '%s'", device.c_str(), id.c_str());
      ids.push_back(id);
      if (j == std::string::npos) break;
      i = j + 1;
    }
    if (mode == SplitMode::kNone)
      return make_error(ErrorCode::kInvalidArgument, "--device: the list '%s' needs --split-mode layer or tensor",
                        device.c_str());
    for (size_t a = 0; a < ids.size(); ++a)
      for (size_t b = a + 1; b < ids.size(); ++b)
        if (ids[a] == ids[b] && ids[a] != "cpu")
          return make_error(ErrorCode::kInvalidArgument, "--device: '%s' names %s twice", device.c_str(),
                            ids[a].c_str());
    return ids;
  }
  const std::string id = resolve_device(device);
  if (mode != SplitMode::kNone && (device == "auto" || device == "cuda") && n_gpu > 1) {
    for (int g = 0; g < n_gpu; ++g) ids.push_back("cuda:" + std::to_string(g));
    return ids;
  }
  if (mode == SplitMode::kNone && main_gpu > 0 && (device == "auto" || device == "cuda"))
    return std::vector<std::string>{"cuda:" + std::to_string(main_gpu)};
  return std::vector<std::string>{id};
}

Status check_split_request(const DeviceRequest& req, size_t n_devices) {
  if (!req.tensor_split.empty() && req.tensor_split.size() != n_devices)
    return make_error(ErrorCode::kInvalidArgument, "--tensor-split: %zu proportions for %zu device%s (%s)",
                      req.tensor_split.size(), n_devices, n_devices == 1 ? "" : "s", req.device.c_str());
  if (req.split_mode != SplitMode::kTensor) return Status::ok();
  if (n_devices < 2)
    return make_error(ErrorCode::kInvalidArgument, "--split-mode tensor: needs at least 2 devices (got '%s'; name "
                      "them with --device cuda:0,cuda:1, or cpu,cpu for CPU ranks)", req.device.c_str());
  for (float f : req.tensor_split)
    if (f != req.tensor_split[0])
      return make_error(ErrorCode::kInvalidArgument, "--tensor-split: --split-mode tensor needs equal shares "
                        "(kiln shards every matrix evenly across the ranks)");
  if (req.n_gpu_layers != -1)
    return make_error(ErrorCode::kInvalidArgument, "-ngl: --split-mode tensor runs every layer on the ranks (-ngl %d "
                      "is not -1)", req.n_gpu_layers);
  if (!req.experts.empty())
    return make_error(ErrorCode::kInvalidArgument, "--cpu-moe / --n-cpu-moe / -ot: not with --split-mode tensor "
                      "(every rank holds a shard of every expert)");
  return Status::ok();
}

Result<TensorParallelGroup> make_tensor_parallel_group(const DeviceRequest& req) {
  if (req.split_mode != SplitMode::kTensor)
    return make_error(ErrorCode::kInternal, "make_tensor_parallel_group: split mode is %s",
                      split_mode_name(req.split_mode));
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> ids,
                        resolve_device_list(req.device, req.split_mode, req.main_gpu));
  KILN_TRY(check_split_request(req, ids.size()));
  TensorParallelGroup g;
  BackendOptions bo = req.backend;
  const bool cpu = ids[0] == "cpu";
  if (cpu && bo.n_threads == 0) bo.n_threads = std::max(1, default_thread_count() / static_cast<int>(ids.size()));
  for (const std::string& id : ids) {
    if ((id == "cpu") != cpu)
      return make_error(ErrorCode::kInvalidArgument, "--device: '%s' mixes CPU and GPU ranks (tensor parallel ranks "
                        "are all CPU or all GPUs)", req.device.c_str());
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, create_backend(id, bo));
    g.ranks.push_back(std::shared_ptr<Backend>(std::move(b)));
  }
  std::vector<Backend*> bs;
  for (const auto& b : g.ranks) bs.push_back(b.get());
  auto comms = make_comm_group(ids[0], bs);  // the in-process group on CPU ranks, NCCL on GPUs
  if (!comms) return comms.status().with_context("--split-mode tensor");
  for (auto& c : *comms) g.comms.push_back(std::shared_ptr<Communicator>(std::move(c)));
  return g;
}

Status Placement::check(int64_t n_layer) const {
  if (static_cast<int64_t>(layers.size()) != n_layer)
    return make_error(ErrorCode::kInvalidArgument, "placement: %zu layers assigned, the model has %lld",
                      layers.size(), static_cast<long long>(n_layer));
  for (size_t i = 0; i < layers.size(); ++i)
    if (!layers[i]) return make_error(ErrorCode::kInvalidArgument, "placement: layer %zu has no backend", i);
  if (!experts.empty() && experts.size() != layers.size())
    return make_error(ErrorCode::kInvalidArgument, "placement: experts of %zu layers assigned, the model has %zu",
                      experts.size(), layers.size());
  if (!input || !output) return make_error(ErrorCode::kInvalidArgument, "placement: input or output has no backend");
  return Status::ok();
}

std::vector<Backend*> Placement::backends() const {
  std::vector<Backend*> out;
  auto add = [&](Backend* b) {
    if (b && std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  };
  add(input.get());
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i) {
    add(layers[i].get());
    add(experts_of(i));
  }
  add(output.get());
  return out;
}

int64_t Placement::n_offloaded() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l && !l->host_memory();
  return n;
}

int64_t Placement::n_experts_apart() const {
  int64_t n = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(experts.size()); ++i) n += experts_of(i) != layers[i].get();
  return n;
}

namespace {

// "0-9,12" for the indices i in [0, n) where in(i) holds.
template <class In>
std::string index_runs(int64_t n, In in) {
  std::string part;
  int64_t run_start = -1;
  auto flush = [&](int64_t end) {
    if (run_start < 0) return;
    part += (part.empty() ? "" : ",") + std::to_string(run_start);
    if (end - 1 > run_start) part += "-" + std::to_string(end - 1);
    run_start = -1;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (in(i)) {
      if (run_start < 0) run_start = i;
    } else {
      flush(i);
    }
  }
  flush(n);
  return part;
}

}  // namespace

std::string Placement::describe() const {
  if (tp_ranks.size() > 1) {
    std::string s = "tensor parallel over " + std::to_string(tp_ranks.size()) + " ranks (";
    for (size_t r = 0; r < tp_ranks.size(); ++r) s += (r ? ", " : "") + std::string(tp_ranks[r]->name());
    return s + ")";
  }
  const std::vector<Backend*> bs = backends();
  if (bs.size() == 1) return bs[0]->name();
  const int64_t n = static_cast<int64_t>(layers.size());
  std::string s;
  for (size_t bi = 0; bi < bs.size(); ++bi) {
    const Backend* b = bs[bi];
    std::vector<std::string> what;
    if (input.get() == b) what.push_back("input");
    const std::string ex = index_runs(n, [&](int64_t i) { return experts_of(i) == b && layers[i].get() != b; });
    if (!ex.empty()) what.push_back("experts of layers " + ex);
    const std::string ls = index_runs(n, [&](int64_t i) { return layers[i].get() == b; });
    if (!ls.empty()) what.push_back("layers " + ls);
    if (output.get() == b) what.push_back("output");
    std::string part;
    for (const std::string& w : what) part += (part.empty() ? "" : " + ") + w;
    s += (s.empty() ? "" : "; ") + std::string(b->name()) + " #" + std::to_string(bi) + ": " + part;
  }
  return s;
}

namespace {

// An -ot pattern as std::regex (ECMAScript, llama.cpp's grammar); a bad one is an error naming -ot.
Result<std::regex> compile_pattern(const std::string& pattern) {
  try {
    return std::regex(pattern);
  } catch (const std::regex_error& e) {
    return make_error(ErrorCode::kInvalidArgument, "-ot: '%s' is not a regular expression (%s)", pattern.c_str(),
                      e.what());
  }
}

}  // namespace

Result<std::vector<TensorOverride>> parse_tensor_overrides(const std::string& value) {
  std::vector<TensorOverride> out;
  size_t i = 0;
  while (true) {
    const size_t j = value.find(',', i);
    const std::string item = value.substr(i, j == std::string::npos ? std::string::npos : j - i);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      return make_error(ErrorCode::kInvalidArgument, "-ot: '%s' is not PATTERN=BUFTYPE (e.g. exps=CPU)",
                        item.c_str());
    TensorOverride o;
    o.pattern = item.substr(0, eq);
    o.buftype = item.substr(eq + 1);
    for (char& c : o.buftype) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (o.buftype != "CPU")
      return make_error(ErrorCode::kUnsupported, "-ot: buffer type '%s' in '%s': only CPU is supported for now",
                        item.substr(eq + 1).c_str(), item.c_str());
    KILN_TRY(compile_pattern(o.pattern).status());
    out.push_back(std::move(o));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

namespace {

// The layer of a blk.N.* name, or -1.
int64_t layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  char* end = nullptr;
  const long long il = std::strtoll(name.c_str() + 4, &end, 10);
  return end != name.c_str() + 4 && *end == '.' && il >= 0 ? il : -1;
}

}  // namespace

bool is_expert_tensor(const std::string& name) {
  return layer_of(name) >= 0 && name.find("_exps") != std::string::npos;
}

bool goes_with_experts(const std::string& name) {
  return is_expert_tensor(name) || (layer_of(name) >= 0 && name.find(".ffn_gate_inp.") != std::string::npos);
}

Result<std::vector<bool>> resolve_expert_layers(const ExpertRequest& req, const std::vector<std::string>& names,
                                                int64_t n_layer) {
  if (req.n_cpu_moe < 0)
    return make_error(ErrorCode::kInvalidArgument, "--n-cpu-moe: must be >= 0 (got %lld)",
                      static_cast<long long>(req.n_cpu_moe));
  // Only layers that hold expert tensors are marked (a dense layer has nothing to move).
  std::vector<bool> on_cpu(static_cast<size_t>(std::max<int64_t>(n_layer, 0)), false);
  for (const std::string& name : names) {
    const int64_t il = layer_of(name);
    if (il >= 0 && il < n_layer && il < req.n_cpu_moe && is_expert_tensor(name))
      on_cpu[static_cast<size_t>(il)] = true;
  }
  for (const TensorOverride& o : req.overrides) {
    if (o.buftype != "CPU")
      return make_error(ErrorCode::kUnsupported, "-ot: buffer type '%s': only CPU is supported for now",
                        o.buftype.c_str());
    KILN_ASSIGN_OR_RETURN(const std::regex re, compile_pattern(o.pattern));
    for (const std::string& name : names) {
      if (!std::regex_search(name, re)) continue;
      if (!is_expert_tensor(name))
        return make_error(ErrorCode::kUnsupported, "-ot: '%s' matches tensor '%s': only expert tensors "
                          "(blk.N.ffn_*_exps) can be overridden for now", o.pattern.c_str(), name.c_str());
      const int64_t il = layer_of(name);
      if (il < n_layer) on_cpu[static_cast<size_t>(il)] = true;
    }
  }
  return on_cpu;
}

Status place_experts(const std::vector<bool>& on_cpu, const BackendOptions& opts, Placement& p) {
  std::shared_ptr<Backend> host;
  auto consider = [&](const std::shared_ptr<Backend>& b) {
    if (!host && b && b->host_memory()) host = b;
  };
  consider(p.input);
  for (const auto& l : p.layers) consider(l);
  consider(p.output);
  for (size_t il = 0; il < on_cpu.size() && il < p.layers.size(); ++il) {
    if (!on_cpu[il] || p.layers[il]->host_memory()) continue;
    if (!host) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> c, create_backend("cpu", opts));
      host = std::shared_ptr<Backend>(std::move(c));
    }
    if (p.experts.empty()) p.experts.resize(p.layers.size());
    p.experts[il] = host;
  }
  return Status::ok();
}

namespace {

// --split-mode layer over the devices `ids` (>= 2): the offloaded layers [first, n_layer) in consecutive runs, device
// d taking its --tensor-split share (cumulative fractions rounded as llama.cpp: layer i goes to the first device
// whose cumulative share exceeds (i - first) / n_off); the output on the last device that holds a layer (llama.cpp
// counts the output as one more layer, so with -ngl <= n_layer it stays on the CPU); the input on the first
// device when every layer and the output are offloaded, else on the CPU. CPU ids in the list are separate CPU
// backend instances.
Result<Placement> place_layer_split(const DeviceRequest& req, const std::vector<std::string>& ids, int64_t n_layer) {
  std::vector<float> share = req.tensor_split;
  if (share.empty()) share.assign(ids.size(), 1.0f);
  if (share.size() != ids.size())
    return make_error(ErrorCode::kInvalidArgument, "--tensor-split: %zu proportions for %zu devices", share.size(),
                      ids.size());
  std::vector<std::shared_ptr<Backend>> devs;
  bool all_cpu = true;
  for (const std::string& id : ids) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, create_backend(id, req.backend));
    all_cpu = all_cpu && b->host_memory();
    devs.push_back(std::shared_ptr<Backend>(std::move(b)));
  }
  const int64_t ngl = all_cpu || req.n_gpu_layers < 0 ? n_layer + 1 : req.n_gpu_layers;
  const int64_t first = std::max<int64_t>(0, n_layer - ngl), n_off = n_layer - first;
  const bool out_dev = ngl > n_layer;
  std::shared_ptr<Backend> host;
  if (first > 0 || !out_dev) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> c, create_backend("cpu", req.backend));
    host = std::shared_ptr<Backend>(std::move(c));
  }
  double total = 0;
  for (float f : share) total += f;
  Placement p;
  p.layers.resize(static_cast<size_t>(n_layer));
  size_t last = 0;
  for (int64_t i = 0; i < n_layer; ++i) {
    if (i < first) {
      p.layers[i] = host;
      continue;
    }
    const double at = static_cast<double>(i - first) / static_cast<double>(n_off);
    double cum = 0;
    size_t d = 0;
    for (; d + 1 < devs.size(); ++d) {
      cum += share[d] / total;
      if (at < cum) break;
    }
    p.layers[i] = devs[d];
    last = d;
  }
  p.output = out_dev ? devs[last] : host;
  p.input = first == 0 && out_dev ? p.layers[0] : (host ? host : p.layers[0]);
  return p;
}

}  // namespace

Result<Placement> place_layers(const DeviceRequest& req, int64_t n_layer) {
  if (n_layer <= 0) return make_error(ErrorCode::kInvalidArgument, "placement: n_layer %lld", (long long)n_layer);
  if (req.n_gpu_layers < -1)
    return make_error(ErrorCode::kInvalidArgument, "-ngl: must be >= 0, or -1 for all layers (got %d)",
                      req.n_gpu_layers);
  if (req.split_mode == SplitMode::kTensor)
    return make_error(ErrorCode::kInternal, "placement: --split-mode tensor is a tensor-parallel group, not a "
                      "placement");
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> ids, resolve_device_list(req.device, req.split_mode, req.main_gpu));
  if (ids.size() > 1) return place_layer_split(req, ids, n_layer);
  const std::string id = ids[0];
  Placement p;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> main, create_backend(id, req.backend));
  std::shared_ptr<Backend> dev(std::move(main));
  const bool on_cpu = dev->host_memory();
  // Layers [first_dev, n_layer) on the device; the output too when ngl exceeds n_layer (llama.cpp counts the
  // output as one more layer).
  const int64_t ngl = on_cpu || req.n_gpu_layers < 0 ? n_layer + 1 : req.n_gpu_layers;
  const int64_t first_dev = std::max<int64_t>(0, n_layer - ngl);
  const bool out_dev = ngl > n_layer;
  std::shared_ptr<Backend> host;
  if (!on_cpu && (first_dev > 0 || !out_dev)) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> c, create_backend("cpu", req.backend));
    host = std::shared_ptr<Backend>(std::move(c));
  }
  p.layers.resize(static_cast<size_t>(n_layer));
  for (int64_t i = 0; i < n_layer; ++i) p.layers[i] = i >= first_dev ? dev : host;
  p.output = out_dev ? dev : host;
  p.input = first_dev == 0 && out_dev ? dev : (host ? host : dev);
  return p;
}

}  // namespace kiln
