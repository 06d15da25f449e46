#!/usr/bin/env bash
# Runs the CPU test programs and benchmarks from a folder of built binaries, without cmake
# or ctest: for machines that have the runtime libraries but no build tools (the GPU hosts,
# whose CPUs have AVX-512). usage: tools/cpu_checks.sh BIN_DIR [OUT_DIR]
set -u
BIN=$1; OUT=${2:-/tmp/m3-cpu-checks}; D=tests/data
mkdir -p "$OUT"; fails=0
run() { echo "== $*"; "$@" || { echo "FAILED: $*"; fails=$((fails+1)); }; }
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)  cores: $(nproc)"
echo "avx512: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
run "$BIN/test_units"
run "$BIN/test_linear"
run env M3_SIMD=avx2 "$BIN/test_linear"
for m in m3-tiny m3-tiny-q m3-wide-q m3-gqa3 m3-gqa3-q m3-mqa m3-mqa-q; do
  run "$BIN/oracle_check" "$BIN/m3" $D/$m $D/$m.oracle.safetensors --work "$OUT"
done
run "$BIN/oracle_check" "$BIN/m3" $D/m3-tiny $D/m3-tiny.kv-bf16.oracle.safetensors --kv bf16 --work "$OUT"
run bash tests/errors.sh "$BIN/m3" $D/m3-tiny "$OUT/errors"
run bash tests/make_tiny.sh "$BIN/m3" "$OUT/make_tiny"
echo "== kernels"
for s in avx2 avx512; do M3_SIMD=$s "$BIN/bench_linear" 4096 2048 2 1; M3_SIMD=$s "$BIN/bench_linear" 4096 2048 2 64; done
echo "== medium checkpoint, 2 threads"
"$BIN/m3" make-tiny --out "$OUT/medium" --config bench/medium-config.json --quant mxfp8-nvfp4 --seed 1
for s in avx2 avx512; do M3_SIMD=$s "$BIN/m3" bench -m "$OUT/medium" --prompt 256 --decode 32 --threads 2; done
echo "checks failed: $fails"
exit $fails
