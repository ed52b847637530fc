// wgmma (sm_90a) building blocks shared by the op families that use it (mmf.cuh, sm90a/fattn_wgmma.cu): shared-memory
// matrix descriptors, the fences and groups, and one wgmma.m64nNk16 f16 -> f32 with A from registers.
// Code that issues wgmma is compiled for sm_90a alone (src/CMakeLists.txt: kiln_cuda_sm90a); elsewhere these helpers
// compile to nothing and kWgHere is false, so a kernel instance for another target traps if launched (never: the
// selectors ask for the sm_90a instance first).
// Layouts (PTX ISA, "asynchronous warpgroup level matrix shared memory layout"), no swizzle: the unit is the core
// matrix, 8 rows of 16 contiguous bytes (128 bytes). K-major operand: a row is 8 K-elements of one M/N index.
// MN-major operand (transposed B, tb = 1): a row is 8 N-elements of one K index. In both, LBO is the byte distance
// between core matrices adjacent in K, SBO between core matrices adjacent in M/N.
// Register fragments: A (this warp's 16 rows of the 64) is mma.sync m16n8k16's A fragment; the accumulator d[nt][i]
// of an m64nN wgmma is, per warp, N/8 mma.sync m16n8 C fragments: row 16 warp + g + 8 (i / 2), column 8 nt + 2t + i % 2
// (g = lane / 4, t = lane % 4).
#pragma once

#include <cstdint>

namespace kiln::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WG 1
constexpr bool kWgHere = true;
#else
constexpr bool kWgHere = false;
#endif

// No swizzle (bits 62-63 zero), base offset 0; addresses and offsets in 16-byte units (14 bits each).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32);
}
// The 128-byte swizzle (bits 62-63 = 1): atoms of 8 rows x 128 bytes, 1024-byte aligned, the 16-byte chunk c of row
// r stored at chunk c ^ (r % 8). K-major: a row is 64 K-elements of one M/N index (LBO unused, SBO the distance
// between 8-row groups; a k-step inside the atom advances the start address by its 32 bytes). MN-major: a row is 64
// N-elements of one K index (LBO the distance between 64-element N groups, SBO between 8-row K groups).
__device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return wg_desc(saddr, lbo, sbo) | (1ull << 62);
}
// Before the first wgmma that reads registers (A, or accumulators) written since the last wgmma.
__device__ __forceinline__ void wg_fence() {
#ifdef KILN_WG
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#ifdef KILN_WG
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warp are pending.
template <int N>
__device__ __forceinline__ void wg_wait() {
#ifdef KILN_WG
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// A register's value, read here: code outside the wgmma chain works on copies, never on registers a wgmma may own.
__device__ __forceinline__ float wg_reg_copy(float x) {
  float y;
  asm volatile("mov.b32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Shared memory written through the generic proxy (st.shared, cp.async) becomes visible to wgmma (the async proxy)
// after this fence and a barrier.
__device__ __forceinline__ void wg_proxy_fence() {
#ifdef KILN_WG
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// d = (add ? d : 0) + A (registers, this warp's 16 rows of 64) x B (descriptor: 16 x 8NT), f16 inputs, f32 sums.
// TB = 1: B is MN-major (transposed).
#define KILN_WG_D4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
template <int NT, int TB = 0>
__device__ __forceinline__ void wg_mma(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc, int add) {
  static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8 || NT == 16 || NT == 32, "wgmma tiles of 8..256 columns");
#ifdef KILN_WG
  if constexpr (NT == 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, %10;\n}\n"
        : KILN_WG_D4(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add), "n"(TB));
  } else if constexpr (NT == 2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7},"
        " {%8,%9,%10,%11}, %12, p, 1, 1, %14;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add), "n"(TB));
  } else if constexpr (NT == 4) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15},"
        " {%16,%17,%18,%19}, %20, p, 1, 1, %22;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1), KILN_WG_D4(2), KILN_WG_D4(3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add), "n"(TB));
  } else if constexpr (NT == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1), KILN_WG_D4(2), KILN_WG_D4(3), KILN_WG_D4(4), KILN_WG_D4(5), KILN_WG_D4(6),
          KILN_WG_D4(7)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add), "n"(TB));
  } else if constexpr (NT == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1), KILN_WG_D4(2), KILN_WG_D4(3), KILN_WG_D4(4), KILN_WG_D4(5), KILN_WG_D4(6),
          KILN_WG_D4(7), KILN_WG_D4(8), KILN_WG_D4(9), KILN_WG_D4(10), KILN_WG_D4(11), KILN_WG_D4(12), KILN_WG_D4(13),
          KILN_WG_D4(14), KILN_WG_D4(15)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add), "n"(TB));
  } else if constexpr (NT == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
        "}, {%128,%129,%130,%131}, %132, p, 1, 1, %134;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1), KILN_WG_D4(2), KILN_WG_D4(3), KILN_WG_D4(4), KILN_WG_D4(5),
          KILN_WG_D4(6), KILN_WG_D4(7), KILN_WG_D4(8), KILN_WG_D4(9), KILN_WG_D4(10), KILN_WG_D4(11),
          KILN_WG_D4(12), KILN_WG_D4(13), KILN_WG_D4(14), KILN_WG_D4(15), KILN_WG_D4(16), KILN_WG_D4(17),
          KILN_WG_D4(18), KILN_WG_D4(19), KILN_WG_D4(20), KILN_WG_D4(21), KILN_WG_D4(22), KILN_WG_D4(23),
          KILN_WG_D4(24), KILN_WG_D4(25), KILN_WG_D4(26), KILN_WG_D4(27), KILN_WG_D4(28), KILN_WG_D4(29),
          KILN_WG_D4(30), KILN_WG_D4(31)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add), "n"(TB));
  }
#endif
}

// d = (add ? d : 0) + A (descriptor: 64 x 16, K-major) x B (descriptor: 16 x 8NT, K-major), f16 inputs, f32 sums:
// both operands from shared memory (the A of a warpgroup's 64 rows, where registers cannot hold it).
template <int NT>
__device__ __forceinline__ void wg_mma_ss(float (&d)[NT][4], uint64_t adesc, uint64_t bdesc, int add) {
  static_assert(NT == 4 || NT == 8, "wgmma SS tiles of 32 or 64 columns");
#ifdef KILN_WG
  if constexpr (NT == 4) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15},"
        " %16, %17, p, 1, 1, 0, 0;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1), KILN_WG_D4(2), KILN_WG_D4(3)
        : "l"(adesc), "l"(bdesc), "r"(add));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : KILN_WG_D4(0), KILN_WG_D4(1), KILN_WG_D4(2), KILN_WG_D4(3), KILN_WG_D4(4), KILN_WG_D4(5), KILN_WG_D4(6),
          KILN_WG_D4(7)
        : "l"(adesc), "l"(bdesc), "r"(add));
  }
#endif
}
#undef KILN_WG_D4

}  // namespace kiln::cuda
