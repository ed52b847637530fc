#!/usr/bin/env bash
# Builds the demo model's corpus: the King James Bible from Debian's bible-kjv-text (public domain), one
# document per chapter (its verses, one per line, without references), documents joined by "<|endoftext|>".
# Every 50th chapter (2%) is held out for validation.
#
#   tools/train_demo/prepare_corpus.sh [OUT_DIR]     (default: <repo>/.carry/demo, git-ignored)
#
# Writes OUT_DIR/train.txt, OUT_DIR/val.txt and OUT_DIR/kjv-verses.txt (the raw dump, "Ge1:1 In the beginning...").
# Needs apt-get (Debian 12: bible-kjv 4.38 reads the compressed text of bible-kjv-text 4.38), no root for dpkg -x.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/.carry/demo}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt-get download runs as _apt when it can write there
mkdir -p "$out"

cd "$work"
apt-get download bible-kjv-text bible-kjv >/dev/null
dpkg -x bible-kjv-text_*_all.deb text
dpkg -x bible-kjv_*.deb prog
# -f: one verse per line, each prefixed by its reference ("Ge1:1 ..."); the range covers the whole book.
prog/usr/bin/bible -f -p "$work/text/usr/lib" "gen1:1-rev22:21" > "$out/kjv-verses.txt"
n=$(wc -l < "$out/kjv-verses.txt")
[ "$n" -eq 31102 ] || { echo "expected 31102 verses, got $n" >&2; exit 1; }

python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
chapters = []          # [(book+chapter, [verse text])]
ref = re.compile(r'^([0-9]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$')
for line in open(f'{out}/kjv-verses.txt', encoding='ascii'):
    m = ref.match(line.rstrip('\n'))
    if not m:
        sys.exit(f'unparsed line: {line!r}')
    key = (m.group(1), m.group(2))
    if not chapters or chapters[-1][0] != key:
        chapters.append((key, []))
    chapters[-1][1].append(m.group(4).strip())
docs = ['\n'.join(v) + '\n' for _, v in chapters]
val = [d for i, d in enumerate(docs) if i % 50 == 49]
train = [d for i, d in enumerate(docs) if i % 50 != 49]
EOT = '<|endoftext|>'
for name, part in (('train', train), ('val', val)):
    # Each document is preceded by EOT (which is also BOS): a prompt encoded with BOS starts a chapter.
    with open(f'{out}/{name}.txt', 'w', encoding='ascii', newline='\n') as f:
        f.write(''.join(EOT + d for d in part))
print(f'{len(chapters)} chapters: {len(train)} train, {len(val)} held out')
PY
wc -c "$out/train.txt" "$out/val.txt"
