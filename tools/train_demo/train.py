#!/usr/bin/env python3
"""Trains the kiln demo model: a small Llama (RMSNorm, RoPE, GQA attention, SwiGLU, tied embeddings) on the
pre-tokenized KJV corpus made by prepare_corpus.sh + bpe.py.

The forward pass is written so that the weights need no conversion for llama.cpp's `llama` architecture:
RoPE rotates adjacent pairs (2i, 2i+1) by pos * base^(-2i/head_dim) (ggml's "normal" mode, as the GGUF stores
Q/K -- no HF-style permutation), query head h reads KV head h // (n_head / n_head_kv) (ggml's GQA broadcast),
and every Linear weight is [out, in] row-major, i.e. ggml ne = [in, out].

  train.py --data DIR --out DIR [--steps N] [--resume] ...

DIR (data) holds train.u16, val.u16 (little-endian u16 ids) and vocab.txt (bpe.py). Writes to --out:
  model-NNNNN.safetensors  f32 weights under their GGUF names, sharded to <= 15 MiB per file
  config.json              hyperparameters, training setup and the final metrics
  reference.json           fixed token ids (BOS + "And God said" + the greedy continuation), PyTorch's f32
                           logits for them (reference_logits.f32: [n][n_vocab] raw little-endian) and the NMSE of
                           Q8_0-rounded weights against f32 per row (the size of the quantization error)
  samples.txt              greedy and sampled continuations
  ckpt.pt                  (in --ckpt-dir) model + optimizer + step, for --resume
"""
import argparse
import array
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

EOT = '<|endoftext|>'


# ---- model ---------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(n_ctx, head_dim, base, device):
    inv = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)  # [hd/2]
    ang = torch.arange(n_ctx, device=device, dtype=torch.float64)[:, None] * inv[None, :]        # [T, hd/2]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x, cos, sin):
    """x [B, H, T, hd]; rotates pairs (2i, 2i+1) (ggml normal mode)."""
    x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]
    y0 = x0 * c - x1 * s
    y1 = x0 * s + x1 * c
    return torch.stack((y0, y1), dim=-1).flatten(-2).to(x.dtype)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head, self.n_head_kv, self.hd = c['n_head'], c['n_head_kv'], c['n_embd'] // c['n_head']
        e = c['n_embd']
        self.attn_norm = RMSNorm(e, c['rms_eps'])
        self.attn_q = nn.Linear(e, self.n_head * self.hd, bias=False)
        self.attn_k = nn.Linear(e, self.n_head_kv * self.hd, bias=False)
        self.attn_v = nn.Linear(e, self.n_head_kv * self.hd, bias=False)
        self.attn_output = nn.Linear(self.n_head * self.hd, e, bias=False)
        self.ffn_norm = RMSNorm(e, c['rms_eps'])
        self.ffn_gate = nn.Linear(e, c['n_ff'], bias=False)
        self.ffn_up = nn.Linear(e, c['n_ff'], bias=False)
        self.ffn_down = nn.Linear(c['n_ff'], e, bias=False)
        self.dropout = c['dropout']

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.attn_q(h).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.attn_k(h).view(B, T, self.n_head_kv, self.hd).transpose(1, 2)
        v = self.attn_v(h).view(B, T, self.n_head_kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        g = self.n_head // self.n_head_kv
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # head h -> kv head h // g
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        a = a.transpose(1, 2).reshape(B, T, self.n_head * self.hd)
        x = x + F.dropout(self.attn_output(a), self.dropout, self.training)
        h = self.ffn_norm(x)
        f = self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))
        return x + F.dropout(f, self.dropout, self.training)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.token_embd = nn.Embedding(c['n_vocab'], c['n_embd'])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c['n_layer']))
        self.output_norm = RMSNorm(c['n_embd'], c['rms_eps'])
        cos, sin = rope_tables(c['n_ctx'], c['n_embd'] // c['n_head'], c['rope_freq_base'], 'cpu')
        self.register_buffer('cos', cos, persistent=False)
        self.register_buffer('sin', sin, persistent=False)
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2 style: residual projections scaled down by depth
                s = std / math.sqrt(2 * c['n_layer']) if n.endswith(('attn_output.weight', 'ffn_down.weight')) else std
                nn.init.normal_(p, 0.0, s)

    def forward(self, ids):
        x = self.token_embd(ids)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        return self.output_norm(x) @ self.token_embd.weight.to(x.dtype).t()  # tied output projection

    def gguf_tensors(self):
        """name -> f32 tensor ([out, in] row-major = ggml ne [in, out])."""
        t = {'token_embd.weight': self.token_embd.weight, 'output_norm.weight': self.output_norm.weight}
        for i, b in enumerate(self.blocks):
            for n in ('attn_norm', 'attn_q', 'attn_k', 'attn_v', 'attn_output', 'ffn_norm', 'ffn_gate', 'ffn_up',
                      'ffn_down'):
                t[f'blk.{i}.{n}.weight'] = getattr(b, n).weight
        return {k: v.detach().float().cpu().contiguous() for k, v in t.items()}


# ---- data ----------------------------------------------------------------------------------------------------
def load_u16(path):
    a = array.array('H')
    with open(path, 'rb') as f:
        a.frombytes(f.read())
    if sys.byteorder != 'little':
        a.byteswap()
    return torch.tensor(a, dtype=torch.int64)


def token_bytes(vocab_path):
    """UTF-8 byte length of each token's text (control tokens count 0)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    n_extra = 0
    char_len = {}
    for b in range(256):
        if b not in bs:
            char_len[chr(256 + n_extra)] = 1
            n_extra += 1
        else:
            char_len[chr(b)] = 1
    toks = open(vocab_path, encoding='utf-8').read().split('\n')[:-1]
    return [0 if t == EOT else sum(char_len[ch] for ch in t) for t in toks]  # each mapped char is one byte


@torch.no_grad()
def evaluate(model, data, seq, batch, device):
    """Mean loss over every token of `data` in non-overlapping windows of `seq`; also total nats."""
    model.eval()
    n = (len(data) - 1) // seq
    xs = data[: n * seq].view(n, seq)
    ys = data[1: n * seq + 1].view(n, seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        x, y = xs[i:i + batch].to(device), ys[i:i + batch].to(device)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            logits = model(x)
        tot += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1), reduction='sum').item()
        cnt += y.numel()
    model.train()
    return tot / cnt, tot, ys[:n].reshape(-1)


def q8_0_round(w):
    """Q8_0 as llama.cpp stores it: blocks of 32 along the row, d = amax/127 (kept as f16), q = round(x/d)."""
    shape = w.shape
    b = w.reshape(-1, 32).double()
    d = (b.abs().amax(dim=1, keepdim=True) / 127.0).float().half().double()
    q = torch.where(d > 0, torch.round(b / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(b))
    return (q * d).float().reshape(shape)


@torch.no_grad()
def greedy(model, ids, n, device):
    model.eval()
    x = torch.tensor([ids], device=device)
    out, margins = [], []
    for _ in range(n):
        logits = model(x)[0, -1].float()
        top = torch.topk(logits, 2)
        out.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        x = torch.cat([x, top.indices[:1].view(1, 1)], dim=1)
    return out, margins


@torch.no_grad()
def sample(model, ids, n, temp, top_k, gen, device, eot):
    model.eval()
    x = torch.tensor([ids], device=device)
    out = []
    for _ in range(n):
        logits = model(x)[0, -1].float() / temp
        v, i = torch.topk(logits, top_k)
        t = i[torch.multinomial(F.softmax(v, -1), 1, generator=gen)]
        if int(t) == eot:
            break
        out.append(int(t))
        x = torch.cat([x, t.view(1, 1)], dim=1)
    return out


# ---- main ----------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--data', required=True)
    ap.add_argument('--out', required=True)
    ap.add_argument('--ckpt-dir', default=None)
    ap.add_argument('--resume', action='store_true')
    ap.add_argument('--n-embd', type=int, default=384)
    ap.add_argument('--n-layer', type=int, default=4)
    ap.add_argument('--n-head', type=int, default=6)
    ap.add_argument('--n-head-kv', type=int, default=2)
    ap.add_argument('--n-ff', type=int, default=896)
    ap.add_argument('--n-ctx', type=int, default=512)
    ap.add_argument('--dropout', type=float, default=0.1)
    ap.add_argument('--steps', type=int, default=2000)
    ap.add_argument('--batch', type=int, default=32)
    ap.add_argument('--lr', type=float, default=2e-3)
    ap.add_argument('--min-lr-frac', type=float, default=0.1)
    ap.add_argument('--warmup', type=int, default=100)
    ap.add_argument('--wd', type=float, default=0.1)
    ap.add_argument('--eval-every', type=int, default=250)
    ap.add_argument('--time-limit', type=float, default=420, help='seconds; checkpoint and stop when exceeded')
    ap.add_argument('--seed', type=int, default=1234)
    ap.add_argument('--prompt', default='And God said')
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # reference logits are computed in true f32
    torch.backends.cudnn.allow_tf32 = False
    device = 'cuda'
    os.makedirs(args.out, exist_ok=True)
    vocab = open(f'{args.data}/vocab.txt', encoding='utf-8').read().split('\n')[:-1]
    eot = vocab.index(EOT)
    c = dict(n_vocab=len(vocab), n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
             n_head_kv=args.n_head_kv, n_ff=args.n_ff, n_ctx=args.n_ctx, rms_eps=1e-5, rope_freq_base=10000.0,
             dropout=args.dropout, bos_id=eot, eos_id=eot)
    train = load_u16(f'{args.data}/train.u16')
    val = load_u16(f'{args.data}/val.u16')
    tbytes = torch.tensor(token_bytes(f'{args.data}/vocab.txt'), dtype=torch.float64)

    model = Llama(c).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': args.wd}, {'params': no_decay, 'weight_decay': 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    step, elapsed = 0, 0.0
    ckpt = f'{args.ckpt_dir}/ckpt.pt' if args.ckpt_dir else None
    if args.resume and ckpt and os.path.exists(ckpt):
        s = torch.load(ckpt, map_location='cpu')  # RNG states must stay CPU ByteTensors; load_state_dict moves the rest
        model.load_state_dict(s['model'])
        opt.load_state_dict(s['opt'])
        step, elapsed = s['step'], s['elapsed']
        torch.set_rng_state(s['rng_cpu'])
        torch.cuda.set_rng_state(s['rng_cuda'])
        print(f'resumed at step {step}', flush=True)
    print(f'params {n_params} ({n_params / 1e6:.2f}M); train tokens {len(train)}, val tokens {len(val)}; '
          f'tokens/step {args.batch * args.n_ctx}', flush=True)

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        p = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    gen = torch.Generator().manual_seed(args.seed + step)  # window positions; reseeded on resume
    t0 = time.time() - elapsed
    train_loss_ema = float('nan')
    history = []
    model.train()
    while step < args.steps:
        starts = torch.randint(0, len(train) - args.n_ctx - 1, (args.batch,), generator=gen)
        idx = starts[:, None] + torch.arange(args.n_ctx + 1)[None, :]
        chunk = train[idx].to(device, non_blocking=True)
        x, y = chunk[:, :-1], chunk[:, 1:]
        for g in opt.param_groups:
            g['lr'] = lr_at(step)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        l = loss.item() if step % 10 == 0 or step == args.steps else None
        if l is not None:
            train_loss_ema = l if math.isnan(train_loss_ema) else 0.8 * train_loss_ema + 0.2 * l
        if step % args.eval_every == 0 or step == args.steps:
            vl, _, _ = evaluate(model, val, args.n_ctx, 64, device)
            history.append(dict(step=step, train_loss=train_loss_ema, val_loss=vl, time_s=time.time() - t0))
            print(f'step {step:5d} lr {lr_at(step - 1):.2e} train {train_loss_ema:.4f} val {vl:.4f} '
                  f'val_ppl {math.exp(vl):.2f} t {time.time() - t0:.0f}s', flush=True)
        if time.time() - t0 > args.time_limit and step < args.steps:
            if ckpt:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step, elapsed=time.time() - t0,
                                rng_cpu=torch.get_rng_state(), rng_cuda=torch.cuda.get_rng_state()), ckpt)
                print(f'time limit: checkpoint at step {step}; run again with --resume', flush=True)
            sys.exit(3)
    train_time = time.time() - t0

    # ---- final metrics (dropout off) ----
    val_loss, val_nats, val_targets = evaluate(model, val, args.n_ctx, 64, device)
    val_bytes = float(tbytes[val_targets].sum())
    tr_sub = train[: len(val) * 4]  # a train slice 4x the val size, measured the same way
    train_loss, _, _ = evaluate(model, tr_sub, args.n_ctx, 64, device)
    metrics = dict(train_loss=train_loss, val_loss=val_loss, val_ppl_token=math.exp(val_loss),
                   val_ppl_byte=math.exp(val_nats / val_bytes), val_bits_per_byte=val_nats / val_bytes / math.log(2),
                   val_tokens=int(val_targets.numel()), val_bytes=int(val_bytes), train_time_s=train_time,
                   steps=step, tokens_seen=step * args.batch * args.n_ctx,
                   epochs=step * args.batch * args.n_ctx / len(train))
    print('final', json.dumps(metrics), flush=True)

    # ---- reference logits in f32 (no autocast, no tf32) ----
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bpe import Encoder  # noqa: E402  (regex module: present on the device image)
    enc = Encoder(args.data)
    prompt_ids = [eot] + enc.encode(args.prompt)
    model.eval()
    qmodel = Llama(c).to(device)
    qmodel.load_state_dict(model.state_dict())
    with torch.no_grad():
        for n, p in qmodel.named_parameters():
            if p.dim() == 2:
                p.copy_(q8_0_round(p))
    cont, margins = greedy(qmodel, prompt_ids, 32 - len(prompt_ids), device)
    ref_ids = prompt_ids + cont
    with torch.no_grad():
        lf = model(torch.tensor([ref_ids], device=device))[0].float()
        lq = qmodel(torch.tensor([ref_ids], device=device))[0].float()
    row_nmse = (((lq - lf) ** 2).sum(-1) / (lf ** 2).sum(-1)).tolist()
    with open(f'{args.out}/reference_logits.f32', 'wb') as f:
        f.write(lf.cpu().numpy().astype('<f4').tobytes())
    top2 = torch.topk(lf, 2, dim=-1).values
    json.dump(dict(ids=ref_ids, n_prompt=len(prompt_ids), prompt=args.prompt, greedy_q8=cont,
                   greedy_q8_margins=margins, ref_margins=(top2[:, 0] - top2[:, 1]).tolist(),
                   nmse_q8_vs_f32=row_nmse), open(f'{args.out}/reference.json', 'w'), indent=1)
    print(f'reference: {len(ref_ids)} ids; NMSE(q8_0-rounded weights vs f32) max {max(row_nmse):.3e} '
          f'mean {sum(row_nmse) / len(row_nmse):.3e}; min greedy margin {min(margins):.3f}', flush=True)

    # ---- samples ----
    def text(ids):
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        inv, n = {}, 0
        for b in range(256):
            if b in bs:
                inv[chr(b)] = b
            else:
                inv[chr(256 + n)] = b
                n += 1
        return bytes(inv[ch] for i in ids if i != eot for ch in vocab[i]).decode('utf-8', 'replace')

    g_ids, _ = greedy(model, prompt_ids, 120, device)
    lines = [f'== greedy (f32 weights), prompt {args.prompt!r}\n{args.prompt}{text(g_ids)}\n']
    gen_s = torch.Generator(device=device).manual_seed(args.seed)
    for p in (args.prompt, 'In the beginning', 'And Jesus answered', 'The LORD is'):
        s = sample(model, [eot] + enc.encode(p), 120, 0.8, 40, gen_s, device, eot)
        lines.append(f'== sample (temp 0.8, top-k 40), prompt {p!r}\n{p}{text(s)}\n')
    open(f'{args.out}/samples.txt', 'w').write('\n'.join(lines))
    print('\n'.join(lines), flush=True)

    # ---- weights: f32 safetensors shards of <= 15 MiB ----
    from safetensors.torch import save_file
    shards, cur, cur_bytes = [], {}, 0
    for name, t in model.gguf_tensors().items():
        nb = t.numel() * 4
        if cur and cur_bytes + nb > 15 * 1024 * 1024:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = t
        cur_bytes += nb
    shards.append(cur)
    for i, s in enumerate(shards):
        save_file(s, f'{args.out}/model-{i:05d}.safetensors')
    cfg = dict(c, n_params=n_params, n_shards=len(shards), tokenizer='bpe.py vocab.txt/merges.txt',
               train=dict(vars(args)), metrics=metrics, history=history,
               device=torch.cuda.get_device_name(), torch=torch.__version__)
    json.dump(cfg, open(f'{args.out}/config.json', 'w'), indent=1)
    print(f'wrote {len(shards)} shards', flush=True)


if __name__ == '__main__':
    main()
