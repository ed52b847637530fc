#!/usr/bin/env python3
# Load client for kiln serve, the same measurement as load.mjs for machines without node (the GPU machine): C
# concurrent streaming /v1/completions requests, R in all, each a prompt of P random token ids (distinct per request:
# no prefix-cache hits) and G generated tokens (greedy, ignore_eos). Prints one JSON line with the fields load.mjs
# prints. Standard library only; 127.0.0.1 only.
# Usage: python3 load.py --port N [--concurrency 4] [--requests 16] [--prompt 256] [--gen 128] [--vocab 4096]
import argparse, http.client, json, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--concurrency", type=int, default=4)
ap.add_argument("--requests", type=int, default=0)
ap.add_argument("--prompt", type=int, default=256)
ap.add_argument("--gen", type=int, default=128)
ap.add_argument("--vocab", type=int, default=4096)
a = ap.parse_args()
C, P, G, V = a.concurrency, a.prompt, a.gen, a.vocab
R = a.requests or 4 * C

seed = [12345]
lock = threading.Lock()
def rnd():
    seed[0] = (seed[0] * 1103515245 + 12345) % 2147483648
    return seed[0] / 2147483648

def one(i):
    with lock:
        prompt = [1 + int(rnd() * (V - 1)) for _ in range(P)]
    body = json.dumps({"prompt": prompt, "max_tokens": G, "temperature": 0, "ignore_eos": True, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"request {i}: HTTP {resp.status} {resp.read()[:200]!r}")
    times, usage = [], None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            usage = j["usage"]
        ch = j.get("choices") or []
        if ch and ch[0].get("finish_reason") is None:
            times.append(time.perf_counter())
    conn.close()
    return t0, times, usage

results, errors, nxt = [], [], [0]
def worker():
    while True:
        with lock:
            i = nxt[0]
            if i >= R:
                return
            nxt[0] += 1
        try:
            r = one(i)
            with lock:
                results.append(r)
        except Exception as e:  # reported, and the run fails
            with lock:
                errors.append(str(e))
            return

start = time.perf_counter()
ths = [threading.Thread(target=worker) for _ in range(C)]
for t in ths: t.start()
for t in ths: t.join()
wall = time.perf_counter() - start
if errors:
    raise SystemExit("load.py: " + errors[0])
ttft, itl, gen = [], [], 0
for t0, times, usage in results:
    if times:
        ttft.append((times[0] - t0) * 1e3)
    itl += [(times[k] - times[k - 1]) * 1e3 for k in range(1, len(times))]
    gen += usage["completion_tokens"] if usage else 0
def pct(xs, p):
    if not xs: return 0
    s = sorted(xs); return s[min(len(s) - 1, int(p / 100 * len(s)))]
print(json.dumps({"concurrency": C, "requests": R, "prompt_tokens": P, "gen_tokens": G, "wall_s": round(wall, 3),
                  "requests_per_s": round(R / wall, 3), "gen_tokens_per_s": round(gen / wall, 1),
                  "total_tokens_per_s": round((P * R + gen) / wall, 1), "ttft_ms_p50": round(pct(ttft, 50), 1),
                  "ttft_ms_p99": round(pct(ttft, 99), 1), "itl_ms_p50": round(pct(itl, 50), 2),
                  "itl_ms_p99": round(pct(itl, 99), 2), "generated": gen}))
