//! The module-graph check (CI runs it with the tests): `core/src` is built in strict layers.
//!
//! Every module of `core/src` belongs to one layer (the table [`LAYERS`], mirrored in README's
//! layout section). The check parses every `crate::…`, `super::…` and child-module path in the
//! non-test code of each file and fails on
//!
//! 1. an import from a higher layer,
//! 2. an import through the crate root's re-exports (`crate::Name`, `crate::{…}`) instead of
//!    the module that defines the name,
//! 3. any cycle between files (a `pub use child::…` re-export in a parent module is the
//!    parent's public facade, not a dependency of its code, so it is not an edge).
//!
//! It is stricter than `cargo modules dependencies --acyclic` (which only finds cycles) and
//! installs nothing. Its own tests feed it synthetic module maps to show that it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Layers, lowest first; a module may import from its own layer or a lower one.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &["fmt", "small", "role", "level"]),
    ("storage", &["ring", "header", "record", "capacity", "entities"]),
    (
        "model",
        &["message", "config", "error", "counter", "view", "json", "payload", "stats", "task"],
    ),
    ("policy", &["terms", "estimator", "reduce", "summarize", "strategy"]),
    ("engine", &["manager", "trim"]),
    ("snapshot", &["snapshot"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

/// A file, named by its module path (`manager::push`; `crate` for lib.rs).
type Module = String;

/// The source files: module path → non-test code.
fn read_sources(dir: &Path) -> BTreeMap<Module, String> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(dir).unwrap().with_extension("");
                let mut parts: Vec<String> =
                    rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                    parts.pop();
                }
                let module = if parts.is_empty() { "crate".to_owned() } else { parts.join("::") };
                files.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    files
}

/// Code without comments and without the trailing `#[cfg(test)] mod …` or
/// `#[cfg(all(test, …))] mod …` (tests may reach anywhere).
fn code_of(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if (trimmed == "#[cfg(test)]" || trimmed.starts_with("#[cfg(all(test,"))
            && lines.get(i + 1).is_some_and(|next| next.trim_start().contains("mod "))
        {
            break;
        }
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Files declared as `#[cfg(test)] mod name;` (test code may reach anywhere).
fn test_only_modules(sources: &BTreeMap<Module, String>) -> BTreeSet<Module> {
    let mut test_only = BTreeSet::new();
    for (module, source) in sources {
        let lines: Vec<&str> = source.lines().collect();
        for pair in lines.windows(2) {
            let declared =
                pair[1].trim().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            if pair[0].trim() == "#[cfg(test)]" {
                if let Some(name) = declared.strip_prefix("mod ").and_then(|d| d.strip_suffix(';'))
                {
                    test_only.insert(if module == "crate" {
                        name.to_owned()
                    } else {
                        format!("{module}::{name}")
                    });
                }
            }
        }
    }
    test_only
}

#[derive(Debug, Default)]
struct Report {
    upward: Vec<String>,
    through_root: Vec<String>,
    cycles: Vec<Vec<Module>>,
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

fn ident_chain(text: &str) -> Vec<&str> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(&rest[..end]);
        match rest[end..].strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    segments
}

/// The deepest file `base::segments…` names.
fn resolve(files: &BTreeSet<Module>, base: &[String], segments: &[&str]) -> Option<Module> {
    let mut path: Vec<String> = base.to_vec();
    let mut found = if base.is_empty() { None } else { Some(base.join("::")) };
    for segment in segments {
        path.push((*segment).to_owned());
        let name = path.join("::");
        if files.contains(&name) {
            found = Some(name);
        } else {
            break;
        }
    }
    found
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

fn check(sources: &BTreeMap<Module, String>) -> Report {
    let files: BTreeSet<Module> = sources.keys().cloned().collect();
    let test_only = test_only_modules(sources);
    let mut report = Report::default();
    for (module, source) in sources {
        if test_only.contains(module) {
            continue;
        }
        let code = code_of(source);
        let edges = report.edges.entry(module.clone()).or_default();
        let own_path: Vec<String> = if module == "crate" {
            Vec::new()
        } else {
            module.split("::").map(str::to_owned).collect()
        };
        let children: Vec<&Module> = files
            .iter()
            .filter(|f| {
                f.strip_prefix(module.as_str())
                    .and_then(|r| r.strip_prefix("::"))
                    .is_some_and(|r| !r.contains("::"))
                    || (module == "crate" && *f != "crate" && !f.contains("::"))
            })
            .collect();
        for line in code.lines() {
            let reexport = line.trim_start().starts_with("pub use ")
                || line.trim_start().starts_with("pub(crate) use ");
            // Paths to a child module written without a prefix (a parent's own children).
            for child in &children {
                let name = child.rsplit("::").next().unwrap_or(child);
                let needle = format!("{name}::");
                let mut search = line;
                while let Some(at) = search.find(&needle) {
                    let before = search[..at].chars().next_back();
                    if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                        && !reexport
                    {
                        edges.insert((*child).clone());
                    }
                    search = &search[at + needle.len()..];
                }
            }
            for (prefix, base) in [
                ("crate::", Vec::new()),
                ("super::", {
                    let mut parent = own_path.clone();
                    parent.pop();
                    parent
                }),
            ] {
                let mut search = line;
                while let Some(at) = search.find(prefix) {
                    let before = search[..at].chars().next_back();
                    let rest = &search[at + prefix.len()..];
                    search = rest;
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                        continue;
                    }
                    let segments = ident_chain(rest);
                    let target = resolve(&files, &base, &segments);
                    if prefix == "crate::" && module != "crate" {
                        let first = segments.first().copied().unwrap_or("{");
                        if !files.contains(first) {
                            report.through_root.push(format!("{module}: crate::{first}"));
                            continue;
                        }
                        let (from, to) = (layer_of(top(module)), layer_of(first));
                        match (from, to) {
                            (Some(from), Some(to)) if to > from => report.upward.push(format!(
                                "{module} ({}) -> {first} ({})",
                                LAYERS[from].0, LAYERS[to].0
                            )),
                            (None, _) | (_, None) => report
                                .upward
                                .push(format!("{module} -> {first}: module without a layer")),
                            _ => {}
                        }
                    }
                    match target {
                        Some(target) if &target != module => {
                            let is_child_facade =
                                reexport && target.starts_with(&format!("{module}::"));
                            if !is_child_facade {
                                edges.insert(target);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    report.cycles = cycles(&report.edges);
    report
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let i = self.index.len();
            self.index.insert(node, i);
            self.low.insert(node, i);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn core_src_is_layered_and_acyclic() {
    let sources = read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for module in sources.keys().filter(|m| *m != "crate") {
        assert!(layer_of(top(module)).is_some(), "{module} has no layer in LAYERS");
    }
    let report = check(&sources);
    let problems = report.upward.len() + report.through_root.len() + report.cycles.len();
    assert!(
        problems == 0,
        "imports from a higher layer: {:#?}\nimports through the crate root: {:#?}\nfile cycles: {:#?}",
        report.upward,
        report.through_root,
        report.cycles
    );
}

fn synthetic(files: &[(&str, &str)]) -> BTreeMap<Module, String> {
    files.iter().map(|(m, s)| ((*m).to_owned(), (*s).to_owned())).collect()
}

#[test]
fn the_check_finds_an_upward_import() {
    let report = check(&synthetic(&[
        ("crate", "pub mod ring;\npub mod manager;\n"),
        ("ring", "use crate::manager::State;\n"),
        ("manager", "use crate::ring::Ring;\n"),
    ]));
    assert_eq!(report.upward, ["ring (storage) -> manager (engine)"]);
    assert_eq!(report.cycles, [vec!["manager".to_owned(), "ring".to_owned()]]);
}

#[test]
fn the_check_finds_an_import_through_the_root() {
    let report = check(&synthetic(&[
        ("crate", "pub mod level;\npub mod config;\npub use level::Level;\n"),
        ("level", ""),
        ("config", "use crate::Level;\nuse crate::{level::Level};\n"),
    ]));
    assert_eq!(report.through_root, ["config: crate::Level", "config: crate::{"]);
    assert!(report.upward.is_empty() && report.cycles.is_empty());
}

#[test]
fn the_check_finds_a_cycle_inside_a_module_but_not_through_a_facade() {
    let report = check(&synthetic(&[
        ("crate", "pub mod manager;\n"),
        ("manager", "mod push;\npub use push::bit;\nfn f() { evict::x(); }\n"),
        ("manager::push", "use super::State;\n"),
        ("manager::evict", "use super::State;\n// use super::push::bit; (a comment)\n"),
    ]));
    assert_eq!(report.cycles, [vec!["manager".to_owned(), "manager::evict".to_owned()]]);
    assert!(report.upward.is_empty() && report.through_root.is_empty());
}

#[test]
fn tests_at_the_end_of_a_file_may_reach_anywhere() {
    let report = check(&synthetic(&[
        ("crate", ""),
        ("ring", "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::manager::State;\n}\n"),
        (
            "level",
            "fn g() {}\n#[cfg(all(test, feature = \"x\"))]\nmod tests {\n    use crate::manager::State;\n}\n",
        ),
        ("manager", "use crate::ring::f;\nuse crate::level::g;\n"),
    ]));
    assert!(report.upward.is_empty() && report.cycles.is_empty(), "{report:?}");
}
