#!/bin/bash
# The teacher-forced accuracy contract can fail: a checkpoint with a planted bug (plant_bug.py)
# must fail oracle_check --precision bf16 --teacher-forced on the bf16-GEMM reference, with
# positions that no near-tie explains (not a crash, not a run that failed).
# usage: planted.sh M3 ORACLE_CHECK DATA_DIR WORK_DIR KIND
set -u
m3=$1 oc=$2 data=$3 work=$4 kind=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work/$kind" && mkdir -p "$work"
python3 "$here/plant_bug.py" "$data/m3-tiny-q" "$work/$kind" "$kind" || exit 1
"$oc" "$m3" "$work/$kind" "$data/m3-tiny-q.bf16gemm.oracle.safetensors" --precision bf16 --teacher-forced 1 \
    --work "$work" > "$work/$kind.log" 2>&1
rc=$?
grep -v '^loaded' "$work/$kind.log" | tail -8
if [ $rc -ne 1 ]; then echo "FAIL: oracle_check exited $rc on the planted $kind (1 expected: the contract violated)"; exit 1; fi
if grep -q 'm3 logits.*failed' "$work/$kind.log"; then echo "FAIL: a run failed (not the contract)"; exit 1; fi
if ! grep -Eq 'no near-tie explains it|over the flip bound' "$work/$kind.log"; then
    echo "FAIL: no position was reported unexplained"; exit 1
fi
echo "ok: the planted $kind violates the contract"
