#!/usr/bin/env bash
# session 27 call 7: the final tree (df79022's kernels; the graph refusal): gpu.sh sections 1 (CPU against GPU,
# the references, graph_regrow with failing recordings, ...) and 9 (DSpark on the GPU: greedy equality k 1/3/7,
# sanitizers, m3 bench with the draft at 30 layers, served speculating 1 / 16 / 64 streams)
# The served runs of section 9 need the qwen3 tokenizer, which no longer fits beside the binaries in what a call
# carries (64 MiB with the tracked tree): they fail here for want of it and are not a finding.
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call7/call7.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
M3_GPU_SECTIONS=1 timeout 220 scripts/gpu.sh $B /tmp/w1 > $L/s1.log 2>&1; echo "[$SECONDS] section 1 rc $?"
grep -E "FAILED|checks failed|graph_regrow|graphs, faults" $L/s1.log | cut -c1-200 | head -20
save
M3_GPU_SECTIONS=9 M3_TOKENIZER=/nonexistent/tokenizer.json timeout $((570 - SECONDS)) scripts/gpu.sh $B /tmp/w9 > $L/s9.log 2>&1; echo "[$SECONDS] section 9 rc $?"
grep -E "FAILED|checks failed|ERROR SUMMARY|dspark whole step|^(1|8) |tok/s|complete" $L/s9.log | cut -c1-220 | head -40
echo "[$SECONDS] done"
