#!/usr/bin/env bash
# session 25 call 5: where a served speculative step's time goes at 1 and 16 streams (the engine's
# step trace, M3_STEP_TRACE: draft, forward, sample and the rest: the context append and
# bookkeeping), against plain decoding and the bench's draft / verify at the served checkpoint's
# 6 layers
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-*
echo "[$SECONDS] bench, 6 layers"
timeout 120 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 6 --batch 1,16 --context 1024 --steps 10 \
  --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench6.log 2>&1; echo "rc $?"
grep -E "decode step|verify|draft|whole step" $L/bench6.log | cut -c1-220 | head -20
for mode in plain spec; do
  echo "[$SECONDS] served $mode, step trace"
  if [ $mode = spec ]; then export M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}'; else unset M3_LOAD_SPEC; fi
  M3_STEP_TRACE=$L/trace-$mode.txt M3_LOAD_LEVELS=1,16 timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-$mode /tmp/tok.json > $L/load-$mode.log 2>&1; echo "rc $?"
  grep -E "^\| (1|16) " $L/load-$mode.log
  python3 - $L/trace-$mode.txt <<'PY'
import sys, statistics as S
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith('#')]
for seqs in (1, 16):
    r = [list(map(float, x)) for x in rows if int(x[2]) == seqs and int(x[3]) == 0 and int(x[4]) == seqs]
    if not r: continue
    med = lambda i: S.median(v[i] for v in r)
    print(f"  {seqs} seqs, {len(r)} decode steps (median): tokens {med(1):.0f} draft {med(5):.3f} forward {med(6):.3f} sample {med(7):.3f} "
          f"rest {S.median(v[8]-v[5]-v[6]-v[7] for v in r):.3f} step {med(8):.3f} ms")
PY
done
echo "[$SECONDS] done"
