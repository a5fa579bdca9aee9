#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make test`: what CI runs, in this order (each step needs the CPU to itself: on two
# cores, running them side by side only slows both):
#  1. lint: rustfmt, clippy on every target;
#  2. the debug build of every workspace binary (the integration tests run them);
#  3. the static runtime and hook as packages ship them (musl, release, fat LTO), then
#     the packages, with the debug build of `nvshim` and the device plugin in them: the
#     package tests check what the packages install and what their scripts do, which the
#     optimization level of those two binaries does not change, and their release build
#     (`make package`, about 270 CPU-seconds) would be a third of this script's time;
#  4. the test binaries, then every test (the package tests among them);
#  5. the runtime's and hook's engine tests again, against the static runtime and hook;
#  6. every fuzz target for a short smoke run (scripts/fuzz.sh).
# With NVSHIM_TEST_ARM64=1 (scripts/arm64.sh; off by default: about 500 CPU-seconds from
# cold, which the 720 s CI limit has no room for, docs/benchmarks.md), also:
#  3b. the four binaries for aarch64 and the arm64 packages from them (target/packages-arm64,
#      which the package tests then require);
#  7.  the unit tests for aarch64 under qemu-user.
# The test steps all run even when one fails; the exit status is 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
STATIC_DIR=target/static/release
failed=()

stage() { printf '\n==> %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

stage lint
$CARGO fmt --all -- --check || exit 1
$CARGO clippy --workspace --all-targets -- -D warnings || exit 1

stage "debug build"
$CARGO build --workspace || exit 1

stage "static runtime and hook, then the packages"
make static-bins || exit 1
install -m 0755 target/debug/nvshim target/debug/nvidia-device-plugin "$STATIC_DIR/" || exit 1
NVSHIM_SKIP_CARGO=1 bash packaging/build.sh || exit 1

arm64=${NVSHIM_TEST_ARM64:-0}
export NVSHIM_TEST_ARM64=$arm64
if [ "$arm64" = 1 ]; then
  stage "aarch64 binaries, then the arm64 packages"
  NVSHIM_ARM64_STEPS=bins bash scripts/arm64.sh || exit 1
  NVSHIM_ARCH=arm64 NVSHIM_BIN_DIR="$PWD/target/aarch64/aarch64-unknown-linux-gnu/debug" \
    NVSHIM_GPG_HOME="$PWD/target/packages.gnupg" NVSHIM_SKIP_CARGO=1 bash packaging/build.sh || exit 1
fi

static_env=(NVSHIM_TEST_RUNTIME="$PWD/$STATIC_DIR/nvidia-container-runtime" NVSHIM_TEST_HOOK="$PWD/$STATIC_DIR/nvidia-container-runtime-hook")
if $CARGO nextest --version >/dev/null 2>&1; then
  stage tests
  $CARGO nextest run --workspace --no-fail-fast || failed+=(tests)
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

stage "fuzz smoke run"
# Unoptimized fuzz targets (under half the build time), two at a time. `make fuzz` is the
# real fuzzing: optimized, longer.
FUZZ_BUILD=dev bash scripts/fuzz.sh "${TEST_FUZZ_SECONDS:-3}" || failed+=(fuzz)

if [ "$arm64" = 1 ]; then
  stage "aarch64 unit tests under qemu-user"
  NVSHIM_ARM64_STEPS="tests plugin-tests" bash scripts/arm64.sh || failed+=(aarch64)
fi

stage done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
