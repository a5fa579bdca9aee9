// SPDX-License-Identifier: Apache-2.0
//! The device plugin's integration tests, one binary (one link, one process tree for
//! nextest to list): each module was a test file of its own.
//!
//! ```text
//! common        the harness: the testkit's node and output checks, the workspace's
//!               other binaries, a fake kubelet, the plugin as a process, a real kubelet
//! grpc          the kubelet side through the library API (serve, register, restarts)
//! e2e           the binary as a process against the fake kubelet, and in containers
//! abuse         requests no kubelet sends
//! cdi           the CDI spec the cdi-* strategies write, and podman reading it
//! flags         NVIDIA's flags against the binary: accepted, or refused by name
//! foreign       gRPC clients we did not write (grpcio, grpc-go, raw HTTP/2)
//! health        the XID event loop against the mock NVML
//! helm          the Helm chart rendered by Go's text/template + sprig: schema, docs, objects
//! http2         the :authority fix against h2's decoder
//! kubelet       a real kubelet and containerd
//! kustomize     deployments/kustomize/: every overlay rendered, validated and checked
//! kustomize_image_env  the components against the loose manifests; the documented opt-out
//! manifests     deployments/*.yml through kubernetes-validate and kustomize; the exporter's
//! metrics       /metrics on a simulated node
//! mps           MPS sharing with the real binary
//! pod_resources_client  the core's blocking pod-resources client against tonic
//! soak          load and soak (ignored by default)
//! deployments   the shipped manifests against what the plugin reads
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

mod abuse;
mod cdi;
mod deployments;
mod e2e;
mod flags;
mod foreign;
mod fuzz_regressions;
mod grpc;
mod health;
mod helm;
mod http2;
mod kubelet;
mod kustomize;
mod kustomize_image_env;
mod manifests;
mod metrics;
mod metrics_dcgm;
mod mps;
mod pod_resources_client;
mod soak;
