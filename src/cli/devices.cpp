// kiln devices: what this build can run on here: the CPU (threads, the SIMD level the kernels dispatch to) and,
// in a CUDA build, every GPU with its compute capability and memory.
#include <cstdio>
#include <string>

#include "backend/registry.h"
#include "cli/args.h"

namespace kiln::cli {
namespace {

int cmd_devices(int argc, char** argv) {
  ArgParser args("devices", "Lists the CPU and GPU devices this build of kiln can use.");
  if (Status st = args.parse(argc, argv); !st.is_ok()) return fail("devices", st);
  if (args.help_requested()) {
    std::printf("%s", args.usage().c_str());
    return 0;
  }
  // Each backend of this build describes its devices (backend/registry.h).
  for (const BackendFactory* f : backend_factories()) {
    auto lines = f->report();
    if (!lines.is_ok()) return fail("devices", lines.status());
    std::fputs(lines->c_str(), stdout);
  }
  if (!find_backend_factory("cuda")) std::printf("cuda: not in this build (configure with -DKILN_CUDA=ON)\n");
  // What --device accepts here, from the backend registry (the same list the placement resolves against).
  auto all = list_devices();
  if (!all.is_ok()) return fail("devices", all.status());
  std::string ids;
  for (const DeviceInfo& d : *all) ids += (ids.empty() ? "" : ", ") + d.id;
  std::printf("--device: %s (auto = %s)\n", ids.c_str(), resolve_device("auto").c_str());
  return 0;
}

KILN_REGISTER_COMMAND("devices", "list the CPU and GPUs this build can use", cmd_devices);

}  // namespace
}  // namespace kiln::cli
