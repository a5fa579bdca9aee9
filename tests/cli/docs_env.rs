//! The docs against the code for the container's `NVIDIA_*` variables: every one that
//! `src/request` names (the module that reads a container's environment) has a row in
//! the variable table of `docs/runtime.md` (header cell `variable`), and every
//! `NVIDIA_*` name a row gives is one the code names. Fast: reads files only.

use std::collections::BTreeSet;
use std::path::Path;

use super::docs_flags::{code_spans, table_first_cells};

const PAGE: &str = "docs/runtime.md";

/// `NVIDIA_*` string constants in the non-test sources under `dir`. A name ending in `_`
/// is a prefix (`NVIDIA_REQUIRE_`), documented as `NVIDIA_REQUIRE_*`.
fn code_names(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            code_names(&path, out);
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy();
        if !name.ends_with(".rs") || name.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // Stop at an inline test module: its names are test data.
        let text = text.split("mod tests {").next().unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("const ")) {
            for literal in line.split('"').skip(1).step_by(2) {
                if literal.starts_with("NVIDIA_")
                    && literal
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    let shown = if literal.ends_with('_') {
                        format!("{literal}*")
                    } else {
                        literal.to_owned()
                    };
                    out.insert(shown);
                }
            }
        }
    }
}

#[test]
fn every_container_variable_is_in_the_runtime_page_and_no_other() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut code = BTreeSet::new();
    code_names(&repo.join("src/request"), &mut code);
    assert!(
        code.contains("NVIDIA_VISIBLE_DEVICES"),
        "the scan finds the constants: {code:?}"
    );

    let text = std::fs::read_to_string(repo.join(PAGE)).unwrap();
    let rows = table_first_cells(&text, "variable");
    assert!(
        !rows.is_empty(),
        "{PAGE} has a table whose first header cell is `variable`"
    );
    let mut documented = BTreeSet::new();
    for (line, cell) in &rows {
        for span in code_spans(cell)
            .into_iter()
            .filter(|s| s.starts_with("NVIDIA_"))
        {
            assert!(
                code.contains(span),
                "{PAGE}:{line}: `{span}` is not a variable the code reads (src/request names: {code:?})"
            );
            documented.insert(span.to_owned());
        }
    }
    let undocumented: Vec<_> = code.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "variables src/request reads but {PAGE}'s variable table lacks: {undocumented:?}"
    );
}
