// Flash-attention prefill on wgmma (sm_90a): the same problem, CTA geometry, row map, masks and numerics as
// fattn_mma.cu's mma.sync kernel (read its header first), for head dims 64, 128 and 256 on 9.0 devices.
// fattn_mma.cuh's fa_wg_variant picks one of its variants (hd 64 and 128: the warp-specialized fattn_ws; hd 256: 2
// warpgroups; the ledger there).
//
// A CTA is WGS warpgroups (1 or 2), 64 query rows each: the M of each warpgroup's wgmmas (warp w owns rows
// 16w..16w+15, as in the mma.sync kernel, so the row map, the softmax on fragments and the store are shared:
// fattn_mma.cuh). Two warpgroups share every K/V tile (half the shared-memory traffic per row).
// Per KV tile of BC positions (64; 32 at head dim 256):
//   S = Q K^T: D/16 wgmma.m64nBCk16, A = Q fragments from registers (loaded once; at head dim 256 Q stays in shared
//   memory in the tiles' swizzled layout and A is its descriptor: wg_q_smem), B = the K tile from shared memory;
//   online softmax on S's registers (wgmma's accumulator is, per warp, the mma.sync C fragments);
//   O += P V: BC/16 wgmma.m64nDk16, A = P converted in registers (the C -> A identity of fattn_mma.cu), B = the V tile
//   from shared memory, read MN-major (transposed: d contiguous).
// Shared memory: a ring of NST stages (3 for one warpgroup, 4 for two) of (K, V) tiles, filled by cp.async NST - 1
// tiles ahead; the Q staging aliases the ring before the first copy. Both tiles use one layout, wgmma's 128-byte
// swizzle (wgmma.cuh): atoms of 8 positions x 64 dims (128 bytes a position), 1024 bytes each, 16-byte chunk c of
// position row r at chunk c ^ r; atom (pg, dg) = positions 8pg.., dims 64dg.. at byte dg * BC * 128 + pg * 1024.
// Read as K-major B of Q K^T (N = positions, K = dims): SBO 1024 (next position group), a k-step of 16 dims advances
// the start by 32 bytes inside the atom, the next 64 dims are the next atom column. Read as MN-major B of P V (K =
// positions, N = dims): LBO one atom column (BC * 128: the next 64 dims), SBO 1024 (the next 8 positions). Copies:
// 8 consecutive threads take one position's 128-byte row (whole rows from global memory, 8 distinct bank groups in
// shared memory). The ring starts at a 1024-byte boundary (1 KB more dynamic shared memory).
// Order per tile j without PIPE (one barrier): wait for tile j's copies, fence them to the async proxy, barrier
// (every thread is past tile j - 1's wgmmas, so its stage is free), issue the copies of tile j + NST - 1, S wgmmas,
// wait, softmax, O *= alpha, P V wgmmas, wait. The tensor cores idle during one CTA's softmax; other CTAs on the SM
// fill them. PIPE (below): tile j's S and softmax overlap tile j - 1's P V within the warpgroup.
// Every tile of the CTA's range is computed by all 4 warps (wgmma is warpgroup-wide): a warp whose rows all mask a
// tile gets p = 0 and factor 1 from the masks, as fattn_mma.cu's skipped tile leaves them.
//
// Ledger (per lane: Q D/4 (0 with Q in shared memory) + S BC/2 + O D/2 registers, + BC/4 for P's fragments, + 2 NIT
// block-table entries with PIPE; measured with nvcc 13.0 -Xptxas -v, sm_90a: no spills, no injected warpgroup
// waits), registers without / with PIPE:
//   D 256, 1 warpgroup: 216 / 232; shared Q 32 KB + 3 x 32 KB -> 1 CTA (4 warps) per SM.
//   D 256, 2 warpgroups: 201 / 216; shared Q 64 KB + 4 x 32 KB = 192 KB -> 1 CTA (8 warps) per SM.
//   D 128, 1 warpgroup: 194 / 240; shared 3 x 32 KB = 96 KB -> 2 CTAs (8 warps) per SM: shared memory is the limit.
//   D 128, 2 warpgroups: 186 / 209; shared 4 x 32 KB = 128 KB -> 1 CTA (8 warps) per SM.
//   D 64, 1 warpgroup: 134 / 163; shared 48 KB; registers are the limit: __launch_bounds__(128, 3).
//   D 64, 2 warpgroups: 131 / 160; shared 64 KB -> 1 CTA per SM (2 would need 131 x 512 > 64K registers).
//   (fattn_ws: 168, the launch bound of its 384 threads; setmaxnreg then splits them 56 / 224.)
// Where the time went before the table reads moved a step ahead (ncu, hd 128, 4096 tokens, 2 pipelined warpgroups):
// 0.41 instructions issued per scheduler cycle; stalls per issued instruction: fixed-latency waits 1.35, long
// scoreboard 0.82 (the block-table loads each copy waited for), barrier 0.46; tensor pipe active 17.8%.
#include "backend/cuda/fattn_mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace kiln::cuda {
namespace {

// KV tile positions: 64; 32 at head dim 256 (registers: O alone is 128 per lane there, S m64n32 adds 16).
constexpr int wg_bc(int d) { return d > 128 ? 32 : 64; }
// Q in shared memory, read by the S wgmmas as a descriptor (A from shared memory), where its fragments would not
// fit in registers beside O (head dim 256: 64 more per lane); else Q fragments in registers, loaded once.
constexpr bool wg_q_smem(int d) { return d > 128; }
constexpr int wg_stages(int wgs) { return wgs == 2 ? 4 : 3; }
constexpr size_t wg_tile_bytes(int d) { return static_cast<size_t>(wg_bc(d)) * d * 2; }  // K or V
// Q in shared memory: 64 rows per warpgroup, the same 128-byte swizzled atoms as the K/V tiles.
constexpr size_t wg_q_bytes(int d, int wgs) { return wg_q_smem(d) ? static_cast<size_t>(64) * wgs * d * 2 : 0; }
// + 1024: Q and the ring start at the first 1024-byte boundary (the swizzle atoms' alignment). Head dim 256: 1
// warpgroup 32 + 3 x 32 KB, 2 warpgroups 64 + 4 x 32 KB (193 KB).
constexpr size_t wg_smem_of(int d, int wgs) {
  return wg_q_bytes(d, wgs) + wg_stages(wgs) * 2 * wg_tile_bytes(d) + 1024;
}
constexpr int wg_min_blocks(int d, int wgs) { return wgs == 2 || d > 128 ? 1 : d <= 64 ? 3 : 2; }

// Q -> f16 shared memory in the swizzled K-major layout the S wgmmas read as A: row r of the CTA (warpgroup r / 64,
// its row rr = r % 64), 16-byte chunk ch (dims 8ch..8ch+7) at warpgroup * 64 D 2 + (ch / 8) * 8192 + (rr / 8) *
// 1024 + (rr % 8) * 128 + ((ch % 8) ^ (rr % 8)) * 16 bytes; dead rows zero. Written with st.shared: the caller
// fences them to the async proxy before the barrier that publishes them.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void wg_stage_q_sw(const AttnParams& p, const FaGeo& geo, const FaCta& c, uint8_t* qs) {
  constexpr int CH = D / 8;
  for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
    const int r = i / CH, ch = i % CH, rr = r % 64;
    const int t = c.tok(geo, r);
    float x[8] = {};
    if (t >= 0) {
      const float* qr =
          p.q + static_cast<size_t>(t) * p.q_tok_stride + static_cast<size_t>(c.head(geo, r)) * p.q_head_stride;
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = qr[8 * ch + e];
    }
    uint32_t h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __half2 v = __floats2half2_rn(x[2 * e], x[2 * e + 1]);
      h[e] = *reinterpret_cast<const uint32_t*>(&v);
    }
    const size_t off = static_cast<size_t>(r / 64) * (64 * D * 2) + (ch / 8) * 8192 + (rr / 8) * 1024 + (rr % 8) * 128 +
                       (((ch % 8) ^ (rr % 8)) << 4);
    *reinterpret_cast<uint4*>(qs + off) = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

template <int D, bool PIPE, int WGS>
__global__ void __launch_bounds__(128 * WGS, wg_min_blocks(D, WGS)) fattn_wg(AttnParams p, FaGeo geo) {
  if constexpr (!kWgHere) {  // compiled for another target than sm_90a: never launched there
    __trap();
  } else {
    constexpr int BC = wg_bc(D), LD = D + 8, NS = BC / 8, NO = D / 8, KQ = D / 16, CH = D / 8;
    constexpr int THREADS = 128 * WGS, ROWS = 64 * WGS, NST = wg_stages(WGS);
    constexpr bool QS = wg_q_smem(D);
    constexpr uint32_t kTile = static_cast<uint32_t>(wg_tile_bytes(D)), kStage = 2 * kTile;
    constexpr uint32_t kAtomCol = BC * 128;  // one 64-dim column of atoms: BC / 8 atoms of 1024 bytes
    constexpr uint32_t kQBytes = static_cast<uint32_t>(wg_q_bytes(D, WGS)), kQAtomCol = 64 * 128;
    // S's k-step k (dims 16k..16k+15): its atom column, then 32 bytes per step inside the atom (16-byte units).
    constexpr auto k_step = [](int k) { return static_cast<uint64_t>(((k / 4) * kAtomCol + (k % 4) * 32) >> 4); };
    constexpr auto q_step = [](int k) { return static_cast<uint64_t>(((k / 4) * kQAtomCol + (k % 4) * 32) >> 4); };
    static_assert(QS || ROWS * LD * 2 <= NST * kStage, "the Q staging aliases the ring");
    static_assert(BC * CH % THREADS == 0, "whole copy rounds");
    extern __shared__ __align__(128) uint8_t fa_wg_smem[];
    // [Q (QS)][ring of NST stages], from the first 1024-byte boundary
    const uint32_t s_raw = smem_u32(fa_wg_smem), s_q = (s_raw + 1023u) & ~1023u, s_base = s_q + kQBytes;
    uint8_t* q_region = fa_wg_smem + (s_q - s_raw);
    __half* qs = reinterpret_cast<__half*>(q_region);  // !QS: Q staging [ROWS][D + 8] f16, aliasing the ring

    const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / kWarp, 0), lane = tid % kWarp;
    FaCta c;
    if (!fa_cta(p, geo, c)) return;
    if constexpr (QS) {
      wg_stage_q_sw<D, ROWS, THREADS>(p, geo, c, q_region);
      wg_proxy_fence();  // the wgmmas read Q through the async proxy, after the barrier below
    } else {
      fa_stage_q<D, LD, ROWS, THREADS>(p, geo, c, qs);
    }
    const FaRows w = fa_rows(p, geo, c, warp, lane);
    int kv_begin, kv_end;
    fa_cta_range(w, lane, kv_begin, kv_end);  // its barrier also publishes the Q tile
    const int t_first = kv_end > 0 ? kv_begin / BC * BC : 0;
    const int n_tiles = kv_end > 0 ? ceil_div(kv_end - t_first, BC) : 0;

    uint32_t qf[QS ? 1 : KQ][4];  // QS: unused (Q through q_desc)
    const uint64_t q_desc = wg_desc_sw128(s_q + static_cast<uint32_t>(warp / 4) * (64 * D * 2), 16, 1024);
    if constexpr (!QS) {
      const int lm = lane >> 3, lr = lane & 7;  // ldmatrix: matrix id, row within it
      const uint32_t q_base = smem_u32(qs + (warp * 16 + (lm & 1) * 8 + lr) * LD + (lm >> 1) * 8);
#pragma unroll
      for (int k = 0; k < KQ; ++k) ldsm_x4(q_base + k * 32, qf[k][0], qf[k][1], qf[k][2], qf[k][3]);
      __syncthreads();  // every warp holds its Q fragments: the ring may overwrite the staging
    }

    const int bs_shift = (p.block_size & (p.block_size - 1)) == 0 ? __ffs(p.block_size) - 1 : -1;
    const uint8_t* kg = p.k + static_cast<size_t>(c.g) * p.k_head_bytes;
    const uint8_t* vg = p.v + static_cast<size_t>(c.g) * p.v_head_bytes;
    // K and V of tile j into stage j % NST (K first, V after it); ld_k / ld_v pick which. A thread copies NIT
    // 16-byte chunks per tile, of positions pl = (tid + it THREADS) / CH; table_of reads their block-table entries
    // (global loads: the pipelined loop issues them a step before copy_tile needs them, off the copy's path).
    constexpr int NIT = BC * CH / THREADS;
    auto table_of = [&](int j, int (&tv)[NIT]) {
      const int base = t_first + j * BC;
#pragma unroll
      for (int it = 0; it < NIT; ++it) {
        const int pos = base + (tid + it * THREADS) / CH;
        const bool ok = pos >= kv_begin && pos < kv_end;
        tv[it] = ok ? c.table[bs_shift >= 0 ? pos >> bs_shift : pos / p.block_size] : 0;
      }
    };
    auto copy_tile = [&](int j, const int (&tv)[NIT], bool ld_k, bool ld_v) {
      const int base = t_first + j * BC;
      const uint32_t ks = s_base + static_cast<uint32_t>(j % NST) * kStage, vs = ks + kTile;
#pragma unroll
      for (int it = 0; it < NIT; ++it) {
        const int i = tid + it * THREADS;
        const int cc = i & 7, atom = (i >> 3) % (CH / 8), pl = i / CH, pos = base + pl;
        const bool ok = pos >= kv_begin && pos < kv_end;
        const int off = bs_shift >= 0 ? pos & (p.block_size - 1) : pos % p.block_size;
        const int64_t slot = ok ? static_cast<int64_t>(tv[it]) * p.block_size + off : 0;
        const uint32_t dst = atom * kAtomCol + (pl >> 3) * 1024 + (pl & 7) * 128 + ((cc ^ (pl & 7)) << 4);
        const int src = (atom * 8 + cc) * 16;
        if (ld_k) cp_async16(ks + dst, ok ? kg + slot * p.k_slot_bytes + src : p.k, ok);
        if (ld_v) cp_async16(vs + dst, ok ? vg + slot * p.v_slot_bytes + src : p.v, ok);
      }
    };
    auto load_tile = [&](int j, bool ld_k, bool ld_v) {
      int tv[NIT];
      table_of(j, tv);
      copy_tile(j, tv, ld_k, ld_v);
    };
    auto k_desc_of = [&](int j) {
      return wg_desc_sw128(s_base + static_cast<uint32_t>(j % NST) * kStage, 16, 1024);
    };
    auto v_desc_of = [&](int j) {
      return wg_desc_sw128(s_base + static_cast<uint32_t>(j % NST) * kStage + kTile, kAtomCol, 1024);
    };

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float s[NS][4];  // each tile's first wgmma overwrites it (add 0); zeroed once so no register is read unset
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const float sl2 = p.scale * 1.4426950408889634f;

    if constexpr (!PIPE) {
#pragma unroll
      for (int t = 0; t < NST - 1; ++t) {
        if (t < n_tiles) load_tile(t, true, true);
        cp_async_commit();
      }
      for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<NST - 2>();  // tile j's copies (this thread's); those of the next NST - 2 may be in flight
        wg_proxy_fence();
        __syncthreads();
        if (j + NST - 1 < n_tiles) load_tile(j + NST - 1, true, true);
        cp_async_commit();  // one group per iteration, empty or not: the wait above always means tile j
        const int base = t_first + j * BC;
        const uint64_t k_desc = k_desc_of(j);
        wg_fence();
#pragma unroll
        for (int k = 0; k < KQ; ++k) {
          if constexpr (QS) {
            wg_mma_ss<NS>(s, q_desc + q_step(k), k_desc + k_step(k), k > 0);
          } else {
            wg_mma<NS, 0>(s, qf[k], k_desc + k_step(k), k > 0);
          }
        }
        wg_commit();
        wg_wait<0>();

        float alpha[2];
        fa_softmax<NS>(s, base, w.full(base, BC), w, sl2, m_run, l_run, alpha, lane);
#pragma unroll
        for (int n = 0; n < NO; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];

        uint32_t pa[BC / 16][4];  // every A fragment first: no register of a wgmma's operands written between them
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) fa_p_frag<NS>(s, kk, pa[kk]);
        const uint64_t v_desc = v_desc_of(j);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) wg_mma<NO, 1>(o, pa[kk], v_desc + ((kk * 2048) >> 4), 1);
        wg_commit();
        wg_wait<0>();
      }
    } else {
      // Software pipeline: tile j's S wgmmas and tile j - 1's P V wgmmas are in flight together, and tile j's
      // softmax runs while P V (j - 1) multiplies. P j - 1 waits in registers as its f16 A fragments (pa), converted
      // at the end of step j - 1, so S has one register set. Copy group i (committed in step i) holds K of tile
      // i + NST - 1 and V of tile i + NST - 2; the prologue's NST - 1 groups hold K 0, then K k + V k - 1. Step j
      // needs K j and V j - 1 (wait_group NST - 2), overwrites K j - 1's stage (S j - 1 done in step j - 1) and
      // V j - 2's (P V j - 2 done in step j - 1).
      uint32_t pa[BC / 16][4];
      if (n_tiles > 0) load_tile(0, true, false);
      cp_async_commit();
#pragma unroll
      for (int k = 1; k < NST - 1; ++k) {
        if (k < n_tiles) load_tile(k, true, false);
        if (k - 1 < n_tiles) load_tile(k - 1, false, true);
        cp_async_commit();
      }
      auto pv = [&](int jp) {  // issue P V of tile jp (P in pa)
        const uint64_t v_desc = v_desc_of(jp);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) wg_mma<NO, 1>(o, pa[kk], v_desc + ((kk * 2048) >> 4), 1);
        wg_commit();
      };
      int tk[NIT], tv[NIT];  // the table entries of the next K tile (j + NST - 1) and the next V tile (j + NST - 2)
      table_of(NST - 1, tk);
      table_of(NST - 2, tv);
      for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<NST - 2>();
        wg_proxy_fence();
        __syncthreads();
        if (j + NST - 1 < n_tiles) copy_tile(j + NST - 1, tk, true, false);
        if (j + NST - 2 < n_tiles) copy_tile(j + NST - 2, tv, false, true);
        cp_async_commit();
#pragma unroll
        for (int it = 0; it < NIT; ++it) tv[it] = tk[it];
        table_of(j + NST, tk);  // used by the next step's copies
        const uint64_t k_desc = k_desc_of(j);
        wg_fence();
#pragma unroll
        for (int k = 0; k < KQ; ++k) {
          if constexpr (QS) {
            wg_mma_ss<NS>(s, q_desc + q_step(k), k_desc + k_step(k), k > 0);
          } else {
            wg_mma<NS, 0>(s, qf[k], k_desc + k_step(k), k > 0);
          }
        }
        wg_commit();
        if (j > 0) {
          pv(j - 1);
          wg_wait<1>();  // S j done; P V j - 1 may still run
        } else {
          wg_wait<0>();
        }
        const int base = t_first + j * BC;
        float alpha[2];
        fa_softmax<NS>(s, base, w.full(base, BC), w, sl2, m_run, l_run, alpha, lane);
        wg_wait<0>();  // P V j - 1 done: O may be rescaled, pa rewritten
#pragma unroll
        for (int n = 0; n < NO; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) fa_p_frag<NS>(s, kk, pa[kk]);
      }
      if (n_tiles > 0) {  // P V of the last tile
        cp_async_wait<0>();
        wg_proxy_fence();
        __syncthreads();
        pv(n_tiles - 1);
        wg_wait<0>();
      }
    }
    cp_async_wait<0>();  // no copy outlives the CTA (the last groups are empty)
    fa_store<D>(p, geo, c, w, o, m_run, l_run, warp, lane);
  }
}

// ---- Warp-specialized variant (ws): one warpgroup copies, two compute ----------------------------------------------
// fattn_ws<D> (D 64 / 128): the pipelined two-warpgroup kernel above with its copies moved to a third warpgroup, so
// the compute warpgroups issue no copy, address or table instruction and meet at no CTA barrier per tile. Warpgroup
// 0 (the producer, setmaxnreg down to kWsProdRegs) fills a ring of kWsStages stages, each K and V of one tile, in
// tile order; warpgroups 1 and 2 (the consumers, setmaxnreg up to kWsConsRegs) are fattn_wg<D, true, 2>'s two
// warpgroups (rows 64 (wg - 1) .. + 63 of the CTA). Per stage s two mbarriers:
//   full[s]: 128 arrivals per fill, each producer thread's cp.async.mbarrier.arrive.noinc (it fires when that
//            thread's copies so far have landed); a consumer waits for fill f of s (tile j = f kWsStages + s) with
//            parity f & 1, then fences the landed bytes to the async proxy (its wgmmas read them).
//   empty[s]: 8 arrivals per release, lane 0 of each consumer warp once its P V wgmmas of the stage's tile are done
//            (wait_group 0 in that warp); the producer waits for release f - 1 (parity (f - 1) & 1) before fill f.
// Q: staged by all 384 threads into its own region ([ROWS][D + 8] f16: the ring is written while consumers still read
// the staging), read into registers by the consumers after the CTA's one barrier (fa_cta_range's).
// Registers (setmaxnreg: whole warpgroups, multiples of 8): 128 x kWsProdRegs + 256 x kWsConsRegs <= 65536.
constexpr int kWsStages = 4, kWsProdRegs = 56, kWsConsRegs = 224;
static_assert(128 * kWsProdRegs + 256 * kWsConsRegs <= 65536, "the register file");
constexpr size_t ws_q_bytes(int d) { return static_cast<size_t>(128) * (d + 8) * 2; }
// + 1024: the ring starts at a 1024-byte boundary; Q after it.
constexpr size_t ws_smem_of(int d) { return kWsStages * 2 * wg_tile_bytes(d) + ws_q_bytes(d) + 1024; }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// This thread's cp.asyncs issued so far arrive on bar when they complete (no pending count added: init counts them).
__device__ __forceinline__ void mbar_cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWS_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra WS_DONE;\nbra WS_WAIT;\nWS_DONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
template <int N>
__device__ __forceinline__ void reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int D>
__global__ void __launch_bounds__(384, 1) fattn_ws(AttnParams p, FaGeo geo) {
  if constexpr (!kWgHere || D > 128) {  // another target than sm_90a, or a head dim without this variant
    __trap();
  } else {
    constexpr int BC = wg_bc(D), LD = D + 8, NS = BC / 8, NO = D / 8, KQ = D / 16, CH = D / 8, NST = kWsStages;
    constexpr uint32_t kTile = static_cast<uint32_t>(wg_tile_bytes(D)), kStage = 2 * kTile, kAtomCol = BC * 128;
    constexpr auto k_step = [](int k) { return static_cast<uint64_t>(((k / 4) * kAtomCol + (k % 4) * 32) >> 4); };
    constexpr int NIT = BC * CH / 128;  // 16-byte chunks of K (and of V) per producer thread and tile
    static_assert(BC * CH % 128 == 0, "whole copy rounds");
    extern __shared__ __align__(128) uint8_t fa_wg_smem[];
    __shared__ __align__(8) uint64_t full[NST], empty[NST];
    const uint32_t s_raw = smem_u32(fa_wg_smem), s_base = (s_raw + 1023u) & ~1023u;
    __half* qs = reinterpret_cast<__half*>(fa_wg_smem + (s_base - s_raw) + NST * kStage);  // [128][D + 8] f16

    const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / kWarp, 0), lane = tid % kWarp;
    const int wg = warp / 4, cw = warp - 4;  // warpgroup; consumer warp 0..7 (rows 16 cw ..)
    FaCta c;
    if (!fa_cta(p, geo, c)) return;
    if (tid < NST) {
      mbar_init(smem_u32(&full[tid]), 128);
      mbar_init(smem_u32(&empty[tid]), 8);
    }
    fa_stage_q<D, LD, 128, 384>(p, geo, c, qs);
    FaRows w{};  // the producer's: no rows (w_hi 0)
    if (wg > 0) w = fa_rows(p, geo, c, cw, lane);
    int kv_begin, kv_end;
    fa_cta_range(w, lane, kv_begin, kv_end);  // the CTA's one barrier: Q staged, barriers initialized
    const int t_first = kv_end > 0 ? kv_begin / BC * BC : 0;
    const int n_tiles = kv_end > 0 ? ceil_div(kv_end - t_first, BC) : 0;

    if (wg == 0) {  // ---- producer
      reg_dealloc<kWsProdRegs>();
      const int bs_shift = (p.block_size & (p.block_size - 1)) == 0 ? __ffs(p.block_size) - 1 : -1;
      const uint8_t* kg = p.k + static_cast<size_t>(c.g) * p.k_head_bytes;
      const uint8_t* vg = p.v + static_cast<size_t>(c.g) * p.v_head_bytes;
      for (int j = 0; j < n_tiles; ++j) {
        const int st = j % NST, f = j / NST;
        if (f > 0) mbar_wait(smem_u32(&empty[st]), static_cast<uint32_t>(f - 1) & 1u);
        const int base = t_first + j * BC;
        const uint32_t ks = s_base + static_cast<uint32_t>(st) * kStage, vs = ks + kTile;
#pragma unroll 4
        for (int it = 0; it < NIT; ++it) {
          const int i = tid + it * 128;
          const int cc = i & 7, atom = (i >> 3) % (CH / 8), pl = i / CH, pos = base + pl;
          const bool ok = pos >= kv_begin && pos < kv_end;
          const int64_t slot = ok ? fa_slot(c.table, pos, p.block_size, bs_shift) : 0;
          const uint32_t dst = atom * kAtomCol + (pl >> 3) * 1024 + (pl & 7) * 128 + ((cc ^ (pl & 7)) << 4);
          const int src = (atom * 8 + cc) * 16;
          cp_async16(ks + dst, ok ? kg + slot * p.k_slot_bytes + src : p.k, ok);
          cp_async16(vs + dst, ok ? vg + slot * p.v_slot_bytes + src : p.v, ok);
        }
        mbar_cp_async_arrive(smem_u32(&full[st]));
      }
      cp_async_wait<0>();  // no copy outlives the CTA
      return;
    }

    // ---- consumers: fattn_wg<D, true, 2>'s loop, stages by mbarrier
    reg_alloc<kWsConsRegs>();
    uint32_t qf[KQ][4];
    {
      const int lm = lane >> 3, lr = lane & 7;
      const uint32_t q_base = smem_u32(qs + (cw * 16 + (lm & 1) * 8 + lr) * LD + (lm >> 1) * 8);
#pragma unroll
      for (int k = 0; k < KQ; ++k) ldsm_x4(q_base + k * 32, qf[k][0], qf[k][1], qf[k][2], qf[k][3]);
    }
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const float sl2 = p.scale * 1.4426950408889634f;
    uint32_t pa[BC / 16][4];
    auto pv = [&](int jp) {
      const uint64_t v_desc = wg_desc_sw128(s_base + static_cast<uint32_t>(jp % NST) * kStage + kTile, kAtomCol, 1024);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) wg_mma<NO, 1>(o, pa[kk], v_desc + ((kk * 2048) >> 4), 1);
      wg_commit();
    };
    for (int j = 0; j < n_tiles; ++j) {
      mbar_wait(smem_u32(&full[j % NST]), static_cast<uint32_t>(j / NST) & 1u);
      wg_proxy_fence();
      const uint64_t k_desc = wg_desc_sw128(s_base + static_cast<uint32_t>(j % NST) * kStage, 16, 1024);
      wg_fence();
#pragma unroll
      for (int k = 0; k < KQ; ++k) wg_mma<NS, 0>(s, qf[k], k_desc + k_step(k), k > 0);
      wg_commit();
      if (j > 0) {
        pv(j - 1);
        wg_wait<1>();
      } else {
        wg_wait<0>();
      }
      const int base = t_first + j * BC;
      float alpha[2];
      fa_softmax<NS>(s, base, w.full(base, BC), w, sl2, m_run, l_run, alpha, lane);
      wg_wait<0>();  // P V j - 1 done: its stage is free, O may be rescaled, pa rewritten
      if (j > 0 && lane == 0) mbar_arrive(smem_u32(&empty[(j - 1) % NST]));
#pragma unroll
      for (int n = 0; n < NO; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) fa_p_frag<NS>(s, kk, pa[kk]);
    }
    if (n_tiles > 0) {
      pv(n_tiles - 1);
      wg_wait<0>();
    }
    fa_store<D>(p, geo, c, w, o, m_run, l_run, cw, lane);
  }
}

template <int D>
const void* pick(FaWgVariant v) {
  if (v.ws) return D <= 128 ? reinterpret_cast<const void*>(fattn_ws<D>) : nullptr;
  if (v.wgs == 1) return v.pipe ? reinterpret_cast<const void*>(fattn_wg<D, true, 1>) : reinterpret_cast<const void*>(fattn_wg<D, false, 1>);
  if (v.wgs == 2) return v.pipe ? reinterpret_cast<const void*>(fattn_wg<D, true, 2>) : reinterpret_cast<const void*>(fattn_wg<D, false, 2>);
  return nullptr;
}

}  // namespace

const void* fattn_wg_kernel(int d, FaWgVariant v) {
  return d == 64 ? pick<64>(v) : d == 128 ? pick<128>(v) : d == 256 ? pick<256>(v) : nullptr;
}
size_t fattn_wg_smem(int d, FaWgVariant v) {
  if (v.ws) return d == 64 || d == 128 ? ws_smem_of(d) : 0;
  return (d == 64 || d == 128 || d == 256) && (v.wgs == 1 || v.wgs == 2) ? wg_smem_of(d, v.wgs) : 0;
}

}  // namespace kiln::cuda
