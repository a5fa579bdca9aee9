#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every cargo-fuzz target in fuzz/ for N seconds (default 20), each from its seed
# corpus (fuzz/corpus/<target>) and dictionary (fuzz/dicts/<target>.dict), prints a table
# and fails on any crash. Usage: scripts/fuzz.sh [seconds-per-target]
#
# A crash leaves its input in fuzz/artifacts/<target>/ and the fuzzer's log (with the
# backtrace) in fuzz/target/fuzz-work/<target>.log, whose end is printed. Reproduce with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -a -s none <target> fuzz/artifacts/<target>/crash-…
# then keep the (minimized: `cargo fuzz tmin`) input in tests/fixtures/fuzz-regressions/
# <target>/, where tests/security/fuzz_regressions.rs replays it on every `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
case "$seconds" in
'' | *[!0-9]*)
  echo "usage: $0 [seconds-per-target]" >&2
  exit 2
  ;;
esac

# cargo-fuzz asks for nightly features (-Zsanitizer among them); a stable rustc accepts
# them with RUSTC_BOOTSTRAP=1, so no nightly toolchain is needed.
export RUSTC_BOOTSTRAP=1
# A panic's backtrace in the log: with no sanitizer, libFuzzer prints none of its own.
export RUST_BACKTRACE=1
# Debug assertions and overflow checks on: an arithmetic overflow in a parser is a crash.
# No sanitizer by default: every target runs safe Rust only (the crate denies `unsafe`
# outside NVML and the hook's namespace code, which no target reaches), where a panic,
# an overflow, an OOM, a hang or a stack overflow is what can go wrong, and libFuzzer
# catches all of those itself. AddressSanitizer would cost 3 to 6 times the executions
# per second, 15 times the memory and a quarter more build time. FUZZ_SANITIZER=address
# turns it back on (it also checks the unsafe code inside serde_json, toml, saphyr).
sanitizer="${FUZZ_SANITIZER:-none}"
# FUZZ_BUILD=dev (make test sets it) builds the targets unoptimized: the build takes
# under half the time, for a short smoke run at a tenth to a thirtieth of the executions
# per second. The default, release, is for real fuzzing.
profile_dir=release
build_flags=(--debug-assertions --sanitizer "$sanitizer" --fuzz-dir fuzz --target-dir fuzz/target)
case "${FUZZ_BUILD:-release}" in
release) ;;
dev)
  build_flags+=(--dev)
  profile_dir=debug
  ;;
*)
  echo "FUZZ_BUILD must be release or dev, not ${FUZZ_BUILD}" >&2
  exit 2
  ;;
esac

start=$SECONDS
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
install_s=$((SECONDS - start))

start=$SECONDS
echo "== building the fuzz targets"
cargo fuzz build "${build_flags[@]}"
build_s=$((SECONDS - start))

work=fuzz/target/fuzz-work
rm -rf "$work"
mkdir -p "$work"
mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
# The binaries `cargo fuzz build` made, run directly: `cargo fuzz run` would check the
# build again before every target.
bin_dir="fuzz/target/$(rustc -vV | sed -n 's/^host: //p')/$profile_dir"

# Targets run side by side, FUZZ_JOBS at a time (default: one per CPU): each is one
# single-threaded libFuzzer process.
jobs="${FUZZ_JOBS:-$(nproc)}"

# Runs one target; leaves its table row in $work/<target>.row and, when it failed,
# its report in $work/<target>.failed.
fuzz_one() {
  local target=$1
  local corpus="$work/corpus/$target"
  local artifacts="fuzz/artifacts/$target"
  local log="$work/$target.log"
  local stamp="$work/$target.start"
  mkdir -p "$corpus" "$artifacts"
  touch "$stamp"
  local args=(
    -max_total_time="$seconds"
    # Any input slower than this is a hang: these parsers take microseconds.
    -timeout=10
    -rss_limit_mb=2048
    -artifact_prefix="$artifacts/"
    -print_final_stats=1
  )
  if [ -f "fuzz/dicts/$target.dict" ]; then
    args+=(-dict="fuzz/dicts/$target.dict")
  fi
  # New inputs go to the first corpus directory; the seeds are only read.
  local rc=0
  "$bin_dir/$target" "${args[@]}" "$corpus" "fuzz/corpus/$target" >"$log" 2>&1 || rc=$?
  local execs rate units crashes
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  units=$(grep -o 'corp: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  crashes=$(find "$artifacts" -type f -newer "$stamp" \
    \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
  printf '%-14s %12s %10s %8s %8s\n' "$target" "${execs:-?}" "${rate:-?}" "${units:-?}" "$crashes" >"$work/$target.row"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    {
      echo "!! $target failed (exit $rc, $crashes crash inputs in $artifacts/); the end of $log:"
      tail -n 60 "$log"
      find "$artifacts" -type f -newer "$stamp" | while read -r input; do
        echo "!! input $input ($(wc -c <"$input") bytes), base64 of its first 4 KiB:"
        head -c 4096 "$input" | base64 -w 0
        echo
      done
    } >"$work/$target.failed"
  fi
}

start=$SECONDS
running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "== fuzzing $target for ${seconds}s"
  fuzz_one "$target" &
  running=$((running + 1))
done
wait || true

failed=0
failed_targets=0
rows=()
for target in "${targets[@]}"; do
  if [ -f "$work/$target.row" ]; then
    rows+=("$(cat "$work/$target.row")")
  else
    rows+=("$(printf '%-14s %12s' "$target" 'did not run')")
    echo "!! fuzz-work/$target.row missing" >"$work/$target.failed"
  fi
  if [ -f "$work/$target.failed" ]; then
    failed=1
    failed_targets=$((failed_targets + 1))
    cat "$work/$target.failed"
  fi
done
run_s=$((SECONDS - start))

echo
printf '%-14s %12s %10s %8s %8s\n' target execs execs/s corpus crashes
printf '%s\n' "${rows[@]}"
echo
echo "cargo-fuzz install ${install_s}s, build ${build_s}s, runs ${run_s}s (${#targets[@]} targets x ${seconds}s, ${jobs} at a time)"
if [ "$failed" -ne 0 ]; then
  echo "fuzzing found crashes: see above"
fi
# The closing line CI reads as a test count: a target passes when it ran its time clean.
echo "fuzz: $((${#targets[@]} - failed_targets)) passed, $failed_targets failed"
exit "$failed"
