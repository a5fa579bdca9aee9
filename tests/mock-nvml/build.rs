// SPDX-License-Identifier: Apache-2.0
//! Gives the mock the real library's soname, so `ldconfig` files it as `libnvidia-ml.so.1`
//! and the loader finds it under that name inside a container.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
