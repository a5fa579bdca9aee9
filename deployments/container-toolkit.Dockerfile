# The toolkit image, ghcr.io/nvshim/container-toolkit: `nvshim install` puts the runtime on
# the host it runs on (docs/installer.md). Built by the release flow (not by CI):
#   docker build -f deployments/container-toolkit.Dockerfile -t ghcr.io/nvshim/container-toolkit:0.1.0 .
# The runtime and the hook are the static builds the packages ship (`make static-runtime`:
# musl, with the release profile); `nvshim` is the dynamic one, as in deployments/Dockerfile.
FROM rust:1.95-bookworm AS build
WORKDIR /src
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN make static-runtime

# Debian slim, not distroless: `--restart-mode systemd` runs `chroot <host-root> systemctl`.
FROM debian:bookworm-slim
COPY --from=build /src/target/static/release/nvidia-container-runtime /usr/bin/nvidia-container-runtime
COPY --from=build /src/target/static/release/nvidia-container-runtime-hook /usr/bin/nvidia-container-runtime-hook
COPY --from=build /src/target/static/release/nvshim /usr/bin/nvshim
# NVIDIA's toolkit image's entry point name, for manifests written for it.
RUN ln -s nvshim /usr/bin/nvidia-ctk-installer
# The installer needs the host's / (--host-root, /host in the DaemonSet), runs privileged
# with hostPID (for the engine's PID from its socket) and writes to /run/nvidia.
USER 0:0
ENTRYPOINT ["/usr/bin/nvshim", "install"]
