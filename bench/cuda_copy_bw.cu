// Device-to-device copy bandwidth (the ceiling decode GEMV is measured against): cudaMemcpy of a 4 GiB buffer,
// median of 10 timed copies after 3 warm-ups, counting bytes read + bytes written. Prints "copy_gbs <value>".
// Build: nvcc -O2 -o /tmp/copy_bw bench/cuda_copy_bw.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

int main() {
  const size_t n = size_t{4} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return std::printf("alloc failed\n"), 1;
  cudaMemset(a, 1, n);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  std::printf("copy_gbs %.1f\n", 2.0 * static_cast<double>(n) / (med * 1e-3) / 1e9);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
