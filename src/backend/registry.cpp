#include "backend/registry.h"

#include <cstdlib>

namespace kiln {

extern const BackendFactory kCpuBackendFactory;  // backend/cpu/cpu_backend.cpp (this library)

namespace {
std::vector<const BackendFactory*>& factories() {
  static std::vector<const BackendFactory*> f = {&kCpuBackendFactory};
  return f;
}
}  // namespace

const std::vector<const BackendFactory*>& backend_factories() { return factories(); }

void register_backend_factory(const BackendFactory* f) {
  for (const BackendFactory* x : factories())
    if (x == f) return;
  factories().push_back(f);
}

const BackendFactory* find_backend_factory(const std::string& kind) {
  for (const BackendFactory* f : factories())
    if (kind == f->kind) return f;
  return nullptr;
}

Result<std::vector<DeviceInfo>> list_devices() {
  std::vector<DeviceInfo> all;
  for (const BackendFactory* f : backend_factories()) {
    auto d = f->devices();
    if (!d) return d.status().with_context(std::string("listing ") + f->kind + " devices");
    for (auto& x : *d) all.push_back(std::move(x));
  }
  return all;
}

namespace {

bool has_gpu() {
  for (const BackendFactory* f : backend_factories()) {
    if (std::string(f->kind) == "cpu") continue;
    auto d = f->devices();
    if (d && !d->empty()) return true;
  }
  return false;
}

std::string known_ids() {
  std::string s;
  auto d = list_devices();
  if (d)
    for (const DeviceInfo& x : *d) s += (s.empty() ? "" : ", ") + x.id;
  return s.empty() ? "none" : s;
}

}  // namespace

std::string resolve_device(const std::string& device) {
  if (device.empty() || device == "auto") return has_gpu() ? "cuda:0" : "cpu";
  if (device == "cuda") return "cuda:0";
  return device;
}

Result<std::vector<std::unique_ptr<Communicator>>> make_comm_group(const std::string& device,
                                                                   const std::vector<Backend*>& ranks) {
  const std::string id = resolve_device(device);
  const BackendFactory* f = find_backend_factory(id.substr(0, id.find(':')));
  if (!f) return make_error(ErrorCode::kInvalidArgument, "--device %s: unknown device kind", device.c_str());
  return f->make_group(ranks);
}

Result<std::unique_ptr<Backend>> create_backend(const std::string& device, const BackendOptions& opts) {
  const std::string id = resolve_device(device);
  const size_t colon = id.find(':');
  const std::string kind = id.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    const std::string num = id.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || v < 0 || v > 1024)
      return make_error(ErrorCode::kInvalidArgument, "--device %s: '%s' is not a device index", device.c_str(),
                        num.c_str());
    index = static_cast<int>(v);
  }
  for (const BackendFactory* f : backend_factories()) {
    if (kind != f->kind) continue;
    if (kind == "cpu" && colon != std::string::npos)
      return make_error(ErrorCode::kInvalidArgument, "--device %s: the CPU takes no index (use 'cpu')",
                        device.c_str());
    KILN_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devs, f->devices());
    if (index >= static_cast<int>(devs.size()))
      return make_error(ErrorCode::kNotFound, "--device %s: no such device (this machine has: %s)", device.c_str(),
                        known_ids().c_str());
    return f->create(index, opts);
  }
  std::string kinds;
  for (const BackendFactory* f : backend_factories()) kinds += (kinds.empty() ? "" : ", ") + std::string(f->kind);
  if (kind == "cuda")
    return make_error(ErrorCode::kUnsupported, "--device %s: this build of kiln has no CUDA backend (configure with "
                      "-DKILN_CUDA=ON)", device.c_str());
  return make_error(ErrorCode::kInvalidArgument, "--device %s: unknown device kind '%s' (this build: %s)",
                    device.c_str(), kind.c_str(), kinds.c_str());
}

}  // namespace kiln
