#!/bin/bash
# oracle_check's end-to-end statistics (--max-over: positions and greedy steps over --tol at a
# rate, a Poisson 99% count) allow what they say and no more: against a copy of m3-tiny-q's
# bf16-GEMM reference with rows scaled by 1.5 (relative L2 1/3, over the 1e-1 bound), case 2
# (40 positions, 24 greedy steps: 2 of each allowed at 1%) passes with 2 rows moved and fails
# with 3, for prompt positions and for greedy steps alike. And --twin cpu: against a reference
# whose greedy token at step 5 no run produces, the check fails alone and passes with the twin
# (the CPU leaves that path too, and the device follows the CPU's).
# usage: e2e_rate.sh M3 ORACLE_CHECK DATA_DIR WORK_DIR
set -u
m3=$1 oc=$2 data=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
fails=0
check() { # WHAT ROWS EXPECTED_RC [more oracle_check args]
    local what=$1 rows=$2 want=$3
    shift 3
    local tag="$what-$rows${1:+-twin}" ref="$work/ref-$what-$rows.safetensors"
    python3 "$here/perturb_ref.py" "$data/m3-tiny-q.bf16gemm.oracle.safetensors" "$ref" 2 "$what" "$rows" 1.5 || { fails=$((fails + 1)); return; }
    "$oc" "$m3" "$data/m3-tiny-q" "$ref" --cases 2 --precision bf16 --tol 1e-1 --median-tol 1e-2 --greedy-tie 0.02 \
        --index-agree 0.99 --max-over 0.01 --work "$work" "$@" > "$work/$tag.log" 2>&1
    local rc=$?
    if [ $rc -ne "$want" ]; then
        echo "FAIL: $tag: oracle_check exited $rc ($want expected)"; grep -v '^loaded' "$work/$tag.log" | tail -4
        fails=$((fails + 1))
    else
        echo "ok: $tag: exit $rc: $(grep -Eo "[0-9]+ of [0-9]+ (positions|steps) over [^)]*\)|first differing greedy token at step [0-9]+|follows it" "$work/$tag.log" | tail -1)"
    fi
}
check logits 3,17 0
check logits 3,17,30 1
check greedy_logits 5,11 0
check greedy_logits 5,11,20 1
check greedy_tokens 5 1
check greedy_tokens 5 0 --twin cpu
exit $fails
