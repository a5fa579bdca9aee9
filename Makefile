# nvshim: the two commands are `make demo` and `make test`.
CARGO ?= cargo

.PHONY: all build release static-runtime package package-arm64 demo test test-arm64 lint bench clean \
	peers cluster cluster-down test-cluster bench-cluster

all: build

# Debug build of every workspace member's library and binaries: nvshim, the device
# plugin, the mock NVML, the testkit tools (the tests need them built; the tests
# themselves are built by the test runner, and clippy checks every target).
build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

# The binaries as packages install them, all in target/static/release/:
# - the runtime and the hook, linked statically (no dynamic loader to start on every
#   container create, and none for LD_PRELOAD to reach), with the release profile's
#   fat LTO (fewer pages to fault in at start-up). They are built for musl when the
#   x86_64-unknown-linux-musl target is installed (`.ci/run` adds it): static glibc
#   probes the CPU at every start (cpuid, which traps on a VM: about 0.5 ms per exec
#   here); otherwise they are static glibc (crt-static, given to those two links only).
# - the dynamic `nvshim` (requests that need NVML) and the device plugin (package
#   nvshim-device-plugin), off the container-start path: profile release-dynamic
#   (no LTO, parallel codegen units), which builds in half the time.
# The two builds run side by side, in target dirs of their own (cargo locks a target
# dir): while one is in a single-threaded link-time step, the other uses the CPU.
STATIC_DIR := target/static/release
MUSL := x86_64-unknown-linux-musl
HAVE_MUSL := $(shell test -d "$$(rustc --print sysroot)/lib/rustlib/$(MUSL)" && echo yes)
.PHONY: static-bins dynamic-bins
static-runtime:
	$(MAKE) -j2 static-bins dynamic-bins

# The runtime and hook are built without the default `node-feature-api` feature (rustls and
# ring, for `nvshim labels --use-node-feature-api`): they never reach an API server, and
# ring's C and assembly were the slowest part of this build. Should a dependency bring C
# to the musl target again, the host gcc builds it when there is no musl cross gcc.
MUSL_CC := $(shell command -v x86_64-linux-musl-gcc || command -v musl-gcc || echo gcc)
static-bins:
ifeq ($(HAVE_MUSL),yes)
	CC_x86_64_unknown_linux_musl=$${CC_x86_64_unknown_linux_musl:-$(MUSL_CC)} $(CARGO) build -p nvshim --no-default-features --release --bin nvidia-container-runtime --bin nvidia-container-runtime-hook --target $(MUSL) --target-dir target/static
	mkdir -p $(STATIC_DIR)
	install -m 0755 target/static/$(MUSL)/release/nvidia-container-runtime target/static/$(MUSL)/release/nvidia-container-runtime-hook $(STATIC_DIR)/
else
	@echo "static-runtime: no $(MUSL) target (rustup target add $(MUSL)): linking static glibc"
	$(CARGO) rustc -p nvshim --no-default-features --release --bin nvidia-container-runtime --target-dir target/static -- -C target-feature=+crt-static
	$(CARGO) rustc -p nvshim --no-default-features --release --bin nvidia-container-runtime-hook --target-dir target/static -- -C target-feature=+crt-static
	mkdir -p $(STATIC_DIR)
endif

dynamic-bins:
	$(CARGO) build --profile release-dynamic -p nvshim --bin nvshim -p nvshim-device-plugin --bin nvidia-device-plugin --target-dir target/dynamic
	mkdir -p $(STATIC_DIR)
	install -m 0755 target/dynamic/release-dynamic/nvshim target/dynamic/release-dynamic/nvidia-device-plugin $(STATIC_DIR)/

# target/packages/: the .debs, the .rpms (NVIDIA's package names), and the signed apt/ and
# yum/ repositories (packaging/README.md).
package: static-runtime
	NVSHIM_SKIP_CARGO=1 bash packaging/build.sh

# Builds everything and shows `nvshim info`/`list` on a simulated 4-GPU node (needs root for mknod).
demo:
	bash scripts/demo.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# What CI runs (scripts/test.sh): lint, the debug build, the static runtime and hook and
# the packages (with the debug nvshim and device plugin: `make package` builds those for
# release), every test (the fuzz targets' checks on their seeds and seed variants among
# them), the engine tests again against the static binaries.
test:
	CARGO=$(CARGO) bash scripts/test.sh

# The live cluster's peers (Kubernetes, etcd, containerd 2, runc, Helm: tests/peers/versions.env),
# built from the Go module proxy into /var/cache/nvshim-ci/peers; a warm cache does nothing.
peers:
	bash scripts/build-peers.sh

# A Kubernetes cluster of two simulated GPU nodes with nvshim installed by Helm
# (docs/simulated-node.md: CLUSTER_NODES, CLUSTER_INSTALL, CLUSTER_RUNTIME); needs root.
cluster:
	bash scripts/cluster/up.sh

cluster-down:
	bash scripts/cluster/down.sh

# After `make test` (CI runs it): the end-to-end tests on a live cluster (tests/cluster/).
test-cluster:
	bash tests/cluster/run.sh

# Pod start latency on the live cluster, a GPU pod against a CPU pod (ROUNDS, default 50): a
# table for docs/benchmarks.md. Uses the cluster of `make cluster`, or brings up one node.
bench-cluster:
	bash scripts/cluster/bench-pods.sh

# After `make test` (CI runs both): the four binaries for aarch64 (Debian's rustc-web and
# cross toolchain, `.ci/run` installs them), the arm64 packages and their test, and the
# unit tests under qemu-user: scripts/arm64.sh.
test-arm64:
	CARGO=$(CARGO) bash scripts/arm64.sh

# `make package` for arm64: the release binaries for aarch64 (scripts/arm64.sh), then the
# arm64 .debs and aarch64 .rpms in target/packages-arm64/, signed with NVSHIM_GPG_HOME's key,
# else `make package`'s (target/packages.gnupg) when there is one, else a new test key.
package-arm64:
	CARGO=$(CARGO) NVSHIM_ARM64_STEPS=release bash scripts/arm64.sh
	home=$${NVSHIM_GPG_HOME:-$(CURDIR)/target/packages.gnupg}; \
	  if [ -d "$$home" ]; then export NVSHIM_GPG_HOME=$$home; fi; \
	  NVSHIM_ARCH=arm64 NVSHIM_BIN_DIR=$(CURDIR)/target/aarch64/static/release \
	  NVSHIM_SKIP_CARGO=1 bash packaging/build.sh

# Every cargo-fuzz target for FUZZ_SECONDS each (installs cargo-fuzz if missing; a crash
# fails it). fuzz/ is a directory, so the target must be phony.
FUZZ_SECONDS ?= 20
.PHONY: fuzz
fuzz:
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# `create` through the static runtime vs runc (a table), then the pipeline's own times.
bench: static-runtime
	$(CARGO) build --workspace --release
	NVSHIM_BENCH_RUNTIME=$(CURDIR)/$(STATIC_DIR)/nvidia-container-runtime $(CARGO) bench --bench create
	$(CARGO) bench --bench pipeline
	NVSHIM_BENCH_NVSHIM=$(CURDIR)/target/release/nvshim $(CARGO) bench --bench exporter
	NVSHIM_BENCH_PLUGIN=$(CURDIR)/target/release/nvidia-device-plugin $(CARGO) bench -p nvshim-device-plugin --bench plugin
	NVSHIM_BENCH_RUNTIME=$(CURDIR)/$(STATIC_DIR)/nvidia-container-runtime $(CARGO) bench --bench hook

clean:
	$(CARGO) clean
