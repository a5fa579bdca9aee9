# nvshim: the two commands are `make demo` and `make test`.
CARGO ?= cargo
NEXTEST := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: all build release static-runtime package demo test lint bench clean

all: build

# Debug build of every workspace member: nvshim, the mock NVML, the testkit tools.
build:
	$(CARGO) build --workspace --all-targets

release:
	$(CARGO) build --workspace --release

# The binaries as packages install them: the runtime and the hook linked statically (the
# runtime starts about 1 ms sooner on every container create; no dynamic loader means no
# LD_PRELOAD can reach either), the dynamic `nvshim` beside them for requests that need
# NVML, and the device plugin. All land in target/static/release/. Only the two static
# final links get crt-static; the other bins are named one by one, because `--bins`
# would relink the static ones without it.
STATIC_DIR := target/static/release
static-runtime:
	$(CARGO) rustc -p nvshim --release --bin nvidia-container-runtime --target-dir target/static -- -C target-feature=+crt-static
	$(CARGO) rustc -p nvshim --release --bin nvidia-container-runtime-hook --target-dir target/static -- -C target-feature=+crt-static
	$(CARGO) build -p nvshim --release --bin nvshim --bin nvidia-device-plugin --target-dir target/static

# target/packages/: the .deb, the .rpm, and apt/ and yum/ repositories (packaging/README.md).
package: static-runtime
	NVSHIM_SKIP_CARGO=1 bash packaging/build.sh

# Builds everything and shows `nvshim info`/`list` on a simulated 4-GPU node (needs root for mknod).
demo:
	bash scripts/demo.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# What CI runs. The integration tests need the mock NVML and fake nvidia-smi built first.
test: lint build static-runtime package
ifeq ($(NEXTEST),yes)
	$(CARGO) nextest run --workspace --no-fail-fast
else
	$(CARGO) test --workspace --no-fail-fast
endif
	# The shim tests again, against the static runtime that packages install.
	NVSHIM_TEST_RUNTIME=$(CURDIR)/$(STATIC_DIR)/nvidia-container-runtime $(CARGO) test --test runtime_shim --test runtime_runc
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

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
	NVSHIM_BENCH_PLUGIN=$(CURDIR)/target/release/nvidia-device-plugin $(CARGO) bench --bench plugin
	NVSHIM_BENCH_RUNTIME=$(CURDIR)/$(STATIC_DIR)/nvidia-container-runtime $(CARGO) bench --bench hook

clean:
	$(CARGO) clean
