#!/bin/bash
# oracle_check's end-to-end statistics (--max-over: positions and greedy steps over --tol at a
# rate, a Poisson 99% count) allow what they say and no more: against a copy of m3-tiny-q's
# bf16-GEMM reference with rows scaled by 1.5 (relative L2 1/3, over the 1e-1 bound), case 2
# (40 positions, 24 greedy steps: 2 of each allowed at 1%) passes with 2 rows moved and fails
# with 3, for prompt positions and for greedy steps alike.
# usage: e2e_rate.sh M3 ORACLE_CHECK DATA_DIR WORK_DIR
set -u
m3=$1 oc=$2 data=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
fails=0
check() { # WHAT ROWS EXPECTED_RC
    local ref="$work/ref-$1-$2.safetensors"
    python3 "$here/perturb_ref.py" "$data/m3-tiny-q.bf16gemm.oracle.safetensors" "$ref" 2 "$1" "$2" 1.5 || { fails=$((fails + 1)); return; }
    "$oc" "$m3" "$data/m3-tiny-q" "$ref" --cases 2 --precision bf16 --tol 1e-1 --median-tol 1e-2 --greedy-tie 0.02 \
        --index-agree 0.99 --max-over 0.01 --work "$work" > "$work/$1-$2.log" 2>&1
    local rc=$?
    if [ $rc -ne "$3" ]; then
        echo "FAIL: $1 rows $2 moved: oracle_check exited $rc ($3 expected)"; grep -v '^loaded' "$work/$1-$2.log" | tail -4
        fails=$((fails + 1))
    else
        local unit=positions; [ "$1" = greedy_logits ] && unit=steps
        echo "ok: $1 rows $2 moved: exit $rc: $(grep -Eo "[0-9]+ of [0-9]+ $unit over [^)]*\)" "$work/$1-$2.log" | head -1)"
    fi
}
check logits 3,17 0
check logits 3,17,30 1
check greedy_logits 5,11 0
check greedy_logits 5,11,20 1
exit $fails
