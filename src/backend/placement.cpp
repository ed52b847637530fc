#include "backend/placement.h"

#include <algorithm>

namespace kiln {

Status Placement::check(int64_t n_layer) const {
  if (static_cast<int64_t>(layers.size()) != n_layer)
    return make_error(ErrorCode::kInvalidArgument, "placement: %zu layers assigned, the model has %lld",
                      layers.size(), static_cast<long long>(n_layer));
  for (size_t i = 0; i < layers.size(); ++i)
    if (!layers[i]) return make_error(ErrorCode::kInvalidArgument, "placement: layer %zu has no backend", i);
  if (!input || !output) return make_error(ErrorCode::kInvalidArgument, "placement: input or output has no backend");
  return Status::ok();
}

std::vector<Backend*> Placement::backends() const {
  std::vector<Backend*> out;
  auto add = [&](Backend* b) {
    if (b && std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  };
  add(input.get());
  for (const auto& l : layers) add(l.get());
  add(output.get());
  return out;
}

int64_t Placement::n_offloaded() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l && !l->host_memory();
  return n;
}

std::string Placement::describe() const {
  const std::vector<Backend*> bs = backends();
  if (bs.size() == 1) return bs[0]->name();
  std::string s;
  for (size_t bi = 0; bi < bs.size(); ++bi) {
    std::string part;
    int64_t run_start = -1;
    auto flush = [&](int64_t end) {
      if (run_start < 0) return;
      part += (part.empty() ? "" : ",") + std::to_string(run_start);
      if (end - 1 > run_start) part += "-" + std::to_string(end - 1);
      run_start = -1;
    };
    for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i) {
      if (layers[i].get() == bs[bi]) {
        if (run_start < 0) run_start = i;
      } else {
        flush(i);
      }
    }
    flush(static_cast<int64_t>(layers.size()));
    std::string what = part.empty() ? "" : "layers " + part;
    if (input.get() == bs[bi]) what = "input" + std::string(what.empty() ? "" : " + ") + what;
    if (output.get() == bs[bi]) what += std::string(what.empty() ? "" : " + ") + "output";
    s += (s.empty() ? "" : "; ") + std::string(bs[bi]->name()) + " #" + std::to_string(bi) + ": " + what;
  }
  return s;
}

Result<Placement> place_layers(const DeviceRequest& req, int64_t n_layer) {
  if (n_layer <= 0) return make_error(ErrorCode::kInvalidArgument, "placement: n_layer %lld", (long long)n_layer);
  if (req.n_gpu_layers < -1)
    return make_error(ErrorCode::kInvalidArgument, "-ngl: must be >= 0, or -1 for all layers (got %d)",
                      req.n_gpu_layers);
  const std::string id = resolve_device(req.device);
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
