// kiln devices: what this build can run on here: the CPU (threads, the SIMD level the kernels dispatch to) and,
// in a CUDA build, every GPU with its compute capability and memory.
#include <cstdio>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "backend/registry.h"
#include "cli/args.h"
#include "util/thread_pool.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/device.h"
#endif

namespace kiln::cli {
namespace {

int cmd_devices(int argc, char** argv) {
  ArgParser args("devices", "Lists the CPU and GPU devices this build of kiln can use.");
  if (Status st = args.parse(argc, argv); !st.is_ok()) return fail("devices", st);
  if (args.help_requested()) {
    std::printf("%s", args.usage().c_str());
    return 0;
  }
  const cpu::CpuFeatures& f = cpu::cpu_features();
  std::string feats;
  auto add = [&](bool on, const char* name) {
    if (on) feats += std::string(feats.empty() ? "" : " ") + name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.bmi2, "bmi2");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512bf16, "avx512bf16");
  std::printf("cpu:  %d threads, kernels %s (features: %s)\n", default_thread_count(),
              cpu::simd_level_name(cpu::matmul_simd_level()), feats.empty() ? "none" : feats.c_str());
#ifdef KILN_HAVE_CUDA
  auto devs = cuda::list_devices();
  if (!devs.is_ok()) return fail("devices", devs.status());
  if (devs->empty()) std::printf("cuda: no device found (kiln runs on the CPU)\n");
  for (const cuda::DeviceInfo& d : *devs)
    std::printf("cuda: %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free), %zu KiB shared memory per block\n", d.index,
                d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count, d.total_mem / 1073741824.0,
                d.free_mem / 1073741824.0, d.smem_per_block_optin / 1024);
#else
  std::printf("cuda: not in this build (configure with -DKILN_CUDA=ON)\n");
#endif
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
