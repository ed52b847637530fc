#!/usr/bin/env python3
# Host check of the lane maps of src/backend/cuda/fattn_mma.cu (no GPU needed, no numpy): emulates the kernel's
# ldmatrix addresses (q_base, k_base, v_base and their per-step offsets), the PTX ISA semantics of
# ldmatrix.x4(.trans) and mma.m16n8k16.row.col (A/B/C fragment maps), the in-register P repack (C fragments of
# n-tiles 2j, 2j+1 -> A fragment of k-step j) and the output write, on small integers (exact), and compares
# S = Q K^T and O = P V with plain matrix products for each head dim / KV tile. Run: python3 dev/cuda/fattn_lane_maps.py
# (prints "ok" per product; a swapped .trans or operand order prints WRONG; part 2 asserts the control flow).
# Keep it in step with the kernel.
import random
random.seed(0)
def run(D, BC):
    LD = D + 8
    Q = [[random.randint(-3, 3) for _ in range(D)] for _ in range(16)]
    K = [[random.randint(-3, 3) for _ in range(D)] for _ in range(BC)]
    V = [[random.randint(-3, 3) for _ in range(D)] for _ in range(BC)]
    def smem(M):
        out = []
        for r in M: out += r + [None]*8   # padding never read
        return out
    qs, ks, vs = smem(Q), smem(K), smem(V)
    lanes = range(32)
    def ldsm(buf, addr, trans):
        regs = [[None]*4 for _ in lanes]
        for m in range(4):
            M = [buf[addr[m*8+r]: addr[m*8+r]+8] for r in range(8)]
            for l in lanes:
                regs[l][m] = (M[l//4][2*(l%4)], M[l//4][2*(l%4)+1]) if not trans else (M[2*(l%4)][l//4], M[2*(l%4)+1][l//4])
        return regs
    def mma(c, a, b0, b1):
        A = [[None]*16 for _ in range(16)]; B = [[None]*8 for _ in range(16)]
        for l in lanes:
            g, t = l//4, l%4
            for i in range(2):
                A[g][2*t+i] = a[l][0][i]; A[g+8][2*t+i] = a[l][1][i]
                A[g][2*t+8+i] = a[l][2][i]; A[g+8][2*t+8+i] = a[l][3][i]
                B[2*t+i][g] = b0[l][i]; B[2*t+8+i][g] = b1[l][i]
        C = [[sum(A[i][k]*B[k][j] for k in range(16)) for j in range(8)] for i in range(16)]
        for l in lanes:
            g, t = l//4, l%4
            c[l][0] += C[g][2*t]; c[l][1] += C[g][2*t+1]; c[l][2] += C[g+8][2*t]; c[l][3] += C[g+8][2*t+1]
    lm = [l >> 3 for l in lanes]; lr = [l & 7 for l in lanes]
    q_base = [((lm[l] & 1)*8 + lr[l])*LD + (lm[l] >> 1)*8 for l in lanes]   # kernel: q_base (warp 0)
    k_base = [((lm[l] >> 1)*8 + lr[l])*LD + (lm[l] & 1)*8 for l in lanes]   # kernel: k_base
    v_base = [((lm[l] & 1)*8 + lr[l])*LD + (lm[l] >> 1)*8 for l in lanes]   # kernel: v_base
    NS, NO, KQ = BC//8, D//8, D//16
    s = [[[0]*4 for _ in lanes] for _ in range(NS)]
    for k in range(KQ):
        a = ldsm(qs, [q_base[l] + k*16 for l in lanes], False)        # q_base + k * 32 bytes
        for n in range(0, NS, 2):
            b = ldsm(ks, [k_base[l] + n*8*LD + k*16 for l in lanes], False)
            mma(s[n], a, [b[l][0] for l in lanes], [b[l][1] for l in lanes])
            mma(s[n+1], a, [b[l][2] for l in lanes], [b[l][3] for l in lanes])
    S = [[None]*BC for _ in range(16)]
    for n in range(NS):
        for l in lanes:
            g, t = l//4, l%4
            for e in range(4):
                S[g + 8*(e >> 1)][n*8 + 2*t + (e & 1)] = s[n][l][e]   # kernel: pos = base + n*8 + 2*gc + (e&1), row h = e>>1
    S_ref = [[sum(Q[i][d]*K[j][d] for d in range(D)) for j in range(BC)] for i in range(16)]
    print(D, BC, "S ok" if S == S_ref else "S WRONG")
    assert S == S_ref
    Pv = [[(S[i][j] % 5) - 2 for j in range(BC)] for i in range(16)]   # any P values, kept in the C layout
    for n in range(NS):
        for l in lanes:
            g, t = l//4, l%4
            for e in range(4): s[n][l][e] = Pv[g + 8*(e >> 1)][n*8 + 2*t + (e & 1)]
    o = [[[0]*4 for _ in lanes] for _ in range(NO)]
    for kk in range(BC//16):
        a = [[(s[2*kk][l][0], s[2*kk][l][1]), (s[2*kk][l][2], s[2*kk][l][3]),
              (s[2*kk+1][l][0], s[2*kk+1][l][1]), (s[2*kk+1][l][2], s[2*kk+1][l][3])] for l in lanes]
        for n in range(0, NO, 2):
            b = ldsm(vs, [v_base[l] + kk*16*LD + n*8 for l in lanes], True)
            mma(o[n], a, [b[l][0] for l in lanes], [b[l][1] for l in lanes])
            mma(o[n+1], a, [b[l][2] for l in lanes], [b[l][3] for l in lanes])
    O = [[None]*D for _ in range(16)]
    for n in range(NO):
        for l in lanes:
            g, t = l//4, l%4
            for h in range(2):
                O[g+8*h][n*8+2*t] = o[n][l][2*h]; O[g+8*h][n*8+2*t+1] = o[n][l][2*h+1]   # kernel's output write
    O_ref = [[sum(Pv[i][j]*V[j][d] for j in range(BC)) for d in range(D)] for i in range(16)]
    print(D, BC, "O ok" if O == O_ref else "O WRONG")
    assert O == O_ref
for D, BC in ((64, 64), (128, 64), (256, 32)):
    run(D, BC)


# ---- Part 2: the kernel's control flow at row granularity (row mapping, CTA range, tile skip / mask-free / mask
# paths, online softmax with the -inf guards, zero rows), in double, vs a direct softmax (window, GQA 1..96).
import math, random
random.seed(1)
INF = float('inf')
def kernel(D, BC, n_head, n_kv, window, seqs, kv_len, Kf, Vf, q, n_tok):
    # seqs: list of (q_start, q_len); Kf(seq,pos) -> vector; q[t][h] -> vector
    n_rep = n_head // n_kv
    hpc = min(n_rep, 64); tpc = 64 // hpc; n_hchunk = -(-n_rep // hpc)
    max_q = max([ql for _, ql in seqs] + [1]); q_tiles = -(-max_q // tpc)
    out = {}
    for t in range(n_tok):
        if kv_len[t] == 0:
            for h in range(n_head): out[(t, h)] = [0.0] * D   # fattn_zero_padded
    for bx in range(len(seqs) * q_tiles):
        for by in range(n_kv * n_hchunk):
            seq = bx // q_tiles; qt = q_tiles - 1 - bx % q_tiles
            g = by // n_hchunk; hc = by % n_hchunk
            qs0, q_len = seqs[seq]
            if qt * tpc >= q_len: continue
            q0 = qs0 + qt * tpc; n_q = min(tpc, q_len - qt * tpc)
            def row_tok(r):
                i, j = r // hpc, r % hpc
                return q0 + i if (i < n_q and hc * hpc + j < n_rep) else -1
            def row_head(r): return g * n_rep + hc * hpc + r % hpc
            lo = [0] * 64; hi = [0] * 64
            for r in range(64):
                tt = row_tok(r); L = kv_len[tt] if tt >= 0 else 0
                hi[r] = L; lo[r] = L - window if (window > 0 and L > window) else 0
            s_lo, s_hi = 2**31 - 1, 0
            W = []
            for w in range(4):
                rows = range(16 * w, 16 * w + 16)
                live = [r for r in rows if hi[r] > 0]
                w_lo = min([lo[r] for r in live], default=2**31 - 1); w_hi = max([hi[r] for r in live], default=0)
                w_lo_max = max([lo[r] for r in live], default=0); w_hi_min = min([hi[r] for r in live], default=2**31 - 1)
                any_dead = any(hi[r] == 0 for r in rows)
                W.append((w_lo, w_hi, w_lo_max, w_hi_min, any_dead))
                if w_hi > 0: s_lo = min(s_lo, w_lo); s_hi = max(s_hi, w_hi)
            kv_begin, kv_end = s_lo, s_hi
            t_first = kv_begin // BC * BC if kv_end > 0 else 0
            n_tiles = -(-(kv_end - t_first) // BC) if kv_end > 0 else 0
            m = [-INF] * 64; l = [0.0] * 64; o = [[0.0] * D for _ in range(64)]
            for j in range(n_tiles):
                base = t_first + j * BC
                Kt = [Kf(seq, base + i) if kv_begin <= base + i < kv_end else [0.0] * D for i in range(BC)]
                Vt = [Vf(seq, base + i) if kv_begin <= base + i < kv_end else [0.0] * D for i in range(BC)]
                for w in range(4):
                    w_lo, w_hi, w_lo_max, w_hi_min, any_dead = W[w]
                    if base >= w_hi or base + BC <= w_lo: continue
                    full = (not any_dead) and base >= w_lo_max and base + BC <= w_hi_min
                    for r in range(16 * w, 16 * w + 16):
                        tt = row_tok(r)
                        qv = q[tt][row_head(r)] if tt >= 0 else [0.0] * D
                        s = [sum(a * b for a, b in zip(qv, Kt[i])) for i in range(BC)]
                        if not full:
                            s = [s[i] if lo[r] <= base + i < hi[r] else -INF for i in range(BC)]
                        mx = max(s); m_new = max(m[r], mx)
                        alpha = 1.0 if m_new == -INF else math.exp(m[r] - m_new)
                        mu = 0.0 if m_new == -INF else m_new
                        m[r] = m_new
                        p = [math.exp(x - mu) if x != -INF else 0.0 for x in s]
                        l[r] = l[r] * alpha + sum(p)
                        o[r] = [o[r][d] * alpha + sum(p[i] * Vt[i][d] for i in range(BC)) for d in range(D)]
            for r in range(64):
                tt = row_tok(r)
                if tt < 0: continue
                inv = 1.0 / l[r] if (hi[r] > 0 and l[r] > 0) else 0.0
                out[(tt, row_head(r))] = [x * inv for x in o[r]]
    return out

def test(D, BC, n_head, n_kv, window, specs, pad_after_first=2):
    # specs: (q_len, depth)
    Kd, Vd = {}, {}
    def Kf(s, p):
        if (s, p) not in Kd: Kd[(s, p)] = [random.gauss(0, 1) for _ in range(D * n_kv)]
        return Kd[(s, p)][g_cur[0] * D:(g_cur[0] + 1) * D]
    toks, seqs = [], []
    for si, (ql, dep) in enumerate(specs):
        seqs.append((len(toks), ql))
        toks += [(si, dep + i) for i in range(ql)]
        if si == 0: toks += [(-1, -1)] * pad_after_first
    seqs.append((len(toks), 0))
    n_tok = len(toks)
    kv_len = [p + 1 if s >= 0 else 0 for s, p in toks]
    KV = {}
    def kvrow(s, p, which):
        key = (s, p, which)
        if key not in KV: KV[key] = [random.gauss(0, 1) for _ in range(D * n_kv)]
        return KV[key]
    q = [[[random.gauss(0, 1) * 0.3 for _ in range(D)] for _ in range(n_head)] for _ in range(n_tok)]
    # kernel with per-group K/V: run per kv head group by closure on g
    n_rep = n_head // n_kv
    res = {}
    for gg in range(n_kv):
        heads = list(range(gg * n_rep, (gg + 1) * n_rep))
        qq = [[q[t][h] if h in heads else [0.0] * D for h in range(n_head)] for t in range(n_tok)]
        out = kernel(D, BC, n_head, n_kv, window, seqs, kv_len,
                     lambda s, p: kvrow(s, p, 'k')[gg * D:(gg + 1) * D], lambda s, p: kvrow(s, p, 'v')[gg * D:(gg + 1) * D], qq, n_tok)
        for (t, h), v in out.items():
            if h in heads: res[(t, h)] = v
    worst = 0.0
    for t in range(n_tok):
        s, p = toks[t]
        for h in range(n_head):
            assert (t, h) in res, ("unwritten", t, h)
            if s < 0:
                assert all(x == 0.0 for x in res[(t, h)]); continue
            gg = h // n_rep; L = p + 1; lo = L - window if (window > 0 and L > window) else 0
            sc = [sum(a * b for a, b in zip(q[t][h], kvrow(s, j, 'k')[gg * D:(gg + 1) * D])) for j in range(lo, L)]
            mx = max(sc); e = [math.exp(x - mx) for x in sc]; Z = sum(e)
            ref = [sum(e[j - lo] * kvrow(s, j, 'v')[gg * D + d] for j in range(lo, L)) / Z for d in range(D)]
            worst = max(worst, max(abs(a - b) for a, b in zip(ref, res[(t, h)])))
    print(D, BC, n_head, n_kv, window, specs, "max err", worst)
    assert worst < 1e-9
g_cur = [0]
test(8, 8, 4, 1, 0, [(17, 0), (1, 14), (20, 5)])
test(8, 8, 8, 2, 5, [(17, 0), (1, 14), (20, 5)])
test(8, 16, 3, 1, 7, [(30, 3), (2, 0)])
test(8, 8, 2, 2, 0, [(70, 10)])
test(8, 16, 12, 1, 9, [(9, 40), (5, 0)])
test(4, 8, 96, 1, 0, [(3, 2), (2, 0)])
test(4, 8, 70, 1, 3, [(5, 4)])
