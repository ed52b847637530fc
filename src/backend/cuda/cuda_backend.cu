// CudaBackend: memory, weight upload, op entries (checks + unpacking; the launchers are in launch.h), graphs.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/op_checks.h"

namespace kiln::cuda {
namespace {

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(Backend* be, void* p, size_t n) : Buffer(be, p, n) {}
  ~DeviceBuffer() override { cudaFree(data_); }
};

class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(Backend* be, void* p, size_t n) : Buffer(be, p, n) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
};

size_t fstride(const Tensor& t) { return t.nb[1] / sizeof(float); }

using op_checks::check;
using op_checks::check_ids;
using op_checks::is_float_type;
using op_checks::same_shape;

}  // namespace

// ---- lifetime ---------------------------------------------------------------------------------------------------

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(device));
  KILN_TRY(b->init());
  return Result<std::unique_ptr<CudaBackend>>(std::move(b));
}

Status CudaBackend::init() {
  KILN_CUDA_TRY(cudaGetDeviceCount(&n_devices_));
  if (device_ < 0 || device_ >= n_devices_)
    return make_error(ErrorCode::kInvalidArgument, "cuda:%d: no such GPU (%d present)", device_, n_devices_);
  KILN_CUDA_TRY(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  KILN_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
  n_sm_ = prop.multiProcessorCount;
  cc_ = prop.major * 10 + prop.minor;
  smem_optin_ = prop.sharedMemPerBlockOptin;
  KILN_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KILN_TRY(attention_init(smem_optin_));
  const char* g = std::getenv("KILN_CUDA_GRAPHS");
  graphs_enabled_ = !(g && std::strcmp(g, "0") == 0);
  const char* gs = std::getenv("KILN_CUDA_GRAPH_STATS");
  graph_stats_ = gs && std::strcmp(gs, "0") != 0;
  return Status::ok();
}

CudaBackend::~CudaBackend() {
  if (graph_stats_)
    std::fprintf(stderr, "%s: graphs: %llu replays, %llu captures, %llu eager steps (graphs %s)\n", name_.c_str(),
                 static_cast<unsigned long long>(n_replay_), static_cast<unsigned long long>(n_capture_),
                 static_cast<unsigned long long>(n_eager_), graphs_enabled_ ? "on" : "off");
  if (graph_stats_ && gs_n_ > 0 && gs_n_int_ > 0)
    std::fprintf(stderr, "%s: graph replay: %.1f us GPU time per replay (%llu timed), %.1f us between replays\n",
                 name_.c_str(), 1e3 * gs_gpu_ms_ / static_cast<double>(gs_n_), static_cast<unsigned long long>(gs_n_),
                 1e3 * gs_interval_ms_ / static_cast<double>(gs_n_int_));
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
  for (void* w : weights_) cudaFree(w);
  for (int i = 0; i < 2; ++i) {
    if (stage_ev_[i]) cudaEventDestroy(stage_ev_[i]);
    if (stage_[i]) cudaFreeHost(stage_[i]);
  }
  for (int i = 0; i < 2; ++i) {
    if (ring_ev_[i]) cudaEventDestroy(ring_ev_[i]);
    if (gs_ev_[i]) cudaEventDestroy(gs_ev_[i]);
  }
  if (ring_) cudaFreeHost(ring_);
  if (act_buf_) cudaFree(act_buf_);
  if (attn_buf_) cudaFree(attn_buf_);
  if (moe_buf_) cudaFree(moe_buf_);
  blas_destroy(blas_);
  if (blas_ws_) cudaFree(blas_ws_);
  if (split_ws_) cudaFree(split_ws_);
  if (blas_w_) cudaFree(blas_w_);
  if (blas_x_) cudaFree(blas_x_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaBackend::use() const {
  pend_valid_ = false;
  if (n_devices_ > 1) KILN_CUDA_TRY(cudaSetDevice(device_));
  return Status::ok();
}

// The weight readers' selector decides matmul and get_rows (gemm_supports: the same function dispatch uses); the
// Gated DeltaNet's kernel also refuses key head sizes it is not built for (delta_net_supports, at the op: no model
// kiln runs has one); every attention kernel (attention.cu, fattn_mma.cu, sm90a/fattn_wgmma.cu) skips positions
// before a sliding window, joins the sinks and reads each token's own kv_len (non-causal encoder steps); rope
// honours YaRN; layer_norm and gelu run (the encoder and gpt-oss ops: encoder_ops, oai_ops).
// The KV kernels (kvstore.cu, attention.cu, fattn_mma.cu) take one cache type for K and V: f16, f32 or q8_0.
namespace {
bool cuda_cache_pair(DType k, DType v) {
  return k == v && (k == DType::F16 || k == DType::F32 || k == DType::Q8_0);
}
}  // namespace

bool CudaBackend::supports(Op op, DType a, DType b) const {
  return op_checks::supports_op(op, a, b, cuda_cache_pair, gemm_supports, gemm_supports, gemm_supports,
                                /*encoder_ops=*/true, /*oai_ops=*/true);
}

// ---- memory -----------------------------------------------------------------------------------------------------

uint64_t CudaBackend::memory_available() const {
  if (!use().is_ok()) return 0;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return free_b;
}

Result<std::unique_ptr<Buffer>> CudaBackend::alloc(size_t bytes) {
  KILN_TRY(use());
  void* p = nullptr;
  const size_t n = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  const cudaError_t e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::kOutOfRange, "%s: cannot allocate %zu bytes (%llu bytes free): %s", name_.c_str(),
                      bytes, static_cast<unsigned long long>(memory_available()), cudaGetErrorString(e));
  }
  return std::unique_ptr<Buffer>(new DeviceBuffer(this, p, n));
}

Result<std::unique_ptr<Buffer>> CudaBackend::alloc_host(size_t bytes) {
  KILN_TRY(use());
  void* p = nullptr;
  const size_t n = std::max<size_t>(64, bytes);
  const cudaError_t e = cudaMallocHost(&p, n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::kOutOfRange, "%s: cannot allocate %zu bytes of pinned host memory: %s",
                      name_.c_str(), bytes, cudaGetErrorString(e));
  }
  return std::unique_ptr<Buffer>(new PinnedBuffer(this, p, n));
}

// cudaMemcpyAsync from pageable memory returns once the bytes are staged (the caller may reuse its buffer); from
// pinned memory it is truly asynchronous, which is the write() reuse rule of backend.h.
// Small writes (the step's index region, block-table rows) are staged through the pinned ring first: the caller
// may then reuse its buffer at once, pinned or not (stricter than backend.h's rule, which a planner that skips the
// synchronize of a step without outputs would otherwise break).
Status CudaBackend::write(const Tensor& dst, size_t offset, const void* src, size_t n) {
  if (!dst.valid()) return make_error(ErrorCode::kInvalidArgument, "write: destination tensor is not set");
  if (n == 0) return Status::ok();
  KILN_TRY(use());
  char* d = static_cast<char*>(dst.data) + offset;
  if (n > kRingHalf || capturing_) {
    KILN_CUDA_TRY(cudaMemcpyAsync(d, src, n, cudaMemcpyHostToDevice, stream_));
    return Status::ok();
  }
  if (!ring_) {
    KILN_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&ring_), 2 * kRingHalf));
    for (int i = 0; i < 2; ++i) {
      KILN_CUDA_TRY(cudaEventCreateWithFlags(&ring_ev_[i], cudaEventDisableTiming));
      KILN_CUDA_TRY(cudaEventRecord(ring_ev_[i], stream_));
    }
  }
  if (ring_off_ + n > kRingHalf) {  // this half is full: mark it, move to the other once its copies are done
    KILN_CUDA_TRY(cudaEventRecord(ring_ev_[ring_half_], stream_));
    ring_half_ ^= 1;
    ring_off_ = 0;
    KILN_CUDA_TRY(cudaEventSynchronize(ring_ev_[ring_half_]));
  }
  char* stage = ring_ + ring_half_ * kRingHalf + ring_off_;
  std::memcpy(stage, src, n);
  ring_off_ += (n + 255) / 256 * 256;
  KILN_CUDA_TRY(cudaMemcpyAsync(d, stage, n, cudaMemcpyHostToDevice, stream_));
  return Status::ok();
}

Status CudaBackend::read(const Tensor& src, size_t offset, void* dst, size_t n) {
  if (!src.valid()) return make_error(ErrorCode::kInvalidArgument, "read: source tensor is not set");
  if (n == 0) return Status::ok();
  KILN_TRY(use());
  KILN_CUDA_TRY(cudaMemcpyAsync(dst, static_cast<const char*>(src.data) + offset, n, cudaMemcpyDeviceToHost, stream_));
  KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status::ok();
}

Status CudaBackend::synchronize() {
  KILN_TRY(use());
  KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status::ok();
}

// One device allocation per weight, filled through two pinned 32 MiB chunks: the host copy of chunk i+1 (which
// reads the file mapping) overlaps the DMA of chunk i.
Result<Tensor> CudaBackend::import_weight(DType t, const int64_t ne[4], const void* host, size_t nbytes) {
  if (ne[0] % dtype_block_size(t) != 0)
    return make_error(ErrorCode::kInvalidArgument, "import_weight: row of %lld elements is not a multiple of %s's "
                      "block size", static_cast<long long>(ne[0]), dtype_name(t));
  Tensor x = Tensor::make(t, nullptr, this, ne[0], ne[1], ne[2], ne[3]);
  if (x.n_bytes() != nbytes)
    return make_error(ErrorCode::kInvalidArgument, "import_weight: %s %s needs %zu bytes, got %zu", dtype_name(t),
                      x.shape_string().c_str(), x.n_bytes(), nbytes);
  KILN_TRY(use());
  void* d = nullptr;
  const cudaError_t e = cudaMalloc(&d, std::max<size_t>(nbytes, 256));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return make_error(ErrorCode::kOutOfRange, "%s: the model does not fit in GPU memory: a weight of %zu bytes "
                      "does not fit in the %zu bytes free (%llu bytes of weights already uploaded, %zu bytes on the "
                      "GPU in all); offload fewer layers with -ngl N (the rest run on the CPU)", name_.c_str(), nbytes,
                      free_b, static_cast<unsigned long long>(weight_bytes_), total_b);
  }
  weights_.push_back(d);
  for (int i = 0; i < 2; ++i) {
    if (!stage_[i]) {
      KILN_CUDA_TRY(cudaMallocHost(&stage_[i], kStageBytes));
      KILN_CUDA_TRY(cudaEventCreateWithFlags(&stage_ev_[i], cudaEventDisableTiming));
      KILN_CUDA_TRY(cudaEventRecord(stage_ev_[i], stream_));
    }
  }
  const char* src = static_cast<const char*>(host);
  for (size_t off = 0; off < nbytes;) {
    const size_t n = std::min(kStageBytes, nbytes - off);
    const int i = stage_next_;
    stage_next_ ^= 1;
    KILN_CUDA_TRY(cudaEventSynchronize(stage_ev_[i]));
    std::memcpy(stage_[i], src + off, n);
    KILN_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(d) + off, stage_[i], n, cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_TRY(cudaEventRecord(stage_ev_[i], stream_));
    off += n;
  }
  weight_bytes_ += nbytes;
  x.data = d;
  return x;
}

Status CudaBackend::ensure_scratch(void** buf, size_t* have, size_t need, const char* what) {
  if (need <= *have) return Status::ok();
  if (capturing_) {
    capture_failed_ = true;
    return make_error(ErrorCode::kInternal, "%s: %s scratch must grow during a CUDA graph capture (set "
                      "KILN_CUDA_GRAPHS=0)", name_.c_str(), what);
  }
  KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
  if (*buf) {
    KILN_CUDA_TRY(cudaFree(*buf));
    // Recorded graphs hold the old address (a decode step captured before a longer prompt grew the buffer): they
    // go, and their steps are captured again at their next run.
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
  }
  *buf = nullptr;
  *have = 0;
  const size_t n = std::max(need, *have * 2);
  const cudaError_t e = cudaMalloc(buf, n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *buf = nullptr;
    return make_error(ErrorCode::kOutOfRange, "%s: cannot allocate %zu bytes of %s scratch", name_.c_str(), n, what);
  }
  *have = n;
  return Status::ok();
}

// ---- ops --------------------------------------------------------------------------------------------------------

Status CudaBackend::get_rows(const Tensor& w, const Tensor& ids, const Tensor& dst) {
  if (!w.valid() || !w.rows_uniform())
    return make_error(ErrorCode::kInvalidArgument, "get_rows: w must be a tensor with contiguous rows");
  if (!supports(Op::kGetRows, w.dtype))
    return make_error(ErrorCode::kUnsupported, "get_rows: weight type %s is not supported", dtype_name(w.dtype));
  KILN_TRY(check("get_rows", "dst", dst, DType::F32));
  if (dst.ne[0] != w.ne[0])
    return make_error(ErrorCode::kInvalidArgument, "get_rows: dst row of %lld elements, weight row of %lld",
                      static_cast<long long>(dst.ne[0]), static_cast<long long>(w.ne[0]));
  const int64_t n = dst.n_rows();
  KILN_TRY(check_ids("get_rows", "ids", ids, n));
  KILN_TRY(use());
  GetRowsParams p{w.dtype, static_cast<const uint8_t*>(w.data), w.nb[1], w.ne[0],
                  static_cast<const int32_t*>(ids.data), n, static_cast<float*>(dst.data), fstride(dst)};
  return launch_get_rows(p, stream_);
}

Status CudaBackend::rms_params(const char* op, const Tensor& x, const Tensor& w, float eps, const Tensor& dst,
                               RmsNormParams* p) const {
  KILN_TRY(check(op, "x", x, DType::F32));
  KILN_TRY(check(op, "dst", dst, DType::F32));
  KILN_TRY(same_shape(op, "x", x, "dst", dst));
  const int64_t d = x.ne[0];
  if (w.valid()) {
    KILN_TRY(check(op, "w", w, DType::F32));
    if (w.ne[0] != d || w.n_rows() != 1)
      return make_error(ErrorCode::kInvalidArgument, "%s: w %s must be [%lld]", op, w.shape_string().c_str(),
                        static_cast<long long>(d));
  }
  if (!(eps >= 0)) return make_error(ErrorCode::kInvalidArgument, "%s: eps %g must be >= 0", op, eps);
  *p = RmsNormParams{static_cast<const float*>(x.data), fstride(x),
                     w.valid() ? static_cast<const float*>(w.data) : nullptr, eps, static_cast<float*>(dst.data),
                     fstride(dst), d, x.n_rows()};
  return Status::ok();
}

Status CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& dst) {
  RmsNormParams p{};
  KILN_TRY(rms_params("rms_norm", x, w, eps, dst, &p));
  KILN_TRY(use());
  return launch_rms_norm(p, stream_);
}

// rms_norm + the q8_1 quantization of its result in one pass, kept for the matmuls that read dst next.
Status CudaBackend::rms_norm_for_matmul(const Tensor& x, const Tensor& w, float eps, const Tensor& dst, DType next) {
  RmsNormParams p{};
  KILN_TRY(rms_params("rms_norm", x, w, eps, dst, &p));
  if (!reads_q8_1(next, p.d, p.n) || !rms_norm_quant_usable(p) || p.n == 0) return rms_norm(x, w, eps, dst);
  KILN_TRY(use());
  KILN_ASSIGN_OR_RETURN(ActQ a, act_layout(p.d, p.n));
  KILN_TRY(launch_rms_norm_quant(p, a, stream_));
  pend_valid_ = true;
  pend_x_ = dst.data;
  pend_n_in_ = p.d;
  pend_n_tok_ = p.n;
  pend_stride_ = p.dst_stride;
  pend_a_ = a;
  return Status::ok();
}

bool CudaBackend::take_pending(const Tensor& x, ActQ* a) {
  const bool hit = pend_valid_ && x.data == pend_x_ && x.ne[0] == pend_n_in_ && x.n_rows() == pend_n_tok_ &&
                   fstride(x) == pend_stride_;
  pend_valid_ = false;
  if (hit) *a = pend_a_;
  return hit;
}

Status CudaBackend::matmul_operands(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst) const {
  return op_checks::matmul_operands(w, x, bias, dst, supports(Op::kMatmul, w.dtype));
}

Result<ActQ> CudaBackend::quantize_act(const Tensor& x) {
  KILN_ASSIGN_OR_RETURN(ActQ a, act_layout(x.ne[0], x.n_rows()));
  KILN_TRY(launch_quantize_act(static_cast<const float*>(x.data), fstride(x), a, stream_));
  return a;
}

Result<ActQ> CudaBackend::act_layout(int64_t n_in, int64_t n_tok) {
  ActQ a;
  a.n_in = n_in;
  a.n_tok = n_tok;
  a.qs_stride = static_cast<size_t>((a.n_in + 15) / 16 * 16);
  a.ds_stride = static_cast<size_t>(a.n_in / 32);
  const size_t qs_bytes = (a.qs_stride * static_cast<size_t>(a.n_tok) + 255) / 256 * 256;
  const size_t need = qs_bytes + a.ds_stride * static_cast<size_t>(a.n_tok) * sizeof(float4);
  KILN_TRY(ensure_scratch(&act_buf_, &act_bytes_, need, "activation"));
  a.qs = static_cast<int8_t*>(act_buf_);
  a.ds = reinterpret_cast<float4*>(static_cast<char*>(act_buf_) + qs_bytes);
  return a;
}

MatmulParams CudaBackend::matmul_params(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst,
                                        bool accumulate) {
  return MatmulParams{w.dtype, static_cast<const uint8_t*>(w.data), w.nb[1], w.ne[0], w.n_rows(), x.n_rows(),
                      static_cast<const float*>(x.data), fstride(x),
                      bias.valid() ? static_cast<const float*>(bias.data) : nullptr, static_cast<float*>(dst.data),
                      fstride(dst), accumulate};
}

// The selector's pick for a product of `type` weights over n_tok rows of n_in, asked before the product's other
// operands exist (rms_norm_for_matmul, matmul groups): the selector's token rule does not depend on them.
MatmulKernel CudaBackend::probe_matmul(DType type, int64_t n_in, int64_t n_tok) const {
  MatmulParams p{};
  p.type = type;
  p.n_in = n_in;
  p.n_tok = n_tok;
  p.n_out = 1;
  const auto rb = dtype_row_bytes(type, n_in);
  p.w_row_bytes = rb.is_ok() ? rb.value() : 0;
  return select_matmul(p, cc_);
}

// Whether such a product reads q8_1 activations (the GEMVs, mmq and gemm of quantized weights).
bool CudaBackend::reads_q8_1(DType type, int64_t n_in, int64_t n_tok) const {
  if (!mmvq_supports(type)) return false;
  const MatmulKernel k = probe_matmul(type, n_in, n_tok);
  return k == MatmulKernel::kMmvq || k == MatmulKernel::kMmq || k == MatmulKernel::kGemm;
}

bool CudaBackend::takes_gemv_group(DType type, int64_t n_in, int64_t n_tok) const {
  return mmvq_fast_supports(type) && probe_matmul(type, n_in, n_tok) == MatmulKernel::kMmvq;
}

Status CudaBackend::blas_scratch(const MatmulParams& p, BlasScratch* sc) {
  if (!blas_) {
    if (capturing_) {
      capture_failed_ = true;
      return make_error(ErrorCode::kInternal, "%s: cuBLAS set up during a CUDA graph capture", name_.c_str());
    }
    KILN_TRY(ensure_scratch(&blas_ws_, &blas_ws_bytes_, kBlasWorkspaceBytes, "cuBLAS workspace"));
    KILN_TRY(blas_create(&blas_, blas_ws_, blas_ws_bytes_));
  }
  KILN_TRY(ensure_scratch(&blas_w_, &blas_w_bytes_, blas_weight_scratch_bytes(p), "dequantized weight"));
  KILN_TRY(ensure_scratch(&blas_x_, &blas_x_bytes_, blas_act_scratch_bytes(p), "f16 activation"));
  *sc = BlasScratch{blas_, blas_w_, blas_w_bytes_, blas_x_, blas_x_bytes_};
  return Status::ok();
}

Status CudaBackend::mmq_split_ws(MmqSplitWs* ws) {
  const size_t sem_bytes = kMmqSplitSems * sizeof(unsigned);
  if (!split_ws_) {
    KILN_TRY(ensure_scratch(&split_ws_, &split_ws_bytes_, sem_bytes + kMmqSplitBytes, "mmq split-K"));
    KILN_CUDA_TRY(cudaMemsetAsync(split_ws_, 0, sem_bytes, stream_));  // the counters start at 0 (mmq_finish)
  }
  ws->sem = static_cast<unsigned*>(split_ws_);
  ws->part = reinterpret_cast<float*>(static_cast<char*>(split_ws_) + sem_bytes);
  ws->part_floats = (split_ws_bytes_ - sem_bytes) / sizeof(float);
  return Status::ok();
}

bool CudaBackend::mmf_group_ok(const Tensor& x, const MatmulOut* outs, int n) const {
  if (n < 1 || n > 3) return false;
  for (int i = 0; i < n; ++i) {
    if (outs[i].w.dtype != outs[0].w.dtype) return false;
    const MatmulParams p = matmul_params(outs[i].w, x, outs[i].bias, outs[i].dst, false);
    if (select_matmul(p, cc_) != MatmulKernel::kMmf) return false;
  }
  return true;
}

Status CudaBackend::mmf_run(const Tensor& x, const MatmulOut* outs, int n, bool accumulate) {
  const int64_t n_in = x.ne[0], n_tok = x.n_rows();
  KILN_TRY(ensure_scratch(&mmf_x_, &mmf_x_bytes_, mmf_act_scratch_bytes(n_in, n_tok), "mmf f16 activation"));
  const ConvertParams cv{DType::F32, DType::F16, static_cast<const uint8_t*>(x.data), x.nb[1],
                         static_cast<uint8_t*>(mmf_x_), static_cast<size_t>(n_in) * 2, n_in, n_tok};
  KILN_TRY(launch_convert(cv, stream_));
  MmfGroup g{};
  g.type = outs[0].w.dtype;
  g.n_seg = n;
  g.x = mmf_x_;
  g.x_stride = static_cast<size_t>(n_in);
  g.n_in = n_in;
  g.n_tok = n_tok;
  g.accumulate = accumulate;
  for (int i = 0; i < n; ++i)
    g.seg[i] = MmfSeg{static_cast<const uint8_t*>(outs[i].w.data), outs[i].w.nb[1], outs[i].w.n_rows(), 0,
                      static_cast<float*>(outs[i].dst.data), fstride(outs[i].dst),
                      outs[i].bias.valid() ? static_cast<const float*>(outs[i].bias.data) : nullptr};
  MmqSplitWs ws{};
  KILN_TRY(mmq_split_ws(&ws));
  return launch_mmf(g, ws, stream_);
}

Status CudaBackend::matmul_run(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst,
                               bool accumulate, const ActQ* act) {
  MatmulParams p = matmul_params(w, x, bias, dst, accumulate);
  const MatmulKernel k = select_matmul(p, cc_);
  switch (k) {
    case MatmulKernel::kMmvf: return launch_mmvf(p, stream_);
    case MatmulKernel::kMmf: {
      const MatmulOut o{w, bias, dst};
      return mmf_run(x, &o, 1, accumulate);
    }
    case MatmulKernel::kBlas: {
      BlasScratch sc{};
      KILN_TRY(blas_scratch(p, &sc));
      return launch_blas(p, sc, stream_);
    }
    case MatmulKernel::kMmvq: case MatmulKernel::kMmq: case MatmulKernel::kGemm: {
      ActQ a{};  // quantized weights read q8_1 activations on all three; float weights read p.x
      if (mmvq_supports(p.type)) {
        if (act) {
          a = *act;
        } else {
          KILN_ASSIGN_OR_RETURN(a, quantize_act(x));
        }
      }
      if (k == MatmulKernel::kMmvq) return launch_mmvq(p, a, stream_);
      if (k == MatmulKernel::kGemm) return launch_gemm(p, a, stream_);
      KILN_TRY(mmq_split_ws(&p.split));
      return launch_mmq(p, a, stream_);
    }
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "%s: no matmul kernel for %s weights", name_.c_str(),
                    dtype_name(p.type));
}

Status CudaBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst) {
  ActQ pa{};
  const bool pend = take_pending(x, &pa);
  KILN_TRY(matmul_operands(w, x, bias, dst));
  KILN_TRY(use());
  return matmul_run(w, x, bias, dst, false, pend && mmvq_supports(w.dtype) ? &pa : nullptr);
}

Status CudaBackend::matmul_outs_q(const Tensor& x, const MatmulOut* outs, int n, const ActQ& a) {
  for (int i = 0; i < n;) {
    const DType t = outs[i].w.dtype;
    if (!takes_gemv_group(t, x.ne[0], x.n_rows())) {
      KILN_TRY(matmul_run(outs[i].w, x, outs[i].bias, outs[i].dst, false, &a));
      ++i;
      continue;
    }
    MmvqGroup g{};
    g.n_in = x.ne[0];
    g.n_tok = x.n_rows();
    while (i < n && g.n_seg < 3 && outs[i].w.dtype == t) {
      const MatmulOut& o = outs[i++];
      g.seg[g.n_seg++] = MmvqSeg{static_cast<const uint8_t*>(o.w.data), o.w.nb[1], o.w.n_rows(),
                                 o.bias.valid() ? static_cast<const float*>(o.bias.data) : nullptr,
                                 static_cast<float*>(o.dst.data), fstride(o.dst), false};
    }
    KILN_TRY(launch_mmvq_group(t, g, a, stream_));
  }
  return Status::ok();
}

Status CudaBackend::matmul_group(const Tensor& x, const MatmulOut* outs, int n) {
  ActQ pa{};
  const bool pend = take_pending(x, &pa);
  bool any_q8 = false;
  for (int i = 0; i < n; ++i) {
    KILN_TRY(matmul_operands(outs[i].w, x, outs[i].bias, outs[i].dst));
    any_q8 = any_q8 || reads_q8_1(outs[i].w.dtype, x.ne[0], x.n_rows());
  }
  KILN_TRY(use());
  if (mmf_group_ok(x, outs, n)) return mmf_run(x, outs, n, false);
  if (any_q8) {
    // the input is quantized once for all the products that read q8_1 (or was, by rms_norm_for_matmul)
    ActQ a = pa;
    if (!pend) {
      KILN_ASSIGN_OR_RETURN(a, quantize_act(x));
    }
    return matmul_outs_q(x, outs, n, a);
  }
  for (int i = 0; i < n; ++i) KILN_TRY(matmul_run(outs[i].w, x, outs[i].bias, outs[i].dst, false, nullptr));
  return Status::ok();
}

Status CudaBackend::matmul_add(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& tmp,
                               const Tensor& acc) {
  ActQ pa{};
  const bool pend = take_pending(x, &pa);
  KILN_TRY(matmul_operands(w, x, bias, acc));
  KILN_TRY(use());
  // the epilogue adds into acc: no tmp, no add launch
  return matmul_run(w, x, bias, acc, true, pend && mmvq_supports(w.dtype) ? &pa : nullptr);
}

// Gate and up in one launch of the bandwidth GEMV with silu(gate) * up in its epilogue (u is not written); other
// types: the default (one quantization, two products, swiglu).
Status CudaBackend::matmul_swiglu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, const Tensor& g,
                                  const Tensor& u) {
  const DType t = w_gate.dtype;
  if (!takes_gemv_group(t, x.ne[0], x.n_rows()) || w_up.dtype != t || !g.valid() || !w_up.valid() ||
      w_gate.n_rows() != w_up.n_rows()) {
    const MatmulOut outs[] = {{w_gate, Tensor{}, g}, {w_up, Tensor{}, u}};
    KILN_TRY(matmul_group(x, outs, 2));
    return swiglu(g, u, g);
  }
  ActQ a{};
  const bool pend = take_pending(x, &a);
  KILN_TRY(matmul_operands(w_gate, x, Tensor{}, g));
  KILN_TRY(matmul_operands(w_up, x, Tensor{}, g));
  KILN_TRY(use());
  if (!pend) {
    KILN_ASSIGN_OR_RETURN(a, quantize_act(x));
  }
  MmvqGroup gr{};
  gr.n_in = x.ne[0];
  gr.n_tok = x.n_rows();
  gr.n_seg = 2;
  gr.swiglu = true;
  gr.seg[0] = MmvqSeg{static_cast<const uint8_t*>(w_gate.data), w_gate.nb[1], w_gate.n_rows(), nullptr,
                      static_cast<float*>(g.data), fstride(g), false};
  gr.seg[1] = MmvqSeg{static_cast<const uint8_t*>(w_up.data), w_up.nb[1], w_up.n_rows(), nullptr, nullptr, 0, false};
  return launch_mmvq_group(t, gr, a, stream_);
}

namespace {
// The launch of rope on x [head_dim, n_head, n_tok] (operands checked): theta_scale as the CPU computes it, the YaRN
// terms from yarn_terms (backend.h).
RopeLaunch rope_launch(const Tensor& x, const Tensor& pos, const RopeParams& p) {
  const YarnTerms y = yarn_terms(p);
  RopeLaunch r{static_cast<float*>(x.data), x.nb[1] / sizeof(float), x.nb[2] / sizeof(float), x.ne[0], x.ne[1],
               x.ne[2], static_cast<const int32_t*>(pos.data),
               p.freq_factors.valid() ? static_cast<const float*>(p.freq_factors.data) : nullptr, p.n_rot,
               p.mode == RopeMode::kNeox, std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot)), p.freq_scale};
  r.ext_factor = p.ext_factor, r.corr_lo = y.lo, r.corr_hi = y.hi, r.mscale = y.mscale;
  return r;
}
}  // namespace

Status CudaBackend::rope(const Tensor& x, const Tensor& pos, const RopeParams& p) {
  KILN_TRY(op_checks::rope_operands(*this, x, pos, p));
  KILN_TRY(use());
  return launch_rope(rope_launch(x, pos, p), stream_);
}

// RoPE of q and k and the K/V store in one launch (F16/F32 caches, q and k of one head dim); otherwise the
// default decomposition.
Status CudaBackend::rope_kv_store(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pos,
                                  const RopeParams& p, const KvLayer& cache, const Tensor& slots) {
  const DType ct = cache.k.dtype;
  if ((ct != DType::F16 && ct != DType::F32) || cache.v.dtype != ct || !q.valid() || !k.valid() || q.ne[0] != k.ne[0] ||
      q.ne[2] != k.ne[2] || k.nb[1] != k.ne[0] * sizeof(float))
    return Backend::rope_kv_store(q, k, v, pos, p, cache, slots);
  KILN_TRY(op_checks::rope_operands(*this, q, pos, p));
  KILN_TRY(op_checks::rope_operands(*this, k, pos, p));
  const Tensor k2 = k.reshape(k.ne[0] * k.ne[1], k.ne[2]);
  KILN_TRY(op_checks::kv_store_operands(*this, k2, v, cache, slots));
  const size_t es = ct == DType::F16 ? 2 : 4;
  RopeKvStoreParams c{ct, static_cast<const float*>(v.data), fstride(v), cache.head_dim_v,
                      static_cast<uint8_t*>(cache.k.data), cache.k.nb[1], es * cache.head_dim_k,
                      static_cast<uint8_t*>(cache.v.data), cache.v.nb[1], es * cache.head_dim_v,
                      static_cast<const int32_t*>(slots.data)};
  KILN_TRY(use());
  return launch_rope_kv_store(rope_launch(q, pos, p), rope_launch(k, pos, p), c, stream_);
}

Status CudaBackend::kv_store(const Tensor& k, const Tensor& v, const KvLayer& c, const Tensor& slots) {
  KILN_TRY(op_checks::kv_store_operands(*this, k, v, c, slots));
  const DType ct = c.k.dtype;
  const int64_t dk = static_cast<int64_t>(c.n_head_kv) * c.head_dim_k;
  const int64_t dv = static_cast<int64_t>(c.n_head_kv) * c.head_dim_v;
  const int64_t n = k.n_rows();
  KILN_TRY(use());
  KvStoreParams p{ct, static_cast<const float*>(k.data), fstride(k), static_cast<const float*>(v.data), fstride(v),
                  static_cast<uint8_t*>(c.k.data), c.k.nb[1], static_cast<uint8_t*>(c.v.data), c.v.nb[1],
                  dk, dv, n, static_cast<const int32_t*>(slots.data)};
  return launch_kv_store(p, stream_);
}

Status CudaBackend::attention(const Tensor& q, const KvLayer& c, const AttnBatch& m, float scale, const Tensor& dst) {
  KILN_TRY(op_checks::attention_operands(*this, q, c, m, dst));
  const int64_t n_head = q.ne[1], n_tok = q.ne[2];
  const DType ct = c.k.dtype;
  if (q.nb[1] % sizeof(float) || q.nb[2] % sizeof(float))
    return make_error(ErrorCode::kUnsupported, "attention: q strides must be whole floats");
  if (n_tok > INT32_MAX || n_head > 65535)
    return make_error(ErrorCode::kUnsupported, "attention: %lld tokens x %lld heads", static_cast<long long>(n_tok),
                      static_cast<long long>(n_head));
  AttnParams p{};
  p.q = static_cast<const float*>(q.data);
  p.q_tok_stride = q.nb[2] / sizeof(float);
  p.q_head_stride = q.nb[1] / sizeof(float);
  p.dst = static_cast<float*>(dst.data);
  p.k = static_cast<const uint8_t*>(c.k.data);
  p.v = static_cast<const uint8_t*>(c.v.data);
  p.k_slot_bytes = c.k.nb[1];
  p.v_slot_bytes = c.v.nb[1];
  p.k_head_bytes = static_cast<size_t>(c.head_dim_k / dtype_block_size(ct) * dtype_type_size(ct));
  p.v_head_bytes = static_cast<size_t>(c.head_dim_v / dtype_block_size(ct) * dtype_type_size(ct));
  p.kv_type = ct;
  p.n_tok = static_cast<int>(n_tok);
  p.n_head = static_cast<int>(n_head);
  p.n_head_kv = c.n_head_kv;
  p.hd_k = c.head_dim_k;
  p.hd_v = c.head_dim_v;
  p.block_size = c.block_size;
  p.tables = static_cast<const int32_t*>(m.block_tables.data);
  p.table_stride = static_cast<int64_t>(m.block_tables.nb[1] / sizeof(int32_t));
  p.tok_table = static_cast<const int32_t*>(m.tok_table.data);
  p.kv_len = static_cast<const int32_t*>(m.kv_len.data);
  p.scale = scale;
  p.max_kv_len = m.max_kv_len;
  p.n_sm = n_sm_;
  p.window = std::max(c.window, 0);
  p.sinks = c.sinks.valid() ? static_cast<const float*>(c.sinks.data) : nullptr;
  if (m.n_seq > 0 && m.seq_row.valid() && m.seq_q_start.valid() && m.seq_q_len.valid()) {
    p.seq_row = static_cast<const int32_t*>(m.seq_row.data);
    p.seq_q_start = static_cast<const int32_t*>(m.seq_q_start.data);
    p.seq_q_len = static_cast<const int32_t*>(m.seq_q_len.data);
    p.n_seq = m.n_seq;
    p.max_q_len = m.max_q_len;
  }
  // The one selector (fattn_mma.cu): f16 cache, head dim 64/128/256, sm_80+, max_q_len >= kFattnMinQ -> the
  // tensor-core prefill kernel; everything else (decode, other caches / dims, sm_75) -> attention.cu.
  int cc_major = 0, cc_minor = 0;
  KILN_CUDA_TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device_));
  KILN_CUDA_TRY(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device_));
  if (fattn_mma_selected(p, cc_major * 10 + cc_minor, smem_optin_)) {
    KILN_TRY(use());
    return launch_fattn_mma(p, stream_);
  }
  if (attention_smem_bytes(p) > smem_optin_)
    return make_error(ErrorCode::kUnsupported, "attention: %lld heads per KV head with head dims %d/%d need %zu bytes "
                      "of shared memory (the GPU has %zu per block)", static_cast<long long>(n_head / c.n_head_kv),
                      c.head_dim_k, c.head_dim_v, attention_smem_bytes(p), smem_optin_);
  KILN_TRY(use());
  const size_t scratch = attention_scratch_floats(p) * sizeof(float);
  if (scratch > 0) KILN_TRY(ensure_scratch(&attn_buf_, &attn_bytes_, scratch, "attention"));
  return launch_attention(p, static_cast<float*>(attn_buf_), stream_);
}

// swiglu and geglu: dst = act(gate) * up, all F32 of one shape.
Status CudaBackend::glu(const char* op, EwOp kind, const Tensor& gate, const Tensor& up, const Tensor& dst) {
  KILN_TRY(check(op, "gate", gate, DType::F32));
  KILN_TRY(check(op, "up", up, DType::F32));
  KILN_TRY(check(op, "dst", dst, DType::F32));
  KILN_TRY(same_shape(op, "gate", gate, "up", up));
  KILN_TRY(same_shape(op, "gate", gate, "dst", dst));
  KILN_TRY(use());
  EwParams p{kind, static_cast<const float*>(gate.data), fstride(gate), static_cast<const float*>(up.data),
             fstride(up), static_cast<float*>(dst.data), fstride(dst), gate.ne[0], gate.n_rows(), 0.0f};
  return launch_elementwise(p, stream_);
}

Status CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) {
  return glu("swiglu", EwOp::kSwiglu, gate, up, dst);
}

Status CudaBackend::binary(const char* op, const Tensor& a, const Tensor& b, const Tensor& dst, EwOp kind) {
  bool bcast = false;
  KILN_TRY(op_checks::binary_operands(op, a, b, dst, &bcast));
  KILN_TRY(use());
  EwParams p{kind, static_cast<const float*>(a.data), fstride(a), static_cast<const float*>(b.data),
             bcast ? 0 : fstride(b), static_cast<float*>(dst.data), fstride(dst), a.ne[0], a.n_rows(), 0.0f};
  return launch_elementwise(p, stream_);
}

Status CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& dst) { return binary("add", a, b, dst, EwOp::kAdd); }
Status CudaBackend::mul(const Tensor& a, const Tensor& b, const Tensor& dst) { return binary("mul", a, b, dst, EwOp::kMul); }

Status CudaBackend::scale(const Tensor& x, float s, const Tensor& dst) {
  KILN_TRY(check("scale", "x", x, DType::F32));
  KILN_TRY(check("scale", "dst", dst, DType::F32));
  KILN_TRY(same_shape("scale", "x", x, "dst", dst));
  KILN_TRY(use());
  EwParams p{EwOp::kScale, static_cast<const float*>(x.data), fstride(x), nullptr, 0, static_cast<float*>(dst.data),
             fstride(dst), x.ne[0], x.n_rows(), s};
  return launch_elementwise(p, stream_);
}

Status CudaBackend::softmax(const Tensor& x, const Tensor& dst) {
  KILN_TRY(check("softmax", "x", x, DType::F32));
  KILN_TRY(check("softmax", "dst", dst, DType::F32));
  KILN_TRY(same_shape("softmax", "x", x, "dst", dst));
  KILN_TRY(use());
  RowParams p{static_cast<const float*>(x.data), fstride(x), static_cast<float*>(dst.data), fstride(dst), nullptr,
              x.ne[0], x.n_rows()};
  return launch_softmax(p, stream_);
}

Status CudaBackend::argmax(const Tensor& x, const Tensor& dst) {
  KILN_TRY(check("argmax", "x", x, DType::F32));
  KILN_TRY(check_ids("argmax", "dst", dst, x.n_rows()));
  KILN_TRY(use());
  RowParams p{static_cast<const float*>(x.data), fstride(x), nullptr, 0, static_cast<int32_t*>(dst.data), x.ne[0],
              x.n_rows()};
  return launch_argmax(p, stream_);
}

Status CudaBackend::argmax_masked(const Tensor& x, const Tensor& mask, const Tensor& dst) {
  KILN_TRY(op_checks::argmax_masked_operands(x, mask, dst));
  KILN_TRY(use());
  RowParams p{static_cast<const float*>(x.data), fstride(x), nullptr, 0, static_cast<int32_t*>(dst.data), x.ne[0],
              x.n_rows(), static_cast<const uint64_t*>(mask.data), mask.nb[1] / sizeof(uint64_t)};
  return launch_argmax(p, stream_);
}

Status CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  if (!src.valid() || !dst.valid()) return make_error(ErrorCode::kInvalidArgument, "copy: tensor not set");
  if (src.dtype != dst.dtype && (!is_float_type(src.dtype) || !is_float_type(dst.dtype)))
    return make_error(ErrorCode::kUnsupported, "copy: %s -> %s (conversions between f32, f16, bf16; any type to "
                      "itself)", dtype_name(src.dtype), dtype_name(dst.dtype));
  if (!src.rows_uniform() || !dst.rows_uniform())
    return make_error(ErrorCode::kUnsupported, "copy: tensors must have contiguous rows");
  KILN_TRY(same_shape("copy", "src", src, "dst", dst));
  KILN_TRY(use());
  const int64_t n = src.n_rows();
  if (n == 0 || src.ne[0] == 0) return Status::ok();
  if (src.dtype == dst.dtype) {
    KILN_CUDA_TRY(cudaMemcpy2DAsync(dst.data, dst.nb[1], src.data, src.nb[1], src.row_bytes(),
                                    static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
    return Status::ok();
  }
  ConvertParams p{src.dtype, dst.dtype, static_cast<const uint8_t*>(src.data), src.nb[1],
                  static_cast<uint8_t*>(dst.data), dst.nb[1], src.ne[0], n};
  return launch_convert(p, stream_);
}

// ---- ops of hybrid / sliding-window models (Qwen3.5, Gemma 3) ---------------------------------------------------

Status CudaBackend::geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) {
  return glu("geglu", EwOp::kGeglu, gate, up, dst);
}

// gate may be a strided view (qwen35: the gate half of each query-projection head): any whole-float row stride.
Status CudaBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& dst) {
  KILN_TRY(check("sigmoid_mul", "x", x, DType::F32));
  KILN_TRY(check("sigmoid_mul", "gate", gate, DType::F32));
  KILN_TRY(check("sigmoid_mul", "dst", dst, DType::F32));
  KILN_TRY(same_shape("sigmoid_mul", "x", x, "gate", gate));
  KILN_TRY(same_shape("sigmoid_mul", "x", x, "dst", dst));
  KILN_TRY(use());
  EwParams p{EwOp::kSigmoidMul, static_cast<const float*>(x.data), fstride(x), static_cast<const float*>(gate.data),
             fstride(gate), static_cast<float*>(dst.data), fstride(dst), x.ne[0], x.n_rows(), 0.0f};
  return launch_elementwise(p, stream_);
}

// ---- CUDA graphs ------------------------------------------------------------------------------------------------
// A step shape (key) runs eagerly the first time (which sizes the scratch buffers), is captured the second time
// and replayed from then on. Kernel arguments are device pointers into buffers that live as long as the state and
// host counts that are part of the key, so a replay with a new plan (new ids, positions, slots, tables) is the
// same as running the ops. A scratch buffer that grows (ensure_scratch: a longer step after a capture) moves, and
// every recorded graph goes with its old address.

bool CudaBackend::graph_replay(uint64_t key) {
  if (!graphs_enabled_) return false;
  auto it = graphs_.find(key);
  if (it == graphs_.end()) return false;
  if (!use().is_ok()) return false;
  if (graph_stats_) {  // GPU time of each replay (events around it) and the host interval between replays
    if (!gs_ev_[0]) {
      cudaEventCreate(&gs_ev_[0]);
      cudaEventCreate(&gs_ev_[1]);
    } else if (gs_pending_ && cudaEventQuery(gs_ev_[1]) == cudaSuccess) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, gs_ev_[0], gs_ev_[1]) == cudaSuccess) gs_gpu_ms_ += ms, ++gs_n_;
    }
    const auto now = std::chrono::steady_clock::now();
    if (gs_pending_) gs_interval_ms_ += std::chrono::duration<double, std::milli>(now - gs_last_).count(), ++gs_n_int_;
    gs_last_ = now;
    cudaEventRecord(gs_ev_[0], stream_);
  }
  const bool ok = cudaGraphLaunch(it->second, stream_) == cudaSuccess;
  if (graph_stats_) {
    cudaEventRecord(gs_ev_[1], stream_);
    gs_pending_ = true;
  }
  n_replay_ += ok;
  return ok;
}

Status CudaBackend::graph_begin(uint64_t key) {
  step_key_ = key, step_key_set_ = true;
  if (!graphs_enabled_ || capturing_) {
    n_eager_ += !capturing_;
    return Status::ok();
  }
  int& seen = graph_seen_[key];
  if (seen < 0 || ++seen < 2) {  // < 0: capture failed before; 1: the eager warm-up run
    ++n_eager_;
    return Status::ok();
  }
  ++n_capture_;
  KILN_TRY(use());
  KILN_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  capture_failed_ = false;
  return Status::ok();
}

Status CudaBackend::graph_end(uint64_t key) {
  step_key_set_ = false;
  if (!capturing_) return Status::ok();
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess || capture_failed_ || !graph) {
    (void)cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    graph_seen_[key] = -1;
    return make_error(ErrorCode::kInternal, "%s: capturing the step as a CUDA graph failed (%s); set "
                      "KILN_CUDA_GRAPHS=0 to run without graphs", name_.c_str(), cudaGetErrorString(e));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    (void)cudaGetLastError();
    graph_seen_[key] = -1;
    return make_error(ErrorCode::kInternal, "%s: instantiating the step's CUDA graph failed: %s", name_.c_str(),
                      cudaGetErrorString(ie));
  }
  graphs_[key] = exec;
  KILN_CUDA_TRY(cudaGraphLaunch(exec, stream_));
  return Status::ok();
}

}  // namespace kiln::cuda
