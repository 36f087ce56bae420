//! The module-graph and function-size check of `std-adapter/src` (CI runs it with the tests,
//! like `core/tests/layers.rs` for the core).
//!
//! Every top-level module of `ctxwin-std` belongs to one layer ([`LAYERS`], mirrored in
//! README's layout section). The check parses every `crate::…`, `super::…` and child-module
//! path in the non-test code of each file and fails on
//!
//! 1. an import from a higher layer,
//! 2. an import through the crate root's re-exports (`crate::Name`) instead of the module that
//!    defines the name,
//! 3. a cycle between files. A module using its own descendants (a parent assembling its type
//!    from its children's, or re-exporting them) owns them: that is not an edge. Everything
//!    else is: a child using its parent's items, siblings using each other.
//!
//! A second check fails on functions longer than [`MAX_FUNCTION_LINES`] lines (from `fn` to
//! the closing brace, test code left out) in `std-adapter/src`, `proxy/src` and `cli/src`.
//! The checks themselves are in `layers_check/`, which `proxy/tests/layers.rs` shares.

mod layers_check;

use std::collections::BTreeMap;
use std::path::Path;

use layers_check::{Module, check, layer_of, long_functions, long_functions_in, read_sources, top};

/// Layers, lowest first; a module may import from its own layer or a lower one.
const LAYERS: &[(&str, &[&str])] = &[
    ("vocabulary", &["message", "statefs"]),
    ("formats", &["format"]),
    ("storage", &["store"]),
    ("services", &["tokens", "llm", "embed"]),
    ("session", &["session"]),
];

/// The longest a function may be, in lines (data tables aside: none in `ctxwin-std`).
const MAX_FUNCTION_LINES: usize = 100;

#[test]
fn std_src_is_layered_and_acyclic() {
    let sources = read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for module in sources.keys().filter(|m| *m != "crate") {
        assert!(layer_of(LAYERS, top(module)).is_some(), "{module} has no layer in LAYERS");
    }
    let report = check(&sources, LAYERS);
    let problems = report.upward.len() + report.through_root.len() + report.cycles.len();
    assert!(
        problems == 0,
        "imports from a higher layer: {:#?}\nimports through the crate root: {:#?}\nfile cycles: {:#?}",
        report.upward,
        report.through_root,
        report.cycles
    );
}

#[test]
fn no_function_in_std_proxy_or_cli_is_over_100_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = long_functions_in(&root.join("src"), MAX_FUNCTION_LINES);
    for crate_dir in ["proxy/src", "cli/src"] {
        let dir = root.parent().unwrap().join(crate_dir);
        found.extend(long_functions_in(&dir, MAX_FUNCTION_LINES));
    }
    assert!(
        found.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (std-adapter, proxy, cli): {found:#?}"
    );
}

fn synthetic(files: &[(&str, &str)]) -> BTreeMap<Module, String> {
    files.iter().map(|(m, s)| ((*m).to_owned(), (*s).to_owned())).collect()
}

#[test]
fn the_check_finds_an_upward_import_and_a_sibling_cycle() {
    let report = check(
        &synthetic(&[
            ("crate", "pub mod store;\npub mod session;\n"),
            ("store", "use crate::session::Session;\n"),
            ("session", "use crate::store::ArchiveStore;\n"),
            ("session::tier", "use super::capacities::Small;\n"),
            ("session::capacities", "use super::tier::ServerManager;\n"),
        ]),
        LAYERS,
    );
    assert_eq!(report.upward, ["store (storage) -> session (session)"]);
    assert!(report.cycles.contains(&vec!["session".to_owned(), "store".to_owned()]));
    assert!(
        report.cycles.contains(&vec!["session::capacities".to_owned(), "session::tier".to_owned()])
    );
}

#[test]
fn the_check_finds_an_import_through_the_root_but_not_a_parent_owning_its_children() {
    let report = check(
        &synthetic(&[
            ("crate", "pub mod message;\npub mod session;\npub use message::ChatMessage;\n"),
            ("message", ""),
            ("session", "mod push;\nuse push::Options;\nstruct Session { o: Options }\n"),
            ("session::push", "use super::Session;\nuse crate::ChatMessage;\n"),
        ]),
        LAYERS,
    );
    assert_eq!(report.through_root, ["session::push: crate::ChatMessage"]);
    assert!(report.cycles.is_empty(), "{report:?}");
}

#[test]
fn tests_at_the_end_of_a_file_may_reach_anywhere() {
    let report = check(
        &synthetic(&[
            ("crate", ""),
            ("store", "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::session::S;\n}\n"),
            ("session", "use crate::store::f;\n"),
        ]),
        LAYERS,
    );
    assert!(report.upward.is_empty() && report.cycles.is_empty(), "{report:?}");
}

#[test]
fn long_functions_are_measured_from_fn_to_the_closing_brace() {
    let body = "    let x = \"}{\";\n".repeat(101);
    let source = format!(
        "pub fn long(a: u8)\n    -> u8\n{{\n{body}    '}}';\n}}\nfn short() {{ }}\nfn decl();\n"
    );
    let found = long_functions(&source, 100);
    assert_eq!(found, [("long".to_owned(), 1, 106)]);
    assert!(long_functions(&source, 106).is_empty());
    let lifetimes = "fn f<'a>(x: &'a str) -> &'a str {\n    x\n}\n";
    assert!(long_functions(lifetimes, 2).len() == 1);
    // `//` inside a string is not a comment: cut there, `a` would run into `b`.
    let urls = "fn a() {\n    let u = \"http://h\";\n}\nfn b() {\n    let v = \"https://g\";\n}\n";
    assert!(long_functions(urls, 3).is_empty(), "{:?}", long_functions(urls, 3));
}
