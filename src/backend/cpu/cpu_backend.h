// The CPU backend: host memory, zero-copy weights (views of the GGUF mapping), every op in two versions: the
// scalar single-threaded reference (CpuBackendOptions::reference) and the fast path (threaded over the pool,
// SIMD vector kernels from ops.h, the matmul from matmul.h).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "util/thread_pool.h"

namespace kiln::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& opts);
  const char* name() const override { return reference_ ? "cpu-ref" : "cpu"; }
  bool host_memory() const override { return true; }
  uint64_t memory_available() const override;
  bool supports(Op op, DType a, DType b) const override;
  bool reference() const { return reference_; }
  ThreadPool& pool() { return pool_; }

  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override;
  Status write(const Tensor& dst, size_t offset, const void* src, size_t n) override;
  Status read(const Tensor& src, size_t offset, void* dst, size_t n) override;
  Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t nbytes) override;

  Status get_rows(const Tensor& w, const Tensor& ids, const Tensor& dst) override;
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& dst) override;
  Status matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst) override;
  Status matmul_group(const Tensor& x, const MatmulOut* outs, int n) override;
  Status rope(const Tensor& x, const Tensor& pos, const RopeParams& p) override;
  Status kv_store(const Tensor& k, const Tensor& v, const KvLayer& cache, const Tensor& slots) override;
  Status attention(const Tensor& q, const KvLayer& cache, const AttnBatch& meta, float scale,
                   const Tensor& dst) override;
  Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) override;
  Status add(const Tensor& a, const Tensor& b, const Tensor& dst) override;
  Status mul(const Tensor& a, const Tensor& b, const Tensor& dst) override;
  Status scale(const Tensor& x, float s, const Tensor& dst) override;
  Status softmax(const Tensor& x, const Tensor& dst) override;
  Status argmax(const Tensor& x, const Tensor& dst) override;
  Status argmax_masked(const Tensor& x, const Tensor& mask, const Tensor& dst) override;
  Status copy(const Tensor& src, const Tensor& dst) override;
  Status geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) override;
  Status layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& dst) override;
  Status gelu(const Tensor& x, const Tensor& dst) override;
  Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& dst) override;
  // ops_ssm.cpp
  Status conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state, const AttnBatch& meta,
                     const Tensor& dst) override;
  Status gated_delta_net(const DeltaNetArgs& a, const AttnBatch& meta, const Tensor& dst) override;
  // ops_moe.cpp
  Status moe_ffn(const MoeFfnArgs& a, const Tensor& acc) override;

 private:
  // Runs fn(begin, end) over [0, n) rows: on the pool (fast) or in one call (reference).
  template <class F>
  void for_rows(int64_t n, F&& fn);
  // Checks one matmul's operands; the error names the operand at fault.
  Status matmul_operands(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst);
  Status add_bias(const Tensor& bias, const Tensor& dst);
  Status binary(const char* op, const Tensor& a, const Tensor& b, const Tensor& dst, bool is_mul);

  bool reference_;
  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;  // per-thread scratch of the fast attention
  std::vector<std::vector<float>> ssm_scratch_;  // per-thread scratch of the chunked delta rule (ops_ssm.cpp)
  std::vector<float> moe_f32_, moe_w_;            // moe_ffn's activations and routing weights (ops_moe.cpp)
  std::vector<int32_t> moe_i32_;                  // moe_ffn's expert choices and row maps
};

}  // namespace kiln::cpu
