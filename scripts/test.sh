#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make test`: what CI runs. Stages, in order:
#  1. lint (rustfmt, clippy on every target) and the debug build of every workspace
#     binary (the integration tests run them), then the test binaries;
#  2. the tests, while the release binaries and the packages build in the background at
#     the lowest CPU priority (`nice -n 19`): the tests spend much of their time waiting
#     on engines and daemons, and the release build (about 430 CPU-seconds) fills that
#     idle time instead of running on its own before them. The tests that need the
#     release build (the package tests) are left for stage 3;
#  3. when the release build is done: the package tests, and the runtime's and hook's
#     engine tests again against the static runtime and hook that packages install;
#  4. every fuzz target for a short smoke run (scripts/fuzz.sh).
# Every stage runs even when an earlier test stage failed; the exit status is 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
STATIC_DIR=target/static/release
LOG_DIR=target/test-logs
mkdir -p "$LOG_DIR"
failed=()

stage() { printf '\n==> %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

stage lint
$CARGO fmt --all -- --check || exit 1
$CARGO clippy --workspace --all-targets -- -D warnings || exit 1

stage "debug build"
$CARGO build --workspace || exit 1

if ! $CARGO nextest --version >/dev/null 2>&1; then
  # Without cargo-nextest: the same tests, one stage after the other.
  stage "release build and packages"
  make package || exit 1
  stage tests
  $CARGO test --workspace --no-fail-fast || failed+=(tests)
  stage "engine tests against the static runtime and hook"
  NVSHIM_TEST_RUNTIME=$PWD/$STATIC_DIR/nvidia-container-runtime NVSHIM_TEST_HOOK=$PWD/$STATIC_DIR/nvidia-container-runtime-hook \
    $CARGO test --workspace --test runtime --test hook -- shim:: runc:: driver_params:: prestart:: engines:: security:: ||
    failed+=(static-reruns)
else
  # The tests that read target/packages/ (the .deb/.rpm and their repositories).
  needs_packages='binary(cli) & test(/^packages::/)'
  # The engine tests run a second time against the static binaries packages install.
  static_reruns='binary(runtime) & test(/^(shim|runc|driver_params)::/) | binary(hook) & test(/^(prestart|engines|security)::/)'

  stage "test build"
  $CARGO nextest run --workspace --no-run || exit 1

  stage "tests, with the release build and packages in the background"
  nice -n 19 make package >"$LOG_DIR/package.log" 2>&1 &
  package_pid=$!
  $CARGO nextest run --workspace --no-fail-fast -E "not ($needs_packages)" || failed+=(tests)
  stage "waiting for the release build"
  if ! wait "$package_pid"; then
    tail -n 60 "$LOG_DIR/package.log"
    echo "release build or packaging failed: $LOG_DIR/package.log" >&2
    exit 1
  fi
  tail -n 3 "$LOG_DIR/package.log"

  stage "package tests, and the engine tests against the static runtime and hook"
  NVSHIM_TEST_RUNTIME=$PWD/$STATIC_DIR/nvidia-container-runtime NVSHIM_TEST_HOOK=$PWD/$STATIC_DIR/nvidia-container-runtime-hook \
    $CARGO nextest run --workspace --no-fail-fast -E "$needs_packages | $static_reruns" || failed+=(package-and-static-tests)
fi

stage "fuzz smoke run"
# Unoptimized fuzz targets (under half the build time), two at a time. `make fuzz` is the
# real fuzzing: optimized, longer.
FUZZ_BUILD=dev bash scripts/fuzz.sh "${TEST_FUZZ_SECONDS:-3}" || failed+=(fuzz)

stage done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
