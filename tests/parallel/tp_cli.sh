#!/usr/bin/env bash
# `m3 logits --tensor-parallel-size N` on the CPU (thread ranks) against -tp 1: logits within
# 1e-5 relative L2 at every row, greedy tokens and indexer blocks equal (logits_diff); and the
# messages of shapes that do not split.
# usage: tp_cli.sh M3 LOGITS_DIFF DATA_DIR WORK_DIR
set -u
M3=$1; DIFF=$2; D=$3; W=$4
mkdir -p "$W"
fails=0
ids=$(seq 1 70 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%480}')
for m in m3-tiny m3-tiny-q m3-mqa-q; do
  "$M3" logits -m "$D/$m" --ids "$ids" --decode 5 --dump-index --ubatch 29 -o "$W/$m.tp1.st" 2>/dev/null ||
    { echo "FAILED: $m -tp 1"; fails=$((fails+1)); continue; }
  for args in "-tp 2" "-tp 2 --moe-split width" "--tensor-parallel-size 4"; do
    [ "$m" != m3-tiny ] && [ "$args" = "--tensor-parallel-size 4" ] && args="-tp 4 --moe-split experts"
    if "$M3" logits -m "$D/$m" --ids "$ids" --decode 5 --dump-index --ubatch 29 $args -o "$W/$m.tpn.st" 2>"$W/err" &&
       "$DIFF" "$W/$m.tp1.st" "$W/$m.tpn.st" --tol 1e-5; then
      echo "ok $m $args"
    else
      echo "FAILED: $m $args"; cat "$W/err"; fails=$((fails+1))
    fi
  done
done
# shapes that do not split: one line naming what
expect() { # expect WHAT ARGS...: exit status 1 and WHAT in the message
  local what=$1; shift
  if "$M3" logits --ids 1,2,3 -o "$W/x.st" "$@" 2>"$W/err"; then echo "FAILED: $* succeeded"; fails=$((fails+1)); return; fi
  if grep -q "$what" "$W/err"; then echo "ok error: $(head -1 "$W/err")"; else echo "FAILED: $* said: $(cat "$W/err")"; fails=$((fails+1)); fi
}
expect "query heads do not split" -m "$D/m3-tiny" -tp 3
expect "scale group" -m "$D/m3-gqa3-q" -tp 2
expect "is not experts or width" -m "$D/m3-tiny" -tp 2 --moe-split rows
expect "needs 2 GPUs\|built without" -m "$D/m3-tiny" -tp 2 --backend cuda
echo "tp_cli: $fails failure(s)"
exit $fails
