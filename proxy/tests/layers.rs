//! The module-graph and function-size check of `proxy/src` (CI runs it with the tests, like
//! `core/tests/layers.rs` and `std-adapter/tests/layers.rs`, whose checks it shares).
//!
//! Every top-level module of `ctxwin-proxy` belongs to one layer ([`LAYERS`]): what a request
//! meets last sits lowest (hashes, settings, formats, the conversation), the HTTP side on top
//! (errors and the upstream, the registry of conversations, answers, the request pipeline and
//! the layers around it, the router, the connections it is served on). The check fails on an import from a higher layer, an
//! import through the crate root's re-exports, a cycle between files, and a function over
//! [`MAX_FUNCTION_LINES`] lines.

#[path = "../../std-adapter/tests/layers_check/mod.rs"]
mod layers_check;

use std::path::Path;

use layers_check::{check, layer_of, long_functions_in, read_sources, top};

/// Layers, lowest first; a module may import from its own layer or a lower one.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &["hash", "pool", "config", "metrics", "wire", "parsed"]),
    ("answers", &["assemble"]),
    ("keys", &["keys"]),
    ("conversations", &["conv"]),
    ("edges", &["errors", "upstream"]),
    ("registry", &["app", "bills"]),
    ("responses", &["respond", "recall"]),
    ("requests", &["pipeline", "middleware"]),
    ("routes", &["routes"]),
    ("server", &["connections"]),
];

/// The longest a function may be, in lines.
const MAX_FUNCTION_LINES: usize = 100;

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn proxy_src_is_layered_and_acyclic() {
    let mut sources = read_sources(&src());
    // The binary (`main.rs`) is a crate of its own, a caller of the library.
    sources.insert("crate".into(), std::fs::read_to_string(src().join("lib.rs")).unwrap());
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
fn no_function_in_the_proxy_is_over_100_lines() {
    let found = long_functions_in(&src(), MAX_FUNCTION_LINES);
    assert!(found.is_empty(), "functions over {MAX_FUNCTION_LINES} lines: {found:#?}");
}

#[test]
fn the_check_finds_the_circle_the_proxy_had() {
    // conv.rs used server.rs's pool size while server.rs drove conv.rs.
    let sources = [
        ("crate", "pub mod conv;\npub mod app;\n"),
        ("conv", "fn f() { crate::app::workers(); }\n"),
        ("app", "use crate::conv::Conv;\n"),
    ];
    let sources = sources.iter().map(|(m, s)| ((*m).to_owned(), (*s).to_owned())).collect();
    let report = check(&sources, LAYERS);
    assert_eq!(report.upward, ["conv (conversations) -> app (registry)"]);
    assert_eq!(report.cycles, [vec!["app".to_owned(), "conv".to_owned()]]);
}
