// SPDX-License-Identifier: Apache-2.0
//! The `config.toml` the packages ship (`packaging/config.toml`): every key at its default,
//! nothing we do not know, and nothing but comments, tables and `key = value` lines.

use std::fs;
use std::path::Path;

#[test]
fn shipped_config_is_every_default_with_no_unknown_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/config.toml");
    let text = fs::read_to_string(&path).unwrap();
    let (config, unknown) = crate::config::parse(&text, &path).unwrap();
    assert_eq!(unknown, Vec::<String>::new(), "unknown keys");
    assert_eq!(config, crate::config::Config::default());
    for line in text.lines().map(str::trim) {
        let table = line.starts_with('[') && line.ends_with(']');
        let shape = line.is_empty() || line.starts_with('#') || table || line.contains(" = ");
        assert!(shape, "not a comment, table or key: {line:?}");
    }
}
