// SPDX-License-Identifier: Apache-2.0
//! Talking to the kubelet from the core library, without an async stack: a blocking
//! client for the pod-resources API, which tells which pod and container holds which
//! device (the exporter's `pod`/`namespace`/`container` labels).

pub mod pod_resources;
