//! The architecture as a test: `lib.rs` lists the modules in floors (groups between
//! blank lines, lowest first) and a module uses only modules on floors below its own,
//! so no front end reaches into another's internals and nothing imports back up. Inside
//! a module, its children never use each other in a circle.

use std::path::Path;

use nvshim_testkit::layering::{floors_from_lib, scan};

fn src() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
}

#[test]
fn modules_use_only_lower_floors() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("read src/lib.rs");
    let floors = floors_from_lib(&lib);
    assert!(
        floors.len() > 5,
        "lib.rs lists its modules in floors: {floors:?}"
    );
    let graph = scan(src()).expect("scan src/");
    let violations = graph.floor_violations(&floors);
    assert!(
        violations.is_empty(),
        "modules using modules on their own floor or above (from → to): {violations:#?}\nfloors: {floors:?}"
    );
}

#[test]
fn no_module_circles() {
    let graph = scan(src()).expect("scan src/");
    assert!(graph.edges.len() > 100, "the scan sees the crate's imports");
    let cycles = graph.sibling_cycles();
    assert!(
        cycles.is_empty(),
        "modules that use each other in a circle: {cycles:#?}"
    );
}

/// STYLE: no source file over 600 lines, anywhere in the repository's Rust.
#[test]
fn no_source_file_over_600_lines() {
    fn walk(dir: &Path, out: &mut Vec<(String, usize)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let name = entry.file_name();
            if name == "target" || name.to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path).map_or(0, |t| t.lines().count());
                out.push((path.display().to_string(), lines));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src",
        "crates",
        "tests",
        "benches",
        "fuzz/src",
        "fuzz/fuzz_targets",
    ] {
        walk(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 100,
        "the walk sees the sources: {}",
        files.len()
    );
    let long: Vec<_> = files.iter().filter(|(_, n)| *n > 600).collect();
    assert!(long.is_empty(), "files over 600 lines: {long:#?}");
}
