//! The kubelet device-plugin API v1beta1 (`proto/deviceplugin/v1beta1/api.proto`),
//! generated at build time by `build.rs`: message types, the `DevicePlugin` server
//! trait and the `Registration` client the plugin uses, plus their mirror images
//! (`Registration` server, `DevicePlugin` client) for tests that play kubelet.
//!
//! prost renames the proto's fields to snake case: `Device.ID` is `id`,
//! `ContainerPreferredAllocationResponse.deviceIDs` is `device_i_ds`.

#![allow(
    // Generated code: doc comments come from the proto and the lint set is not ours.
    missing_docs,
    clippy::doc_lazy_continuation,
    clippy::doc_overindented_list_items,
    clippy::large_enum_variant,
    clippy::derive_partial_eq_without_eq,
    clippy::default_trait_access,
    clippy::too_long_first_doc_paragraph
)]

tonic::include_proto!("v1beta1");

/// The API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// `Device.health` of a usable device.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";
