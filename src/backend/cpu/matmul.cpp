// CPU matmul: argument checks, SIMD level dispatch, threading and the per-call activation scratch.
//
// Work split: the activation rows are quantized once per call (rows claimed dynamically by the threads) into a
// scratch buffer owned by the calling thread (thread_local, so concurrent callers on different pools never share
// it); once all rows are quantized every thread takes chunks of output rows from an atomic counter (dynamic, so a thread
// slowed by another process does not hold the call up) and computes them for all tokens. Within a chunk the SIMD
// files block the loops (matmul_kernels.h drive_tiles): a block of weight rows small enough to stay in L2 is
// swept once per tile of C activation rows, so for n_tok > 1 each weight block is read from memory once and the
// activations come from L1/L2; for n_tok == 1 the weights stream once, contiguously.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "quant/reference.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_MM_PAUSE() _mm_pause()
#else
#define KILN_MM_PAUSE() ((void)0)
#endif

namespace kiln::cpu {

namespace {

// Grows, never shrinks; 64-byte aligned.
struct Scratch {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> buf;
  size_t cap = 0;
  uint8_t* get(size_t n) {
    if (n > cap) {
      const size_t c = (n + 4095) & ~size_t{4095};
      buf.reset(static_cast<uint8_t*>(std::aligned_alloc(64, c)));
      cap = buf ? c : 0;
    }
    return buf.get();
  }
};

thread_local Scratch tl_scratch;

// Activation rows are claimed from `next` by whichever threads are running and counted in `done`; every thread
// waits until all rows are done. A thread the OS has not scheduled yet therefore never holds the others up (the
// machine may be shared): the first threads to arrive quantize everything.
template <class F>
void quantize_rows_shared(int64_t n_tok, std::atomic<int64_t>& next, std::atomic<int64_t>& done, F&& quantize_row_t) {
  for (;;) {
    const int64_t t = next.fetch_add(1, std::memory_order_relaxed);
    if (t >= n_tok) break;
    quantize_row_t(t);
    done.fetch_add(1, std::memory_order_release);
  }
  while (done.load(std::memory_order_acquire) < n_tok) KILN_MM_PAUSE();
}

// Output-row chunks handed out dynamically: a multiple of 16 rows, about 4 per thread.
int64_t chunk_rows(int64_t n_out, int nth) {
  int64_t c = (n_out + 4 * nth - 1) / (4 * nth);
  c = (c + 15) / 16 * 16;
  return c < 16 ? 16 : c;
}

Status matmul_fast(const MatmulArgs& a, ThreadPool& pool, const detail::FastKernels& fk) {
  detail::GemmJob job;
  job.wtype = a.wtype;
  job.w = static_cast<const uint8_t*>(a.w);
  job.w_row_bytes = a.w_row_bytes;
  job.n_in = a.n_in;
  job.layout = detail::act_layout(a.wtype, a.n_in, fk.bias128);
  job.n_tok = a.n_tok;
  job.y = a.y;
  job.y_stride = a.y_stride;
  uint8_t* act = tl_scratch.get(job.layout.row_bytes * static_cast<size_t>(a.n_tok));
  if (!act) return make_error(ErrorCode::kInternal, "matmul: cannot allocate the activation scratch");
  job.act = act;
  std::atomic<int64_t> next_t{0}, done_t{0}, next{0};
  const int64_t chunk = chunk_rows(a.n_out, pool.size());
  pool.run([&](int, int) {
    quantize_rows_shared(a.n_tok, next_t, done_t, [&](int64_t t) {
      fk.quantize(job.layout, a.x + t * a.x_stride, act + t * job.layout.row_bytes);
    });
    for (;;) {
      const int64_t o0 = next.fetch_add(chunk, std::memory_order_relaxed);
      if (o0 >= a.n_out) break;
      fk.gemm(job, o0, o0 + chunk < a.n_out ? o0 + chunk : a.n_out);
    }
  });
  return Status::ok();
}

// Scalar vec_dot per (row, token), threaded; activations in standard blocks as matmul_ref.
Status matmul_scalar(const MatmulArgs& a, ThreadPool& pool) {
  const DType at = detail::act_type(a.wtype);
  const detail::VecDotFn dot = detail::ref_vec_dot(a.wtype);
  const size_t rb = (static_cast<size_t>(dtype_row_bytes(at, a.n_in).value()) + 63) & ~size_t{63};
  uint8_t* act = tl_scratch.get(rb * static_cast<size_t>(a.n_tok));
  if (!act) return make_error(ErrorCode::kInternal, "matmul: cannot allocate the activation scratch");
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  std::atomic<int64_t> next_t{0}, done_t{0}, next{0};
  const int64_t chunk = chunk_rows(a.n_out, pool.size());
  pool.run([&](int, int) {
    quantize_rows_shared(a.n_tok, next_t, done_t, [&](int64_t t) {
      (void)quantize_row(at, a.x + t * a.x_stride, act + t * rb, a.n_in);
    });
    for (;;) {
      const int64_t o0 = next.fetch_add(chunk, std::memory_order_relaxed);
      if (o0 >= a.n_out) break;
      const int64_t o1 = o0 + chunk < a.n_out ? o0 + chunk : a.n_out;
      for (int64_t o = o0; o < o1; ++o)
        for (int64_t t = 0; t < a.n_tok; ++t) a.y[t * a.y_stride + o] = dot(w + o * a.w_row_bytes, act + t * rb, a.n_in);
    }
  });
  return Status::ok();
}

}  // namespace

bool matmul_supports(DType wtype) {
  switch (wtype) {
    case DType::F32: case DType::F16: case DType::BF16:
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

Status matmul_check(const MatmulArgs& a) {
  if (!dtype_is_valid(static_cast<uint32_t>(a.wtype)))
    return make_error(ErrorCode::kInvalidArgument, "matmul: wtype %u is not a type", static_cast<unsigned>(a.wtype));
  if (!matmul_supports(a.wtype))
    return make_error(ErrorCode::kUnsupported, "matmul: wtype %s is not supported by the CPU matmul", dtype_name(a.wtype));
  if (a.n_out <= 0) return make_error(ErrorCode::kInvalidArgument, "matmul: n_out = %lld must be > 0", (long long)a.n_out);
  if (a.n_in <= 0) return make_error(ErrorCode::kInvalidArgument, "matmul: n_in = %lld must be > 0", (long long)a.n_in);
  if (a.n_tok < 0) return make_error(ErrorCode::kInvalidArgument, "matmul: n_tok = %lld must be >= 0", (long long)a.n_tok);
  const int64_t bs = dtype_block_size(a.wtype);
  const int64_t abs = dtype_block_size(detail::act_type(a.wtype));
  const int64_t need = bs > abs ? bs : abs;
  if (a.n_in % need != 0)
    return make_error(ErrorCode::kInvalidArgument, "matmul: n_in = %lld is not a multiple of %s's block size %lld",
                      (long long)a.n_in, dtype_name(a.wtype), (long long)need);
  KILN_ASSIGN_OR_RETURN(const uint64_t rb, dtype_row_bytes(a.wtype, a.n_in));
  if (a.w_row_bytes < rb)
    return make_error(ErrorCode::kInvalidArgument, "matmul: w_row_bytes = %zu < %llu bytes of one %s row of n_in = %lld",
                      a.w_row_bytes, (unsigned long long)rb, dtype_name(a.wtype), (long long)a.n_in);
  if (!a.w) return make_error(ErrorCode::kInvalidArgument, "matmul: w is null");
  if (a.n_tok == 0) return Status::ok();
  if (!a.x) return make_error(ErrorCode::kInvalidArgument, "matmul: x is null");
  if (!a.y) return make_error(ErrorCode::kInvalidArgument, "matmul: y is null");
  if (a.n_tok > 1 && a.x_stride < static_cast<size_t>(a.n_in))
    return make_error(ErrorCode::kInvalidArgument, "matmul: x_stride = %zu < n_in = %lld", a.x_stride, (long long)a.n_in);
  if (a.n_tok > 1 && a.y_stride < static_cast<size_t>(a.n_out))
    return make_error(ErrorCode::kInvalidArgument, "matmul: y_stride = %zu < n_out = %lld", a.y_stride, (long long)a.n_out);
  return Status::ok();
}

namespace detail {

const FastKernels* fast_kernels_at(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return fast_kernels_avx512();
    case SimdLevel::kAvx2: return fast_kernels_avx2();
    default: return nullptr;
  }
}

Status matmul_at_level(const MatmulArgs& a, ThreadPool& pool, SimdLevel level) {
  KILN_TRY(matmul_check(a));
  if (a.n_tok == 0) return Status::ok();
  const SimdLevel best = cpu_simd_level();
  const FastKernels* fk = fast_kernels_at(level < best ? level : best);
  if (fk && fk->has(a.wtype)) return matmul_fast(a, pool, *fk);
  return matmul_scalar(a, pool);
}

}  // namespace detail

Status matmul(const MatmulArgs& a, ThreadPool& pool) { return detail::matmul_at_level(a, pool, matmul_simd_level()); }

const char* simd_level() { return simd_level_name(matmul_simd_level()); }

}  // namespace kiln::cpu
