#!/usr/bin/env bash
# Where a decode step's time goes, graph nodes included: nsys (when the machine has it) over `kiln bench -n 32`,
# kernel summary + the GPU trace reduced to busy time vs wall time of the steady-state steps.
#   dev/cuda/nsys_decode.sh BUILD_DIR [MODEL=/tmp/m8b.gguf]
set -uo pipefail
B=$1; M=${2:-/tmp/m8b.gguf}; OUT=${OUT:-/tmp}
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}; ncu: $(command -v ncu || echo none)"
[ -n "$NSYS" ] || exit 0
rm -f /tmp/dec.nsys-rep /tmp/dec.sqlite
timeout 120 $NSYS profile -o /tmp/dec --force-overwrite true --cuda-graph-trace=node -t cuda \
  $B/bin/kiln bench -m $M -p 0 -n 32 -r 1 > /tmp/nsys.log 2>&1 || { tail -5 /tmp/nsys.log; exit 0; }
timeout 120 $NSYS stats -q -r cuda_gpu_kern_sum -f csv -o /tmp/ksum /tmp/dec.nsys-rep > /dev/null 2>&1
cp /tmp/ksum_cuda_gpu_kern_sum.csv "$OUT/kern_sum.csv" 2>/dev/null
head -25 /tmp/ksum_cuda_gpu_kern_sum.csv 2>/dev/null | cut -c1-220
timeout 120 $NSYS stats -q -r cuda_gpu_trace -f csv -o /tmp/trace /tmp/dec.nsys-rep > /dev/null 2>&1
python3 - <<'PY'
import csv
rows=list(csv.DictReader(open('/tmp/trace_cuda_gpu_trace.csv')))
k=[(int(r['Start (ns)']),int(r['Duration (ns)']),r['Name']) for r in rows if r.get('Duration (ns)')]
k.sort()
# steady state: the last 60% of the trace
k=k[len(k)*4//10:]
t0=k[0][0]; t1=k[-1][0]+k[-1][1]
busy=0; end=t0; gaps=[]
for s,d,n in k:
    if s>end: gaps.append(s-end)
    busy+=max(0,min(s+d,t1)-max(s,end)) if s+d>end else 0
    end=max(end,s+d)
gaps.sort()
print(f"steady window {1e-3*(t1-t0):.0f} us, {len(k)} GPU ops, busy {100*busy/(t1-t0):.1f}%, gaps: n={len(gaps)} sum={1e-3*sum(gaps):.0f} us median={1e-3*gaps[len(gaps)//2] if gaps else 0:.2f} us p90={1e-3*gaps[len(gaps)*9//10] if gaps else 0:.2f} max={1e-3*gaps[-1] if gaps else 0:.1f} us")
big=[g for g in gaps if g>20000]
print(f"gaps > 20 us: {len(big)}, total {1e-3*sum(big):.0f} us")
PY
