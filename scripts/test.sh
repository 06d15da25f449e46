#!/usr/bin/env bash
# Builds m3 and runs every test: a release build under ctest, the fuzz targets for a
# bounded time, the tests again under AddressSanitizer + UndefinedBehaviorSanitizer, then the
# engine + server tests where threads meet (ctest label tsan) under ThreadSanitizer.
# Exits non-zero on any failure. M3_SKIP_FUZZ=1 / M3_SKIP_SANITIZERS=1 / M3_SKIP_TSAN=1 skip
# a stage; M3_FUZZ_SECONDS sets the time per fuzz target (default 20).
# No sanitizer suppressions are used; one added must say why next to it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
if [ "${M3_SKIP_FUZZ:-0}" != 1 ]; then
  scripts/fuzz.sh "${M3_FUZZ_SECONDS:-20}"
fi
if [ "${M3_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DM3_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$jobs")
fi
if [ "${M3_SKIP_TSAN:-0}" != 1 ]; then
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DM3_TSAN=ON >/dev/null
  cmake --build build-tsan -j"$jobs" --target m3 test_faults test_engine test_sampler test_responses
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure -j"$jobs" -L tsan)
fi
