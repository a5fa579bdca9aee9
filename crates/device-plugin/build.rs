// SPDX-License-Identifier: Apache-2.0
//! Compiles the kubelet APIs the device plugin speaks into Rust with tonic's code
//! generator: the device-plugin API (`proto/deviceplugin/v1beta1/api.proto`) and the
//! pod-resources API its metrics read (`proto/podresources/v1/api.proto`). `protox`
//! parses the protos in Rust, so building needs no system `protoc`.

use std::error::Error;

const PROTO_ROOT: &str = "proto";
const API: &str = "proto/deviceplugin/v1beta1/api.proto";
const POD_RESOURCES: &str = "proto/podresources/v1/api.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={API}");
    println!("cargo:rerun-if-changed={POD_RESOURCES}");
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile([API, POD_RESOURCES], [PROTO_ROOT])?;
    tonic_prost_build::configure()
        // Servers: the plugin's DevicePlugin, and (for tests that play kubelet) the
        // Registration and PodResourcesLister services. Clients: how the plugin registers
        // and lists pod resources (and how the tests play kubelet dialling the plugin).
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
