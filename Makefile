# nvshim: the two commands are `make demo` and `make test`.
CARGO ?= cargo
NEXTEST := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: all build release demo test lint bench clean

all: build

# Debug build of every workspace member: nvshim, the mock NVML, the testkit tools.
build:
	$(CARGO) build --workspace --all-targets

release:
	$(CARGO) build --workspace --release

# Builds everything and shows `nvshim info`/`list` on a simulated 4-GPU node (needs root for mknod).
demo:
	bash scripts/demo.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# What CI runs. The integration tests need the mock NVML and fake nvidia-smi built first.
test: lint build
ifeq ($(NEXTEST),yes)
	$(CARGO) nextest run --workspace --no-fail-fast
else
	$(CARGO) test --workspace --no-fail-fast
endif

# Median times of discovery + selection + edits (procfs and NVML paths) on a simulated node.
bench:
	$(CARGO) build --workspace --release
	$(CARGO) bench --bench pipeline

clean:
	$(CARGO) clean
