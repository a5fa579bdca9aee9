// SPDX-License-Identifier: Apache-2.0
//! The labels as Node Feature Discovery's NodeFeature object, as gpu-feature-discovery
//! publishes them with `--use-node-feature-api`: one object per node, named
//! `nvidia-features-for-<node>`, labelled `nfd.node.kubernetes.io/node-name=<node>`, with
//! the labels in `spec.labels` and an empty `spec.features`. [`publish`] creates it, or
//! replaces its labels and spec when they differ (keeping the rest of its metadata, as
//! GFD does); [`remove`] deletes it when the labeller stops.

use serde_json::{Map, Value, json};

use super::apiserver::{ApiError, ApiServer};
use super::compute::Labels;

pub const API_VERSION: &str = "nfd.k8s-sigs.io/v1alpha1";
pub const KIND: &str = "NodeFeature";
/// The label NFD's master reads to know which node an object describes.
pub const NODE_NAME_LABEL: &str = "nfd.node.kubernetes.io/node-name";
/// GFD's name prefix: the object is `nvidia-features-for-<node>`.
pub const NAME_PREFIX: &str = "nvidia-features-for-";

/// Which object: the node it describes and the namespace it lives in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    pub namespace: String,
}

impl Target {
    pub fn name(&self) -> String {
        format!("{NAME_PREFIX}{}", self.node)
    }

    fn collection(&self) -> String {
        format!(
            "/apis/{API_VERSION}/namespaces/{}/nodefeatures",
            self.namespace
        )
    }

    fn object_path(&self) -> String {
        format!("{}/{}", self.collection(), self.name())
    }
}

/// The object GFD creates for `labels`. `status: {}` is there for NFD releases whose
/// CRD requires a status (Go's clients always send one); older CRDs prune it.
pub fn object(target: &Target, labels: &Labels) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": target.name(),
            "labels": { NODE_NAME_LABEL: target.node },
        },
        "spec": spec(labels),
        "status": {},
    })
}

fn spec(labels: &Labels) -> Value {
    json!({
        "features": { "flags": {}, "attributes": {}, "instances": {} },
        "labels": labels,
    })
}

/// What [`publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Created,
    Updated,
    Unchanged,
}

/// Creates the object, or brings an existing one's node label and spec up to date.
pub fn publish(api: &ApiServer, target: &Target, labels: &Labels) -> Result<Published, ApiError> {
    let path = target.object_path();
    let existing = api.request("GET", &path, None)?;
    if existing.status == 404 {
        let created = api.request("POST", &target.collection(), Some(&object(target, labels)))?;
        return match created.status {
            404 => Err(not_found("POST", &target.collection())),
            _ => Ok(Published::Created),
        };
    }
    let mut updated = existing.body.clone();
    let Some(fields) = updated.as_object_mut() else {
        return Err(ApiError::Malformed {
            method: "GET",
            path,
            reason: "the object is not a JSON object".to_string(),
        });
    };
    let metadata = fields
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(metadata) = metadata.as_object_mut() {
        metadata.insert(
            "labels".to_string(),
            json!({ NODE_NAME_LABEL: target.node }),
        );
    }
    fields.insert("spec".to_string(), spec(labels));
    if updated == existing.body {
        return Ok(Published::Unchanged);
    }
    let put = api.request("PUT", &path, Some(&updated))?;
    if put.status == 404 {
        return Err(not_found("PUT", &path));
    }
    Ok(Published::Updated)
}

/// Deletes the object; one that is already gone is not an error.
pub fn remove(api: &ApiServer, target: &Target) -> Result<(), ApiError> {
    api.request("DELETE", &target.object_path(), None)
        .map(|_| ())
}

fn not_found(method: &'static str, path: &str) -> ApiError {
    ApiError::Status {
        method,
        path: path.to_string(),
        status: 404,
        body: "not found (is NFD's NodeFeature CRD installed?)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_gfds() {
        let target = Target {
            node: "gpu-node-1".to_string(),
            namespace: "gpu-operator".to_string(),
        };
        let labels = Labels::from([("nvidia.com/gpu.count".to_string(), "2".to_string())]);
        assert_eq!(
            object(&target, &labels),
            json!({
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeature",
                "metadata": {
                    "name": "nvidia-features-for-gpu-node-1",
                    "labels": { "nfd.node.kubernetes.io/node-name": "gpu-node-1" },
                },
                "spec": {
                    "features": { "flags": {}, "attributes": {}, "instances": {} },
                    "labels": { "nvidia.com/gpu.count": "2" },
                },
                "status": {},
            })
        );
        assert_eq!(
            target.object_path(),
            "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-operator/nodefeatures/nvidia-features-for-gpu-node-1"
        );
    }
}
