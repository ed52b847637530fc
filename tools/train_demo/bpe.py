#!/usr/bin/env python3
"""Byte-level BPE for the demo model, in GPT-2's conventions, so that a GGUF with tokenizer.ggml.model "gpt2" and
tokenizer.ggml.pre "gpt-2" reproduces it exactly:

  * text is split on the special token <|endoftext|> first (never merged into anything),
  * each piece is pre-tokenized with GPT-2's regex (below), each pre-token's UTF-8 bytes are mapped to printable
    characters with GPT-2's bytes_to_unicode table, and merges are applied by rank (lowest rank first, leftmost
    first among equal ranks) -- the encoder llama.cpp, HF tokenizers and kiln implement.

Vocabulary layout (ids): 0..255 the single bytes (id b is the byte b), 256..V-2 the merges in the order they were
learned (merge rank r creates token 256 + r), V-1 <|endoftext|> (BOS and EOS, token type control).

  bpe.py train  --vocab-size 4096 --out DIR TRAIN.txt    -> DIR/vocab.txt (one token per line), DIR/merges.txt
  bpe.py encode --dir DIR IN.txt OUT.u16                   -> little-endian u16 ids (special tokens parsed)
  bpe.py encode --dir DIR --text IN.txt OUT.ids            -> ids as decimal text, one line, space-separated
                                                              (special tokens parsed, no BOS added)
Only the standard library and the `regex` module (for \\p{L}/\\p{N}) are needed; the result is deterministic.
"""
import argparse
import array
import collections
import heapq
import sys

import regex

EOT = '<|endoftext|>'
# GPT-2's pre-tokenizer (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT2 uses the same expression).
PRETOKENIZE = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """GPT-2's table: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onwards."""
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(ord('\xa1'), ord('\xac') + 1)) + \
        list(range(ord('\xae'), ord('\xff') + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHAR = bytes_to_unicode()


def pretokens(text):
    """Yields (is_special, piece) in order."""
    parts = text.split(EOT)
    for i, part in enumerate(parts):
        if i > 0:
            yield True, EOT
        for m in PRETOKENIZE.finditer(part):
            yield False, m.group(0)


def train(args):
    text = open(args.corpus, encoding='utf-8', newline='').read()
    counts = collections.Counter(p for special, p in pretokens(text) if not special)
    words = [list(w.encode('utf-8')) for w in counts]   # symbols are token ids; 0..255 are the bytes
    freqs = list(counts.values())
    n_merges = args.vocab_size - 256 - 1

    pair_count = collections.defaultdict(int)
    pair_words = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freqs[wi]
            pair_words[(a, b)].add(wi)
    # Max-heap on (count, then the smallest pair of ids) with lazy invalidation: stale entries are skipped.
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    merges = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg <= 0:
            continue
        new_id = 256 + len(merges)
        merges.append(pair)
        changed = collections.defaultdict(int)
        for wi in list(pair_words[pair]):
            w, f = words[wi], freqs[wi]
            for a, b in zip(w, w[1:]):
                changed[(a, b)] -= f
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == pair[0] and w[i + 1] == pair[1]:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):
                changed[(a, b)] += f
                pair_words[(a, b)].add(wi)
        for p, d in changed.items():
            if d:
                pair_count[p] += d
                if pair_count[p] > 0:
                    heapq.heappush(heap, (-pair_count[p], p))
        del pair_count[pair]
        del pair_words[pair]

    strings = [BYTE_CHAR[b] for b in range(256)]
    for a, b in merges:
        strings.append(strings[a] + strings[b])
    strings.append(EOT)
    if len(set(strings)) != len(strings):  # two merge paths spelling one string would make ids ambiguous
        sys.exit('bpe: duplicate token strings; pick another vocabulary size')
    with open(f'{args.out}/vocab.txt', 'w', encoding='utf-8', newline='\n') as f:
        f.write(''.join(s + '\n' for s in strings))
    with open(f'{args.out}/merges.txt', 'w', encoding='utf-8', newline='\n') as f:
        f.write(''.join(f'{strings[a]} {strings[b]}\n' for a, b in merges))
    print(f'{len(counts)} distinct pre-tokens, {len(merges)} merges, vocab {len(strings)}', file=sys.stderr)


class Encoder:
    def __init__(self, d):
        self.tokens = open(f'{d}/vocab.txt', encoding='utf-8').read().split('\n')[:-1]
        self.id_of = {s: i for i, s in enumerate(self.tokens)}
        self.rank = {}
        for r, line in enumerate(open(f'{d}/merges.txt', encoding='utf-8').read().split('\n')[:-1]):
            a, b = line.split(' ')
            self.rank[(a, b)] = r
        self.eot = self.id_of[EOT]
        self.cache = {}

    def encode_pretoken(self, piece):
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        syms = [BYTE_CHAR[b] for b in piece.encode('utf-8')]
        while len(syms) > 1:
            best, bi = None, -1
            for i in range(len(syms) - 1):
                r = self.rank.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            a, b = syms[bi], syms[bi + 1]
            out, i = [], 0
            while i < len(syms):  # every occurrence of the pair, left to right
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            syms = out
        ids = [self.id_of[s] for s in syms]
        self.cache[piece] = ids
        return ids

    def encode(self, text):
        ids = []
        for special, piece in pretokens(text):
            if special:
                ids.append(self.eot)
            else:
                ids.extend(self.encode_pretoken(piece))
        return ids


def encode(args):
    enc = Encoder(args.dir)
    ids = enc.encode(open(args.input, encoding='utf-8', newline='').read())
    if args.text:
        with open(args.output, 'w') as f:
            f.write(' '.join(map(str, ids)) + '\n')
    else:
        a = array.array('H', ids)
        if sys.byteorder != 'little':
            a.byteswap()
        with open(args.output, 'wb') as f:
            a.tofile(f)
    n_bytes = len(open(args.input, 'rb').read())
    print(f'{args.input}: {n_bytes} bytes -> {len(ids)} tokens ({n_bytes / max(1, len(ids)):.3f} bytes/token)',
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    t = sub.add_parser('train')
    t.add_argument('--vocab-size', type=int, default=4096)
    t.add_argument('--out', required=True)
    t.add_argument('corpus')
    e = sub.add_parser('encode')
    e.add_argument('--dir', required=True)
    e.add_argument('--text', action='store_true')
    e.add_argument('input')
    e.add_argument('output')
    args = ap.parse_args()
    train(args) if args.cmd == 'train' else encode(args)


if __name__ == '__main__':
    main()
