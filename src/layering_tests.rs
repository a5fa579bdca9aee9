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
