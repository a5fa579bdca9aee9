#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make test`: what CI runs (`.ci/run`, then `make test-arm64`), in this order:
#  1. lint: rustfmt, clippy on every target;
#  2. the debug build of every workspace binary (the integration tests run them), then
#     the test binaries; beside both, in the background from step 1 on, the static
#     runtime and hook as packages ship them (musl, release, fat LTO) in target/static.
#     Most of that build is one thread compiling the nvshim crate at opt-level 3, so on
#     two cores it runs in the other core's idle time (docs/benchmarks.md, "make test");
#  3. the packages, with the debug build of `nvshim` and the device plugin in them: the
#     package tests check what the packages install and what their scripts do, which the
#     optimization level of those two binaries does not change, and their release build
#     (`make package`, about 270 CPU-seconds) would be a third of this script's time;
#  4. every test (the package tests among them);
#  5. the runtime's and hook's engine tests again, against the static runtime and hook.
# The fuzz targets' checks run in step 4 (tests/security/fuzz_regressions.rs: the seed
# corpora, the kept crashes and 3,000 random variants of the seeds per target); `make fuzz`
# builds the targets with cargo-fuzz and runs libFuzzer (scripts/fuzz.sh).
# With NVSHIM_TEST_ARM64=1 the arm64 package test requires target/packages-arm64 (which
# `make test-arm64` builds; see scripts/arm64.sh) instead of skipping without it.
# The test steps all run even when one fails; the exit status is 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
STATIC_DIR=target/static/release
failed=()

stage() { printf '\n==> %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

stage lint
$CARGO fmt --all -- --check || exit 1
# The static build goes first into the background: it has a target dir (and so a cargo
# lock) of its own.
static_log=target/static-build.log
mkdir -p target
make static-bins >"$static_log" 2>&1 &
static_pid=$!
stop_static() { kill "$static_pid" 2>/dev/null; wait "$static_pid" 2>/dev/null; }
$CARGO clippy --workspace --all-targets -- -D warnings || { stop_static; exit 1; }

stage "debug build, then the test binaries (the static runtime and hook beside them)"
$CARGO build --workspace || { stop_static; exit 1; }
if $CARGO nextest --version >/dev/null 2>&1; then
  $CARGO nextest run --workspace --no-run || { stop_static; exit 1; }
else
  $CARGO test --workspace --no-run || { stop_static; exit 1; }
fi

stage "waiting for the static runtime and hook, then the packages"
if ! wait "$static_pid"; then
  cat "$static_log" >&2
  echo "make static-bins failed (its log above)" >&2
  exit 1
fi
tail -n 3 "$static_log"
install -m 0755 target/debug/nvshim target/debug/nvidia-device-plugin "$STATIC_DIR/" || exit 1
NVSHIM_SKIP_CARGO=1 bash packaging/build.sh || exit 1
export NVSHIM_TEST_ARM64=${NVSHIM_TEST_ARM64:-0}

static_env=(NVSHIM_TEST_RUNTIME="$PWD/$STATIC_DIR/nvidia-container-runtime" NVSHIM_TEST_HOOK="$PWD/$STATIC_DIR/nvidia-container-runtime-hook")
if $CARGO nextest --version >/dev/null 2>&1; then
  stage tests
  # Two tests per core: many of them wait more than they compute (engines and a kubelet
  # starting, the soaks' paced loops), and with one per core the CPUs sat partly idle
  # (docs/benchmarks.md: 250 s with 2 threads, 226 s with 3, 202 s with 4 on the 2-core VM).
  $CARGO nextest run --workspace --no-fail-fast --test-threads "$(( $(nproc) * 2 ))" || failed+=(tests)
  stage "engine tests against the static runtime and hook"
  # Through nextest over the workspace, so nothing is rebuilt (a plain `cargo test -p
  # nvshim` resolves features apart and recompiles dependencies).
  env "${static_env[@]}" $CARGO nextest run --workspace --no-fail-fast \
    -E 'binary(runtime) & test(/^(shim|runc|driver_params|classes|graphics|mig_access|tegra|wsl)::/) | binary(hook) & test(/^(prestart|engines|security|classes|graphics|tegra|wsl)::/)' ||
    failed+=(static-reruns)
else
  stage tests
  $CARGO test --workspace --no-fail-fast || failed+=(tests)
  stage "engine tests against the static runtime and hook"
  env "${static_env[@]}" $CARGO test --workspace --test runtime --test hook -- \
    shim:: runc:: driver_params:: classes:: graphics:: mig_access:: tegra:: wsl:: prestart:: engines:: security:: || failed+=(static-reruns)
fi

stage done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
