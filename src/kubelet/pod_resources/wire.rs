// SPDX-License-Identifier: Apache-2.0
//! The protobuf side of `List`: kubelet's `ListPodResourcesResponse` decoded by hand down
//! to the fields we read (pod name and namespace, container name, resource name, device
//! ids), every other field skipped by its wire type. The request is empty, so nothing is
//! encoded. Field numbers are kubelet's (`k8s.io/kubelet/pkg/apis/podresources/v1`,
//! mirrored in `crates/device-plugin/proto/podresources/v1/api.proto`). Never panics on
//! any input: lengths are checked against what is left before they are used.

use super::ContainerDevices;

/// Why the response message does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message ends inside a field (at byte {at})")]
    Truncated { at: usize },
    #[error("varint longer than 10 bytes at byte {at}")]
    VarintTooLong { at: usize },
    #[error("field {field} has wire type {wire_type} (valid: 0, 1, 2, 5)")]
    WireType { field: u64, wire_type: u64 },
    #[error("field {field} of {message} has wire type {wire_type}, expected {expected}")]
    UnexpectedWireType {
        message: &'static str,
        field: u64,
        wire_type: u64,
        expected: u64,
    },
    #[error("field {field} of {message} is not UTF-8")]
    NotUtf8 { message: &'static str, field: u64 },
}

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

/// One field as read: its number and, for length-delimited fields, its bytes.
struct Field<'a> {
    number: u64,
    wire_type: u64,
    bytes: &'a [u8],
}

/// Reads a message's fields in order.
struct Fields<'a> {
    input: &'a [u8],
    at: usize,
    /// Where `input` starts in the whole response, for error positions.
    base: usize,
}

impl<'a> Fields<'a> {
    fn new(input: &'a [u8], base: usize) -> Self {
        Self { input, at: 0, base }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let start = self.at;
        let mut value = 0u64;
        for shift in 0..10 {
            let byte = *self.input.get(self.at).ok_or(WireError::Truncated {
                at: self.base + self.at,
            })?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << (shift * 7);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::VarintTooLong {
            at: self.base + start,
        })
    }

    fn take(&mut self, len: u64) -> Result<(&'a [u8], usize), WireError> {
        let truncated = WireError::Truncated {
            at: self.base + self.at,
        };
        let len = usize::try_from(len).map_err(|_| truncated.clone())?;
        let end = self.at.checked_add(len).ok_or(truncated.clone())?;
        let bytes = self.input.get(self.at..end).ok_or(truncated)?;
        let offset = self.base + self.at;
        self.at = end;
        Ok((bytes, offset))
    }

    /// The next field, or `None` at the end of the message.
    fn next_field(&mut self) -> Result<Option<(Field<'a>, usize)>, WireError> {
        if self.at >= self.input.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (number, wire_type) = (key >> 3, key & 7);
        let (bytes, offset) = match wire_type {
            VARINT => {
                self.varint()?;
                (&[][..], self.base + self.at)
            }
            FIXED64 => self.take(8)?,
            LEN => {
                let len = self.varint()?;
                self.take(len)?
            }
            FIXED32 => self.take(4)?,
            _ => {
                return Err(WireError::WireType {
                    field: number,
                    wire_type,
                });
            }
        };
        Ok(Some((
            Field {
                number,
                wire_type,
                bytes,
            },
            offset,
        )))
    }
}

fn expect_len(message: &'static str, field: &Field<'_>) -> Result<(), WireError> {
    if field.wire_type == LEN {
        Ok(())
    } else {
        Err(WireError::UnexpectedWireType {
            message,
            field: field.number,
            wire_type: field.wire_type,
            expected: LEN,
        })
    }
}

fn string(message: &'static str, field: &Field<'_>) -> Result<String, WireError> {
    expect_len(message, field)?;
    String::from_utf8(field.bytes.to_vec()).map_err(|_| WireError::NotUtf8 {
        message,
        field: field.number,
    })
}

/// Decodes a `ListPodResourcesResponse` into one entry per (container, resource), in
/// the order kubelet lists them; a resource named twice in one container is merged.
/// Containers without devices give no entry.
pub fn decode_list_response(input: &[u8]) -> Result<Vec<ContainerDevices>, WireError> {
    let mut out = Vec::new();
    let mut fields = Fields::new(input, 0);
    while let Some((field, offset)) = fields.next_field()? {
        // ListPodResourcesResponse.pod_resources = 1
        if field.number == 1 {
            expect_len("ListPodResourcesResponse", &field)?;
            decode_pod(field.bytes, offset, &mut out)?;
        }
    }
    Ok(out)
}

/// `PodResources`: name = 1, namespace = 2, containers = 3. The containers may come
/// before the names, so they are read after.
fn decode_pod(input: &[u8], base: usize, out: &mut Vec<ContainerDevices>) -> Result<(), WireError> {
    const MESSAGE: &str = "PodResources";
    let (mut pod, mut namespace) = (String::new(), String::new());
    let mut containers = Vec::new();
    let mut fields = Fields::new(input, base);
    while let Some((field, offset)) = fields.next_field()? {
        match field.number {
            1 => pod = string(MESSAGE, &field)?,
            2 => namespace = string(MESSAGE, &field)?,
            3 => {
                expect_len(MESSAGE, &field)?;
                containers.push((field.bytes, offset));
            }
            _ => {}
        }
    }
    for (bytes, offset) in containers {
        let (container, devices) = decode_container(bytes, offset)?;
        for (resource, device_ids) in devices {
            out.push(ContainerDevices {
                pod: pod.clone(),
                namespace: namespace.clone(),
                container: container.clone(),
                resource,
                device_ids,
            });
        }
    }
    Ok(())
}

/// Resource name → device ids, in first-seen order.
type Devices = Vec<(String, Vec<String>)>;

/// `ContainerResources`: name = 1, devices = 2 (cpu_ids, memory and dynamic resources
/// are skipped).
fn decode_container(input: &[u8], base: usize) -> Result<(String, Devices), WireError> {
    const MESSAGE: &str = "ContainerResources";
    let mut name = String::new();
    let mut devices: Devices = Vec::new();
    let mut fields = Fields::new(input, base);
    while let Some((field, offset)) = fields.next_field()? {
        match field.number {
            1 => name = string(MESSAGE, &field)?,
            2 => {
                expect_len(MESSAGE, &field)?;
                let (resource, ids) = decode_devices(field.bytes, offset)?;
                match devices.iter_mut().find(|(known, _)| *known == resource) {
                    Some((_, known_ids)) => known_ids.extend(ids),
                    None => devices.push((resource, ids)),
                }
            }
            _ => {}
        }
    }
    Ok((name, devices))
}

/// `ContainerDevices`: resource_name = 1, device_ids = 2 (topology skipped).
fn decode_devices(input: &[u8], base: usize) -> Result<(String, Vec<String>), WireError> {
    const MESSAGE: &str = "ContainerDevices";
    let mut resource = String::new();
    let mut ids = Vec::new();
    let mut fields = Fields::new(input, base);
    while let Some((field, _)) = fields.next_field()? {
        match field.number {
            1 => resource = string(MESSAGE, &field)?,
            2 => ids.push(string(MESSAGE, &field)?),
            _ => {}
        }
    }
    Ok((resource, ids))
}
