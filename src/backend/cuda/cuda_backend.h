// The CUDA backend (backend.h's contract on one GPU): device memory, pinned staging, weights uploaded once in
// their GGUF block layout, every op as entry (checks, unpack into a params struct: cuda_backend.cu) -> launcher
// (launch.h, config from a constexpr table per op family) -> kernel (one .cu per family). All work of one instance
// is ordered on its own stream; read() and synchronize() wait for it.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/launch.h"

namespace kiln::cuda {

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(int device);
  ~CudaBackend() override;

  const char* name() const override { return name_.c_str(); }
  bool host_memory() const override { return false; }
  // The stream every op of this backend is ordered on, and its device (collectives: cuda/comm_nccl.cu).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  bool supports(Op op, DType a, DType b = DType::F32) const override;

  uint64_t memory_available() const override;
  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override;
  Result<std::unique_ptr<Buffer>> alloc_host(size_t bytes) override;
  Status write(const Tensor& dst, size_t offset, const void* src, size_t n) override;
  Status read(const Tensor& src, size_t offset, void* dst, size_t n) override;
  Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t nbytes) override;
  Status synchronize() override;

  Status get_rows(const Tensor& w, const Tensor& ids, const Tensor& dst) override;
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& dst) override;
  Status matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst) override;
  Status matmul_group(const Tensor& x, const MatmulOut* outs, int n) override;
  Status rope(const Tensor& x, const Tensor& pos, const RopeParams& p) override;
  Status kv_store(const Tensor& k, const Tensor& v, const KvLayer& cache, const Tensor& slots) override;
  Status rope_kv_store(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pos, const RopeParams& p,
                       const KvLayer& cache, const Tensor& slots) override;
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
  Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& dst) override;
  // cuda_ops_next.cu: the hybrid models' and the encoders' ops
  Status conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state, const AttnBatch& meta,
                     const Tensor& dst) override;
  Status gated_delta_net(const DeltaNetArgs& a, const AttnBatch& meta, const Tensor& dst) override;
  Status layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& dst) override;
  Status gelu(const Tensor& x, const Tensor& dst) override;
  Status moe_ffn(const MoeFfnArgs& a, const Tensor& acc) override;  // cuda_moe.cu

  Status matmul_add(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& tmp,
                    const Tensor& acc) override;
  Status matmul_swiglu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, const Tensor& g,
                       const Tensor& u) override;
  Status rms_norm_for_matmul(const Tensor& x, const Tensor& w, float eps, const Tensor& dst, DType next) override;

  Status graph_begin(uint64_t key) override;
  Status graph_end(uint64_t key) override;
  bool graph_replay(uint64_t key) override;

 private:
  explicit CudaBackend(int device) : device_(device), name_("cuda:" + std::to_string(device)) {}
  Status init();
  Status use() const;  // makes this backend's device current (several GPUs)
  Status matmul_operands(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst) const;
  // dst (+)= W x + bias; `act` = x already quantized for mmvq (or null).
  Status matmul_run(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst, bool accumulate,
                    const ActQ* act);
  static MatmulParams matmul_params(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst,
                                    bool accumulate);
  // What the matmul selector (launch.h select_matmul) picks for a product of `type` weights, n_in x n_tok
  // activations: whether it reads q8_1 activations, whether it is a GEMV that a group launch may take.
  MatmulKernel probe_matmul(DType type, int64_t n_in, int64_t n_tok) const;
  bool reads_q8_1(DType type, int64_t n_in, int64_t n_tok) const;
  bool takes_gemv_group(DType type, int64_t n_in, int64_t n_tok) const;
  // The cuBLAS handle (created on first use, outside a capture) and the scratch launch_blas needs for p.
  Status blas_scratch(const MatmulParams& p, BlasScratch* sc);
  // The mmq split-K workspace (launch.h MmqSplitWs; allocated once, kMmqSplitBytes, counters zeroed).
  Status mmq_split_ws(MmqSplitWs* ws);
  // x quantized into the activation scratch (grown when needed, outside a capture).
  Result<ActQ> quantize_act(const Tensor& x);
  Result<ActQ> act_layout(int64_t n_in, int64_t n_tok);
  Status rms_params(const char* op, const Tensor& x, const Tensor& w, float eps, const Tensor& dst,
                    RmsNormParams* p) const;
  // The q8_1 activations rms_norm_for_matmul left for the matmuls on its dst: valid until the next op entry
  // (use() drops them), taken by the first matmul entry whose input is that tensor.
  bool take_pending(const Tensor& x, ActQ* a);
  // moe_ffn's paths (cuda_moe.cu): which applies to n tokens, and their steps after the routing; the activation
  // every path runs on nk rows of g and u.
  struct MoeScratch;
  bool moe_gemv_ok(const MoeFfnArgs& a, int64_t n) const;
  bool moe_grouped_ok(const MoeFfnArgs& a, int64_t n) const;
  Status moe_activation(const MoeFfnArgs& a, float* g, float* u, int64_t nk);
  Status moe_ffn_gemv(const MoeFfnArgs& a, const MoeScratch& m, const Tensor& acc, const ActQ* x_q);
  Status moe_ffn_grouped(const MoeFfnArgs& a, const MoeScratch& m, const Tensor& acc);
  Status moe_ffn_host(const MoeFfnArgs& a, const MoeScratch& m, const Tensor& acc);
  // The device-grouped path's product before its MatmulGroup: expert 0's plane of w (and bias), x, out.
  static MatmulParams moe_grouped_params(const Tensor& w, const Tensor& bias, const Tensor& x, const Tensor& out);
  // Quantized products of x (already in `a`) into outs[0..n): runs of the bandwidth GEMV type share one launch.
  Status matmul_outs_q(const Tensor& x, const MatmulOut* outs, int n, const ActQ& a);
  // outs[0..n) (n <= 3, one weight type, each taking mmf) in one mmf launch over x converted to f16 once.
  Status mmf_run(const Tensor& x, const MatmulOut* outs, int n, bool accumulate);
  // Whether outs[0..n) can share one mmf launch (each selects mmf, one type, n <= 3).
  bool mmf_group_ok(const Tensor& x, const MatmulOut* outs, int n) const;
  Status ensure_scratch(void** buf, size_t* have, size_t need, const char* what);
  Status binary(const char* op, const Tensor& a, const Tensor& b, const Tensor& dst, EwOp kind);
  Status glu(const char* op, EwOp kind, const Tensor& gate, const Tensor& up, const Tensor& dst);

  int device_;
  std::string name_;
  mutable bool pend_valid_ = false;
  const void* pend_x_ = nullptr;
  int64_t pend_n_in_ = 0, pend_n_tok_ = 0;
  size_t pend_stride_ = 0;
  ActQ pend_a_{};
  int n_devices_ = 1;
  int n_sm_ = 0;
  int cc_ = 0;  // compute capability, major * 10 + minor
  size_t smem_optin_ = 0;
  cudaStream_t stream_ = nullptr;
  // Weight upload: two pinned staging chunks, each reused once its copy (event) completed.
  static constexpr size_t kStageBytes = 32u << 20;
  void* stage_[2] = {nullptr, nullptr};
  cudaEvent_t stage_ev_[2] = {nullptr, nullptr};
  int stage_next_ = 0;
  uint64_t weight_bytes_ = 0;
  std::vector<void*> weights_;
  // Uploads through write(): small host buffers are copied into a pinned ring (two halves, each reused only after
  // the event recorded when it filled up), so the caller's buffer is free on return even while the copy is queued.
  static constexpr size_t kRingHalf = 4u << 20;
  char* ring_ = nullptr;
  cudaEvent_t ring_ev_[2] = {nullptr, nullptr};
  int ring_half_ = 0;
  size_t ring_off_ = 0;
  // Scratch: q8_1 activations, split-KV partials.
  void* act_buf_ = nullptr;
  size_t act_bytes_ = 0;
  void* attn_buf_ = nullptr;
  size_t attn_bytes_ = 0;
  void* moe_buf_ = nullptr;  // moe_ffn's scratch (cuda_moe.cu)
  size_t moe_bytes_ = 0;
  // cuBLAS (launch_blas): handle, its workspace, dequantized weight rows, f16 activations.
  void* blas_ = nullptr;
  void* blas_ws_ = nullptr;
  size_t blas_ws_bytes_ = 0;
  void* blas_w_ = nullptr;
  size_t blas_w_bytes_ = 0;
  void* blas_x_ = nullptr;
  size_t blas_x_bytes_ = 0;
  void* split_ws_ = nullptr;
  size_t split_ws_bytes_ = 0;
  // mmf: the f16 activations of its launch.
  void* mmf_x_ = nullptr;
  size_t mmf_x_bytes_ = 0;
  // CUDA graphs (graph hooks of backend.h): one executable graph per step shape key.
  bool graphs_enabled_ = true;
  bool capturing_ = false;
  bool capture_failed_ = false;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  std::unordered_map<uint64_t, int> graph_seen_;
  // The key of the step between graph_begin and graph_end (an op that must not be captured marks it: graph_seen_ -1).
  uint64_t step_key_ = 0;
  bool step_key_set_ = false;
  // KILN_CUDA_GRAPH_STATS=1: replays / captures / steps run eagerly, printed to stderr at destruction.
  bool graph_stats_ = false;
  uint64_t n_replay_ = 0, n_capture_ = 0, n_eager_ = 0;
  // KILN_CUDA_GRAPH_STATS: replay timing (graph_replay)
  cudaEvent_t gs_ev_[2] = {nullptr, nullptr};
  bool gs_pending_ = false;
  double gs_gpu_ms_ = 0, gs_interval_ms_ = 0;
  uint64_t gs_n_ = 0, gs_n_int_ = 0;
  std::chrono::steady_clock::time_point gs_last_;
};

}  // namespace kiln::cuda
