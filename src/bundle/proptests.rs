// SPDX-License-Identifier: Apache-2.0
//! Property tests: `SpecDoc::parse` and `parse_state` never panic, whatever the bytes; a
//! document survives `to_vec` and a second parse with its values and key order.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};

use super::*;

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z_.-]{0,12}",
        Just("process".to_owned()),
        Just("env".to_owned()),
        any::<String>(),
    ]
}

fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        any::<String>().prop_map(Value::String),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn arb_object() -> impl Strategy<Value = Value> {
    prop::collection::vec((arb_key(), arb_value()), 0..8)
        .prop_map(|pairs| Value::Object(pairs.into_iter().collect()))
}

/// Bytes that are often almost JSON, so that the parser gets past the first byte.
fn arb_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<Vec<u8>>(),
        "[{}\\[\\]\":,0-9a-z.eE+ \\\\-]{0,64}".prop_map(String::into_bytes),
        arb_object().prop_flat_map(|v| {
            let bytes = v.to_string().into_bytes();
            let len = bytes.len();
            (Just(bytes), 0..=len).prop_map(|(mut bytes, cut)| {
                bytes.truncate(cut);
                bytes
            })
        }),
    ]
}

proptest! {
    #[test]
    fn parse_never_panics(bytes in arb_bytes()) {
        if let Ok(doc) = SpecDoc::parse(&bytes) {
            // The views must not panic on whatever shape came in.
            let _ = (doc.env(), doc.env_var("NVIDIA_VISIBLE_DEVICES"), doc.mounts());
            let _ = (doc.annotations(), doc.is_privileged(), doc.root_path());
        }
        let _ = parse_state(&bytes);
    }

    #[test]
    fn object_round_trips_with_key_order(value in arb_object()) {
        let first = SpecDoc::parse(value.to_string().as_bytes()).expect("serde_json output parses");
        let bytes = first.to_vec().expect("to_vec");
        let second = SpecDoc::parse(&bytes).expect("our output parses");
        prop_assert_eq!(first.value(), second.value());
        prop_assert_eq!(first.value(), &value);
        // Map equality ignores order; the serialized forms do not.
        prop_assert_eq!(second.value().to_string(), value.to_string());
    }

    #[test]
    fn views_on_arbitrary_documents_never_panic(value in arb_object()) {
        let doc = SpecDoc::from_value(value).expect("an object");
        let _ = (doc.env(), doc.env_var("X"), doc.mounts(), doc.annotations());
        let _ = (doc.bounding_capabilities(), doc.is_privileged(), doc.root_path());
    }
}
