// What one kernel node costs inside a CUDA graph on this GPU, with and without programmatic dependent launch:
// graphs of N dependent tiny kernels (each reads what the previous wrote: a chain, as a decode step is), replayed
// after warm-up; prints us per node (median of 7 replays of 20). Reference for the decode step's ~400 nodes.
//   nvcc -O2 -arch=sm_90 -o graph_overhead dev/cuda/graph_overhead.cu && ./graph_overhead
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("%s failed at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

template <bool PDL>
__global__ void step(float* buf, int n) {
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = buf[i] * 0.999f + 1.0f;  // depends on the previous node's write
}

int run(int nodes, int blocks, bool pdl, cudaStream_t s, float* buf) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < nodes; ++i) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(128);
    cfg.stream = s;
    cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = a;
    cfg.numAttrs = pdl ? 1 : 0;
    if (pdl) CK(cudaLaunchKernelEx(&cfg, step<true>, buf, blocks * 128));
    else CK(cudaLaunchKernelEx(&cfg, step<false>, buf, blocks * 128));
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, s));
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    for (int k = 0; k < 20; ++k) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e3f / 20 / nodes);
  }
  std::sort(t.begin(), t.end());
  std::printf("nodes %4d blocks %4d pdl %d: %.2f us per node\n", nodes, blocks, pdl ? 1 : 0, t[3]);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return 0;
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* buf;
  CK(cudaMalloc(&buf, 1024 * 128 * sizeof(float)));
  CK(cudaMemset(buf, 0, 1024 * 128 * sizeof(float)));
  for (int blocks : {1, 132, 1024})
    for (bool pdl : {false, true})
      if (run(400, blocks, pdl, s, buf)) return 1;
  return 0;
}
