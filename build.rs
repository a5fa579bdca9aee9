// SPDX-License-Identifier: Apache-2.0
//! Compiles the kubelet device-plugin API (`proto/deviceplugin/v1beta1/api.proto`) into
//! Rust with tonic's code generator. `protox` parses the proto in Rust, so building
//! needs no system `protoc`.

use std::error::Error;

const PROTO_ROOT: &str = "proto";
const API: &str = "proto/deviceplugin/v1beta1/api.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={API}");
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile([API], [PROTO_ROOT])?;
    tonic_prost_build::configure()
        // The server is the plugin; the client is how the plugin registers (and how
        // the tests play kubelet).
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
