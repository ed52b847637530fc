// Load client for kiln serve (node, no packages, 127.0.0.1 only): C concurrent streaming /v1/completions requests,
// R in all, each a prompt of P random token ids (distinct per request: no prefix-cache hits) and G generated tokens
// (greedy, ignore_eos). Prints one JSON line: requests/s, aggregate generated tokens/s, median and p99 time to first
// token and inter-token latency (from the arrival of the SSE chunks), and the server's own counts.
// Usage: node load.mjs --port N [--concurrency 4] [--requests 16] [--prompt 256] [--gen 128] [--vocab 4096]
//                      [--api-key K] [--model M]
import http from 'node:http';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const port = Number(args.port);
const C = Number(args.concurrency ?? 4);
const R = Number(args.requests ?? 4 * C);
const P = Number(args.prompt ?? 256);
const G = Number(args.gen ?? 128);
const V = Number(args.vocab ?? 4096);
const key = args['api-key'];
const agent = new http.Agent({ keepAlive: true, maxSockets: C });

let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);

function one(i) {
  const prompt = Array.from({ length: P }, () => 1 + Math.floor(rnd() * (V - 1)));
  const body = JSON.stringify({ prompt, max_tokens: G, temperature: 0, ignore_eos: true, stream: true,
                                ...(args.model ? { model: args.model } : {}) });
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const times = [];
    let usage = null;
    let buf = '';
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', agent,
                               headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body),
                                          ...(key ? { Authorization: `Bearer ${key}` } : {}) } }, (res) => {
      if (res.statusCode !== 200) {
        let e = '';
        res.on('data', (d) => (e += d));
        res.on('end', () => reject(new Error(`request ${i}: HTTP ${res.statusCode} ${e}`)));
        return;
      }
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
          const j = JSON.parse(ev.slice(6));
          if (j.usage) usage = j.usage;
          if (j.choices && j.choices.length && j.choices[0].finish_reason == null) times.push(performance.now());
        }
      });
      res.on('end', () => resolve({ t0, times, usage, end: performance.now() }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const pct = (xs, p) => {
  if (!xs.length) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

const start = performance.now();
const results = [];
let next = 0;
async function worker() {
  while (next < R) results.push(await one(next++));
}
await Promise.all(Array.from({ length: C }, worker));
const wall = (performance.now() - start) / 1000;
const ttft = [], itl = [];
let gen = 0;
for (const r of results) {
  if (r.times.length) ttft.push(r.times[0] - r.t0);
  for (let k = 1; k < r.times.length; ++k) itl.push(r.times[k] - r.times[k - 1]);
  gen += r.usage ? r.usage.completion_tokens : 0;
}
console.log(JSON.stringify({
  concurrency: C, requests: R, prompt_tokens: P, gen_tokens: G, wall_s: +wall.toFixed(3),
  requests_per_s: +(R / wall).toFixed(3), gen_tokens_per_s: +(gen / wall).toFixed(1),
  total_tokens_per_s: +(((P * R) + gen) / wall).toFixed(1),
  ttft_ms_p50: +pct(ttft, 50).toFixed(1), ttft_ms_p99: +pct(ttft, 99).toFixed(1),
  itl_ms_p50: +pct(itl, 50).toFixed(2), itl_ms_p99: +pct(itl, 99).toFixed(2), generated: gen,
}));
agent.destroy();
