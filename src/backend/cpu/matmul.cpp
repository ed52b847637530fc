// CPU matmul: argument checks, SIMD level dispatch, threading and the per-call activation scratch.
//
// Work split: the activation rows are quantized once per call (rows claimed dynamically by the threads; once per
// distinct input of a matmul_group) into a scratch buffer owned by the calling thread (thread_local, so concurrent
// callers on different pools never share it); once all rows are quantized every thread takes chunks of output rows
// (of every product of the group, in order) from an atomic counter (dynamic, so a thread slowed by another process
// does not hold the call up) and computes them for all tokens. Within a chunk the SIMD
// files block the loops (matmul_kernels.h drive_tiles): a block of weight rows small enough to stay in L2 is
// swept once per tile of C activation rows, so for n_tok > 1 each weight block is read from memory once and the
// activations come from L1/L2; for n_tok == 1 the weights stream once, contiguously. Every kernel prefetches its
// weight stream kPrefetchBytes ahead (matmul_kernels.h says why, with the measurements).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "quant/reference.h"

#ifndef KILN_CPU_EXACT_MATMUL
#define KILN_CPU_EXACT_MATMUL 0
#endif

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

// Output rows per chunk, a multiple of 16. GEMV (n_tok == 1): about 64 KiB of weights (capped at about 4 chunks
// per thread for small matrices), so a thread that runs out of work idles for ~2 us at most; the chunks are claimed
// in per-thread runs (ChunkQueue) so that a thread's consecutive chunks are adjacent rows and its weight stream
// stays sequential. GEMM: about 4 chunks per thread (a chunk's weight block is reused for every token tile, so
// fewer and larger chunks read the weights fewer times).
int64_t chunk_rows(int64_t n_out, int64_t n_tok, size_t w_row_bytes, int nth) {
  int64_t c = (n_out + 4 * nth - 1) / (4 * nth);
  if (n_tok == 1) {
    const int64_t by_bytes = static_cast<int64_t>((size_t{64} << 10) / (w_row_bytes ? w_row_bytes : 1));
    if (by_bytes < c) c = by_bytes;
  }
  c = (c + 15) / 16 * 16;
  return c < 16 ? 16 : c;
}

// Chunks [0, n) split into one contiguous run per thread; thread i claims from the front of its own run first
// (an uncontended atomic on its own cache line), then from the other runs in turn (so a thread the OS parked or
// slowed does not hold the call up). Measured on the llama3-1b decode (2 threads, Zen 4 VM): one shared counter
// handing out 64 KiB chunks alternately to the threads ran at 41 tok/s against 50 with 256-row chunks: every
// chunk boundary restarted the hardware prefetcher's stream. Own runs keep the stream and allow small chunks.
class ChunkQueue {
 public:
  ChunkQueue(int64_t n, int nth) : nth_(nth) {
    if (nth > kInline) heap_.reset(new Run[nth]);
    Run* r = runs();
    for (int i = 0; i < nth; ++i) {
      r[i].next.store(n * i / nth, std::memory_order_relaxed);
      r[i].end = n * (i + 1) / nth;
    }
  }
  // Next chunk for thread ith, or -1 when all are claimed.
  int64_t claim(int ith) {
    Run* r = runs();
    for (int v = 0; v < nth_; ++v) {
      Run& run = r[(ith + v) % nth_];
      if (run.next.load(std::memory_order_relaxed) >= run.end) continue;
      const int64_t c = run.next.fetch_add(1, std::memory_order_relaxed);
      if (c < run.end) return c;
    }
    return -1;
  }

 private:
  struct alignas(64) Run {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  static constexpr int kInline = 8;
  Run* runs() { return heap_ ? heap_.get() : inline_; }
  int nth_;
  Run inline_[kInline];
  std::unique_ptr<Run[]> heap_;
};

// A group of products run in one parallel region: one fork-join instead of one per product, one quantization of
// an input several products share (q/k/v read the same normed rows, as do gate/up), and the output-row chunks
// of all products in one queue, so a thread that finishes its share of one product's rows moves on to the next
// product instead of waiting at a barrier.
constexpr int kMaxGroup = 8;

// Same quantized bytes: the same input rows in the same activation layout (kFloat rounds to the weight type, so
// it also needs the same weight type).
bool same_act(const MatmulArgs& a, const detail::ActLayout& la, const MatmulArgs& b, const detail::ActLayout& lb) {
  return a.x == b.x && a.x_stride == b.x_stride && a.n_tok == b.n_tok && la.kind == lb.kind && la.n_in == lb.n_in &&
         la.bias128 == lb.bias128 && la.row_bytes == lb.row_bytes &&
         (la.kind != detail::ActKind::kFloat || la.wtype == lb.wtype);
}

// All products have n_tok > 0 and fast kernels for their weight type; n <= kMaxGroup.
Status matmul_fast(const MatmulArgs* a, int n, ThreadPool& pool, const detail::FastKernels& fk) {
  detail::GemmJob job[kMaxGroup];
  int src[kMaxGroup];           // product whose quantized input product i reads (src[i] <= i)
  size_t act_off[kMaxGroup];    // byte offset of product i's quantized rows in the scratch (valid where src[i] == i)
  int64_t row_end[kMaxGroup];   // quantization tasks: rows of the distinct inputs, prefix sums
  int64_t chunk[kMaxGroup], chunk_end[kMaxGroup];  // output chunks: size and prefix sums of counts
  int distinct[kMaxGroup], n_distinct = 0;
  size_t total = 0;
  int64_t rows = 0, chunks = 0;
  for (int i = 0; i < n; ++i) {
    detail::GemmJob& j = job[i];
    j.wtype = a[i].wtype;
    j.w = static_cast<const uint8_t*>(a[i].w);
    j.w_row_bytes = a[i].w_row_bytes;
    j.n_in = a[i].n_in;
    j.layout = detail::act_layout(a[i].wtype, a[i].n_in, fk.bias128);
    j.n_tok = a[i].n_tok;
    j.y = a[i].y;
    j.y_stride = a[i].y_stride;
    src[i] = i;
    for (int k = 0; k < i; ++k)
      if (src[k] == k && same_act(a[k], job[k].layout, a[i], j.layout)) {
        src[i] = k;
        break;
      }
    if (src[i] == i) {
      act_off[i] = total;
      total += j.layout.row_bytes * static_cast<size_t>(a[i].n_tok);
      distinct[n_distinct] = i;
      rows += a[i].n_tok;
      row_end[n_distinct++] = rows;
    }
    chunk[i] = chunk_rows(a[i].n_out, a[i].n_tok, a[i].w_row_bytes, pool.size());
    chunks += (a[i].n_out + chunk[i] - 1) / chunk[i];
    chunk_end[i] = chunks;
  }
  uint8_t* act = tl_scratch.get(total);
  if (!act) return make_error(ErrorCode::kInternal, "matmul: cannot allocate the activation scratch");
  for (int i = 0; i < n; ++i) job[i].act = act + act_off[src[i]];
  std::atomic<int64_t> next_t{0}, done_t{0};
  ChunkQueue queue(chunks, pool.size());
  pool.run([&](int ith, int) {
    quantize_rows_shared(rows, next_t, done_t, [&](int64_t r) {
      int d = 0;
      while (r >= row_end[d]) ++d;
      const int i = distinct[d];
      const int64_t t = r - (d ? row_end[d - 1] : 0);
      fk.quantize(job[i].layout, a[i].x + t * a[i].x_stride, act + act_off[i] + t * job[i].layout.row_bytes);
    });
    for (;;) {
      const int64_t c = queue.claim(ith);
      if (c < 0) break;
      int i = 0;
      while (c >= chunk_end[i]) ++i;
      const int64_t o0 = (c - (i ? chunk_end[i - 1] : 0)) * chunk[i];
      fk.gemm(job[i], o0, o0 + chunk[i] < a[i].n_out ? o0 + chunk[i] : a[i].n_out);
    }
  });
  return Status::ok();
}

// Scalar vec_dot per (row, token), threaded; activations in standard blocks as matmul_ref. A build with
// -DKILN_CPU_EXACT_MATMUL=1 (a parity oracle, dev/parity_exact.sh; never a release build) computes instead each
// output as the f64 dot product of the dequantized weight row and the f32 activations: the model's exact function,
// free of any activation rounding.
Status matmul_scalar(const MatmulArgs& a, ThreadPool& pool) {
  const DType at = detail::act_type(a.wtype);
  const detail::VecDotFn dot = detail::ref_vec_dot(a.wtype);
  const size_t rb = (static_cast<size_t>(dtype_row_bytes(at, a.n_in).value()) + 63) & ~size_t{63};
  uint8_t* act = tl_scratch.get(rb * static_cast<size_t>(a.n_tok));
  if (!act) return make_error(ErrorCode::kInternal, "matmul: cannot allocate the activation scratch");
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  std::atomic<int64_t> next_t{0}, done_t{0}, next{0};
  const int64_t chunk = chunk_rows(a.n_out, a.n_tok, a.w_row_bytes, pool.size());
  pool.run([&](int, int) {
    quantize_rows_shared(a.n_tok, next_t, done_t, [&](int64_t t) {
      (void)quantize_row(at, a.x + t * a.x_stride, act + t * rb, a.n_in);
    });
    for (;;) {
      const int64_t o0 = next.fetch_add(chunk, std::memory_order_relaxed);
      if (o0 >= a.n_out) break;
      const int64_t o1 = o0 + chunk < a.n_out ? o0 + chunk : a.n_out;
#if KILN_CPU_EXACT_MATMUL
      std::vector<float> wr(static_cast<size_t>(a.n_in));
      for (int64_t o = o0; o < o1; ++o) {
        (void)dequantize_row(a.wtype, w + o * a.w_row_bytes, wr.data(), a.n_in);
        for (int64_t t = 0; t < a.n_tok; ++t) {
          double s = 0;
          for (int64_t i = 0; i < a.n_in; ++i) s += static_cast<double>(wr[i]) * a.x[t * a.x_stride + i];
          a.y[t * a.y_stride + o] = static_cast<float>(s);
        }
      }
      (void)dot;
#else
      for (int64_t o = o0; o < o1; ++o)
        for (int64_t t = 0; t < a.n_tok; ++t) a.y[t * a.y_stride + o] = dot(w + o * a.w_row_bytes, act + t * rb, a.n_in);
#endif
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
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4: case DType::TQ1_0: case DType::TQ2_0:
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M:
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

Status matmul_group_at_level(const MatmulArgs* a, int n, ThreadPool& pool, SimdLevel level) {
  if (n < 0) return make_error(ErrorCode::kInvalidArgument, "matmul: %d products", n);
  for (int i = 0; i < n; ++i) KILN_TRY(matmul_check(a[i]));
  const SimdLevel best = cpu_simd_level();
  const FastKernels* fk = fast_kernels_at(level < best ? level : best);
  // The fast group takes the products with fast kernels, kMaxGroup at a time; the rest run one by one.
  MatmulArgs fast[kMaxGroup];
  int n_fast = 0;
  for (int i = 0; i < n; ++i) {
    if (a[i].n_tok == 0) continue;
    if (!fk || !fk->has(a[i].wtype)) {
      KILN_TRY(matmul_scalar(a[i], pool));
      continue;
    }
    fast[n_fast++] = a[i];
    if (n_fast == kMaxGroup) {
      KILN_TRY(matmul_fast(fast, n_fast, pool, *fk));
      n_fast = 0;
    }
  }
  if (n_fast > 0) KILN_TRY(matmul_fast(fast, n_fast, pool, *fk));
  return Status::ok();
}

Status matmul_at_level(const MatmulArgs& a, ThreadPool& pool, SimdLevel level) {
  return matmul_group_at_level(&a, 1, pool, level);
}

}  // namespace detail

Status matmul(const MatmulArgs& a, ThreadPool& pool) { return detail::matmul_at_level(a, pool, matmul_simd_level()); }

Status matmul_group(const MatmulArgs* a, int n, ThreadPool& pool) {
  return detail::matmul_group_at_level(a, n, pool, matmul_simd_level());
}

const char* simd_level() { return simd_level_name(matmul_simd_level()); }

}  // namespace kiln::cpu
