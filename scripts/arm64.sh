#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# aarch64 (`make test-arm64`, which CI runs after `make test`): builds the four binaries
# (nvidia-container-runtime, nvidia-container-runtime-hook, nvshim, nvidia-device-plugin)
# for aarch64-unknown-linux-gnu with Debian's cross toolchain, the arm64 packages from them
# (checked by tests/cli/packages/arm64.rs against the amd64 set `make test` built), then
# runs the unit tests of nvshim's library and of the device plugin's and `:authority`
# crates under qemu-user. Exits non-zero if any build or test fails.
#
# The toolchain (`.ci/run` installs it): rustup cannot add targets here (no network to
# static.rust-lang.org), so the compiler is Debian 12's rustc-web (1.96, bookworm-security)
# with the arm64 standard library from libstd-rust-web-dev:arm64 (multiarch); cargo is
# rustup's, told RUSTC=/usr/bin/rustc. That rustc compiles the host parts too (build
# scripts, proc macros: a proc macro must come from the compiler that loads it), so nothing
# is shared with target/debug. Linker: aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu).
# Runner: qemu-aarch64 (qemu-user) finds the arm64 ld.so and libc that libc6:arm64 put in
# /lib and /usr/lib/aarch64-linux-gnu (`-L /usr/aarch64-linux-gnu` makes qemu 7.2 hang in
# the first test, so it is not used).
#
# Tests left out under qemu-user: both need openat2, which qemu-user 7.2 does not emulate
# (ENOSYS); they run natively in the x86-64 suite:
#   rootfs::tests::the_walk_agrees_with_openat2     compares our walk with openat2's
#   hook::params::tests::a_rootfs_without_the_driver_params_is_left_alone
#                                                   hook::params opens its target with openat2
# `rootfs` falls back when openat2 is missing (old kernels), so the rest of its tests run
# that path here.
#
# Environment:
#   NVSHIM_ARM64_RUSTC       the rustc with an aarch64 std (default /usr/bin/rustc)
#   NVSHIM_ARM64_TARGET_DIR  cargo's target dir (default target/aarch64)
#   NVSHIM_ARM64_STEPS       any of "bins packages tests plugin-tests" (default: all four;
#                            packages needs bins, and the amd64 packages and test binaries
#                            of `make test`), or
#                            "release": the four binaries as packages ship them, the
#                            runtime and the hook with the release profile (fat LTO, static
#                            glibc), nvshim and the plugin with release-dynamic, all in
#                            $NVSHIM_ARM64_TARGET_DIR/static/release/ (`make package-arm64`)
#   NVSHIM_ARM64_NICE        niceness of the builds and tests (default 0)
# The binaries end up in $NVSHIM_ARM64_TARGET_DIR/aarch64-unknown-linux-gnu/debug/.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
TARGET=aarch64-unknown-linux-gnu
export RUSTC=${NVSHIM_ARM64_RUSTC:-/usr/bin/rustc}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER:-qemu-aarch64}
target_dir=${NVSHIM_ARM64_TARGET_DIR:-target/aarch64}
steps=" ${NVSHIM_ARM64_STEPS:-bins packages tests plugin-tests} "
nice=(nice -n "${NVSHIM_ARM64_NICE:-0}")
skips=(
  --skip rootfs::tests::the_walk_agrees_with_openat2
  --skip hook::params::tests::a_rootfs_without_the_driver_params_is_left_alone
)

die() {
  echo "scripts/arm64.sh: $*" >&2
  exit 1
}

# Every tool, or a message naming the package that has it.
[ -x "$RUSTC" ] || die "$RUSTC not found (apt-get install rustc-web)"
sysroot=$("$RUSTC" --print sysroot) || die "$RUSTC --print sysroot failed"
[ -d "$sysroot/lib/rustlib/$TARGET/lib" ] ||
  die "no $TARGET standard library in $sysroot (dpkg --add-architecture arm64; apt-get install libstd-rust-web-dev:arm64)"
command -v "$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER" >/dev/null ||
  die "$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER not found (apt-get install gcc-aarch64-linux-gnu)"
command -v qemu-aarch64 >/dev/null || die "qemu-aarch64 not found (apt-get install qemu-user)"
[ -e /lib/ld-linux-aarch64.so.1 ] || die "/lib/ld-linux-aarch64.so.1 not found (apt-get install libc6:arm64)"

failed=()
# cargo_arm64 SUBCOMMAND ARGS...: cargo for aarch64 (the target flags go before a `--`).
cargo_arm64() {
  "${nice[@]}" "$CARGO" "$1" --target "$TARGET" --target-dir "$target_dir" "${@:2}"
}

echo "aarch64: $("$RUSTC" --version), target dir $target_dir, steps:$steps"
if [[ $steps == *" bins "* ]]; then
  cargo_arm64 build -p nvshim --bin nvshim -p nvshim-device-plugin --bin nvidia-device-plugin ||
    die "the aarch64 build of the binaries failed"
  # The runtime and the hook link statically, as the packages ship them (no dynamic loader
  # on the container-start path; their packages carry no library dependencies). Debian has
  # no Rust std for aarch64-unknown-linux-musl, so this is static glibc (as the Makefile's
  # fallback without the musl target); the flag goes to these two links only.
  for b in nvidia-container-runtime nvidia-container-runtime-hook; do
    cargo_arm64 rustc -p nvshim --bin "$b" -- -C target-feature=+crt-static ||
      die "the aarch64 build of $b failed"
  done
  out=$target_dir/$TARGET/debug
  for b in nvidia-container-runtime nvidia-container-runtime-hook nvshim nvidia-device-plugin; do
    # e_machine (offset 18, little-endian) 183 is EM_AARCH64.
    machine=$(od -An -tu2 -j18 -N2 "$out/$b" | tr -d ' ')
    [ "$machine" = 183 ] || die "$out/$b: e_machine $machine, not aarch64 (183)"
    case $b in
      nvidia-container-runtime*)
        readelf -d "$out/$b" | grep -q NEEDED && die "$out/$b is not linked statically" ;;
    esac
    # Each one starts under qemu and prints its version.
    qemu-aarch64 "$out/$b" --version >/dev/null || failed+=("$b --version")
  done
fi
if [[ $steps == *" packages "* ]]; then
  # The debug binaries of `bins`, signed with `make test`'s key; then the x86-64 package
  # test that compares them with the amd64 set, required to find them.
  [ -d target/packages ] || die "no target/packages: run make test (or make package) first"
  NVSHIM_ARCH=arm64 NVSHIM_BIN_DIR="$PWD/$target_dir/$TARGET/debug" \
    NVSHIM_GPG_HOME="$PWD/target/packages.gnupg" NVSHIM_SKIP_CARGO=1 bash packaging/build.sh ||
    die "the arm64 packages failed to build"
  # The host's own rustc, and the whole workspace: the test binary `make test` built, as
  # it is (Debian's rustc or `-p nvshim` would rebuild it).
  env -u RUSTC NVSHIM_TEST_ARM64=1 "$CARGO" nextest run --workspace --no-fail-fast \
    -E 'binary(cli) & test(/^packages::arm64::/)' || failed+=(packages)
fi
if [[ $steps == *" tests "* ]]; then
  cargo_arm64 test -p nvshim -p nvshim-http2-authority --lib -- "${skips[@]}" || failed+=(tests)
fi
if [[ $steps == *" plugin-tests "* ]]; then
  cargo_arm64 test -p nvshim-device-plugin --lib || failed+=(plugin-tests)
fi
if [[ $steps == *" release "* ]]; then
  for b in nvidia-container-runtime nvidia-container-runtime-hook; do
    cargo_arm64 rustc --release -p nvshim --bin "$b" -- -C target-feature=+crt-static ||
      die "the aarch64 release build of $b failed"
  done
  cargo_arm64 build --profile release-dynamic -p nvshim --bin nvshim \
    -p nvshim-device-plugin --bin nvidia-device-plugin ||
    die "the aarch64 release-dynamic build failed"
  mkdir -p "$target_dir/static/release"
  install -m 0755 "$target_dir/$TARGET/release/nvidia-container-runtime" \
    "$target_dir/$TARGET/release/nvidia-container-runtime-hook" \
    "$target_dir/$TARGET/release-dynamic/nvshim" \
    "$target_dir/$TARGET/release-dynamic/nvidia-device-plugin" "$target_dir/static/release/" ||
    die "cannot collect the release binaries"
fi
if [ "${#failed[@]}" -gt 0 ]; then
  die "aarch64 failed: ${failed[*]}"
fi
echo "aarch64: all passed"
