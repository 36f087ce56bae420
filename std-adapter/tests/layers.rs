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
//! A second check finds functions longer than [`MAX_FUNCTION_LINES`] lines (from `fn` to the
//! closing brace, test code left out) in `std-adapter/src` (a failure), and lists those of
//! `proxy/src` and `cli/src` (printed with `--nocapture`; the proxy's restructuring is another
//! change's work).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

/// A file, named by its module path (`session::push`; `crate` for lib.rs).
type Module = String;

/// The source files: module path → source.
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
                if parts.last().is_some_and(|p| p == "mod" || p == "lib" || p == "main") {
                    parts.pop();
                }
                let module = if parts.is_empty() { "crate".to_owned() } else { parts.join("::") };
                files.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    files
}

/// Code without comments and without the trailing `#[cfg(test)] mod …` (tests may reach
/// anywhere).
fn code_of(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]"
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

/// Files declared as `#[cfg(test)] mod name;` or under a feature only tests enable
/// (`#[cfg(any(test, …))]`): test code may reach anywhere.
fn test_only_modules(sources: &BTreeMap<Module, String>) -> BTreeSet<Module> {
    let mut test_only = BTreeSet::new();
    for (module, source) in sources {
        let lines: Vec<&str> = source.lines().collect();
        for pair in lines.windows(2) {
            let declared =
                pair[1].trim().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            let attribute = pair[0].trim();
            let test_attribute =
                attribute == "#[cfg(test)]" || attribute.starts_with("#[cfg(any(test,");
            if test_attribute
                && let Some(name) = declared.strip_prefix("mod ").and_then(|d| d.strip_suffix(';'))
            {
                test_only.insert(if module == "crate" {
                    name.to_owned()
                } else {
                    format!("{module}::{name}")
                });
            }
        }
    }
    let mut closed = test_only.clone();
    for module in sources.keys() {
        if test_only.iter().any(|parent| module.starts_with(&format!("{parent}::"))) {
            closed.insert(module.clone());
        }
    }
    closed
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

/// Whether `target` is `module` itself or one of its descendants (which `module` owns).
fn owned_by(target: &str, module: &str) -> bool {
    target == module || target.starts_with(&format!("{module}::"))
}

/// The files `line` of `module` names through its children's names, `crate::` or `super::`.
fn targets(
    files: &BTreeSet<Module>,
    module: &str,
    line: &str,
    report: &mut Report,
) -> BTreeSet<Module> {
    let mut found = BTreeSet::new();
    let own_path: Vec<String> = if module == "crate" {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    let mut parent = own_path.clone();
    parent.pop();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut search = line;
        while let Some(at) = search.find(prefix) {
            let before = search[..at].chars().next_back();
            let rest = &search[at + prefix.len()..];
            search = rest;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let segments = ident_chain(rest);
            if prefix == "crate::" && module != "crate" {
                let first = segments.first().copied().unwrap_or("{");
                if !files.contains(first) {
                    report.through_root.push(format!("{module}: crate::{first}"));
                    continue;
                }
                match (layer_of(top(module)), layer_of(first)) {
                    (Some(from), Some(to)) if to > from => report.upward.push(format!(
                        "{module} ({}) -> {first} ({})",
                        LAYERS[from].0, LAYERS[to].0
                    )),
                    (None, _) | (_, None) => {
                        report.upward.push(format!("{module} -> {first}: module without a layer"))
                    }
                    _ => {}
                }
            }
            found.extend(resolve(files, &base, &segments));
        }
    }
    found
}

fn check(sources: &BTreeMap<Module, String>) -> Report {
    let files: BTreeSet<Module> = sources.keys().cloned().collect();
    let test_only = test_only_modules(sources);
    let mut report = Report::default();
    for (module, source) in sources {
        if test_only.contains(module) {
            continue;
        }
        let mut edges = BTreeSet::new();
        for line in code_of(source).lines() {
            for target in targets(&files, module, line, &mut report) {
                if !owned_by(&target, module) && !test_only.contains(&target) {
                    edges.insert(target);
                }
            }
        }
        report.edges.insert(module.clone(), edges);
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

/// `source` with comments, string and character literals blanked (same length, newlines kept),
/// so that braces in them are not counted.
fn blank_literals(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in out.iter_mut().take(to).skip(from) {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let end = source[i + 2..].find("*/").map_or(bytes.len(), |n| i + 2 + n + 2);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"r\"") || rest.starts_with(b"r#") || rest.starts_with(b"br") {
            let start = i + usize::from(rest[0] == b'b') + 1;
            let hashes = bytes[start..].iter().take_while(|&&b| b == b'#').count();
            if bytes.get(start + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let closing = format!("\"{}", "#".repeat(hashes));
            let body = start + hashes + 1;
            let end =
                source[body..].find(&closing).map_or(bytes.len(), |n| body + n + closing.len());
            blank(&mut out, i, end);
            i = end;
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{7b}'), not a lifetime ('a).
            let len = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(2).position(|&b| b == b'\'').map(|n| n + 3)
            } else {
                let width = source[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(width + 2)
            };
            match len {
                Some(len) => {
                    blank(&mut out, i, i + len);
                    i += len;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `line` starts a function definition (after visibility and qualifiers).
fn starts_fn(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for prefix in ["pub(crate) ", "pub(super) ", "pub(in crate::session) ", "pub "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for qualifier in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(name[..end].to_owned())
}

/// Functions of `source` (test code left out) longer than `max` lines: (name, first line, lines).
fn long_functions(source: &str, max: usize) -> Vec<(String, usize, usize)> {
    let code = blank_literals(&code_of(source));
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let Some(name) = starts_fn(lines[at]) else {
            at += 1;
            continue;
        };
        // The body opens at the first `{` after the signature; a `;` first is a declaration.
        let mut depth = 0i64;
        let mut opened = false;
        let mut end = at;
        'scan: for (n, line) in lines.iter().enumerate().skip(at) {
            for c in line.chars() {
                match c {
                    ';' if !opened => break 'scan,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            end = n;
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        let length = end + 1 - at;
        if opened && length > max {
            found.push((name, at + 1, length));
        }
        // Functions nested in this one are looked at too.
        at += 1;
    }
    found
}

/// Long functions of every file under `dir`, as `file:line fn name (N lines)`.
fn long_functions_in(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).unwrap();
                let shown = path.strip_prefix(dir.parent().unwrap_or(dir)).unwrap_or(&path);
                for (name, line, lines) in long_functions(&source, MAX_FUNCTION_LINES) {
                    found.push(format!("{}:{line} fn {name} ({lines} lines)", shown.display()));
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn std_src_is_layered_and_acyclic() {
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

#[test]
fn no_function_in_std_is_over_100_lines_and_proxy_and_cli_are_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let std = long_functions_in(&root.join("src"));
    for crate_dir in ["proxy/src", "cli/src"] {
        let dir = root.parent().unwrap().join(crate_dir);
        let found = long_functions_in(&dir);
        println!("functions over {MAX_FUNCTION_LINES} lines in {crate_dir}: {}", found.len());
        for function in found {
            println!("  {function}");
        }
    }
    assert!(
        std.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines in std-adapter/src: {std:#?}"
    );
}

fn synthetic(files: &[(&str, &str)]) -> BTreeMap<Module, String> {
    files.iter().map(|(m, s)| ((*m).to_owned(), (*s).to_owned())).collect()
}

#[test]
fn the_check_finds_an_upward_import_and_a_sibling_cycle() {
    let report = check(&synthetic(&[
        ("crate", "pub mod store;\npub mod session;\n"),
        ("store", "use crate::session::Session;\n"),
        ("session", "use crate::store::ArchiveStore;\n"),
        ("session::tier", "use super::capacities::Small;\n"),
        ("session::capacities", "use super::tier::ServerManager;\n"),
    ]));
    assert_eq!(report.upward, ["store (storage) -> session (session)"]);
    assert!(report.cycles.contains(&vec!["session".to_owned(), "store".to_owned()]));
    assert!(
        report.cycles.contains(&vec!["session::capacities".to_owned(), "session::tier".to_owned()])
    );
}

#[test]
fn the_check_finds_an_import_through_the_root_but_not_a_parent_owning_its_children() {
    let report = check(&synthetic(&[
        ("crate", "pub mod message;\npub mod session;\npub use message::ChatMessage;\n"),
        ("message", ""),
        ("session", "mod push;\nuse push::Options;\nstruct Session { o: Options }\n"),
        ("session::push", "use super::Session;\nuse crate::ChatMessage;\n"),
    ]));
    assert_eq!(report.through_root, ["session::push: crate::ChatMessage"]);
    assert!(report.cycles.is_empty(), "{report:?}");
}

#[test]
fn tests_at_the_end_of_a_file_may_reach_anywhere() {
    let report = check(&synthetic(&[
        ("crate", ""),
        ("store", "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::session::S;\n}\n"),
        ("session", "use crate::store::f;\n"),
    ]));
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
}
