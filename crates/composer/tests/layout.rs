//! The layout rules the tree keeps, checked on its source:
//! - no circle among the files of one crate: a file names what it uses by
//!   the module that defines it, and no two files use each other, however
//!   indirectly (a crate root that only declares and re-exports is a leaf);
//! - every module a file declares is in that file's module map (its `//!`
//!   lines name it);
//! - the pure core reads no clock: whoever calls it passes the time;
//! - no source file is over `MAX_FILE_LINES` lines and no function over
//!   `MAX_FN_LINES`, outside tests, but for the exceptions
//!   docs/architecture.md names with their reasons (and an exception that
//!   is no longer over must leave that list).

#![allow(clippy::unwrap_used)] // a test fails by panicking

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The crates of the workspace, by directory.
fn crates() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<PathBuf> =
        fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("src").is_dir()).collect();
    dirs.sort();
    dirs
}

/// Every `.rs` file under `src`, by the module path it is.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().to_string()).collect();
            if matches!(parts.last().map(String::as_str), Some("lib" | "main" | "mod")) {
                parts.pop();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The code of a file without its unit tests, comments and string contents.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut prev = ' ';
        for c in line.chars() {
            if in_string {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_string = false;
                    out.push('"');
                }
                continue;
            }
            if c == '/' && prev == '/' {
                out.pop();
                break;
            }
            if c == '"' {
                in_string = true;
            }
            out.push(c);
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// The paths a file's code names from its own crate: `crate::a::b`,
/// `super::c`, `self::d`, each name of a `use …::{x, y::z}` group, and
/// paths into the modules the file itself declares (`mod e;` … `e::f`).
fn references(from: &Module, code: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for line in code.lines() {
        let decl = line.trim().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
        let Some(child) = decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(';')) else { continue };
        let used = code.match_indices(&format!("{child}::")).any(|(i, _)| {
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':')
        });
        if used {
            let mut path = from.clone();
            path.push(child.to_string());
            out.push(path);
        }
    }
    for anchor in ["crate::", "super::", "self::"] {
        let mut at = 0;
        while let Some(i) = code[at..].find(anchor) {
            let start = at + i;
            at = start + anchor.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let mut base: Module = match anchor {
                "crate::" => Vec::new(),
                "super::" => from[..from.len().saturating_sub(1)].to_vec(),
                _ => from.clone(),
            };
            let rest = &code[at..];
            // `super::super::…`
            let mut rest = rest;
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for name in group.split(',') {
                    let mut path = base.clone();
                    path.extend(name.trim().split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
                    out.push(path);
                }
                continue;
            }
            let mut path = base;
            for segment in rest.split("::") {
                let name: String = segment.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if name.is_empty() {
                    break;
                }
                let whole = name.len() == segment.len();
                path.push(name);
                if !whole {
                    break;
                }
            }
            out.push(path);
        }
    }
    out
}

/// The module a path lands in: its longest prefix that is a file.
fn resolve(path: &Module, modules: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| modules.contains_key(m))
}

/// A circle of the graph, if it has one.
fn circle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match marks.get(m) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|s| s == m).unwrap();
                return Some(stack[from..].to_vec());
            }
            None => {}
        }
        marks.insert(m.clone(), Mark::Open);
        stack.push(m.clone());
        for next in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, edges, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(m.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    edges.keys().find_map(|m| visit(m, edges, &mut marks, &mut Vec::new()))
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "the crate root".into()
    } else {
        m.join("/")
    }
}

#[test]
fn no_two_files_of_a_crate_use_each_other() {
    let mut circles = Vec::new();
    for krate in crates() {
        let modules = modules(&krate.join("src"));
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (m, path) in &modules {
            let code = code(&fs::read_to_string(path).unwrap());
            let uses = edges.entry(m.clone()).or_default();
            for r in references(m, &code) {
                if let Some(target) = resolve(&r, &modules) {
                    if &target != m {
                        uses.insert(target);
                    }
                }
            }
        }
        if let Some(c) = circle(&edges) {
            let names: Vec<String> = c.iter().map(name).collect();
            circles.push(format!("{}: {} -> {}", krate.display(), names.join(" -> "), names[0]));
        }
    }
    assert!(circles.is_empty(), "files that use each other:\n{}", circles.join("\n"));
}

#[test]
fn every_module_is_in_the_module_map_of_the_file_that_declares_it() {
    let mut missing = Vec::new();
    for krate in crates() {
        for path in modules(&krate.join("src")).values() {
            let text = fs::read_to_string(path).unwrap();
            let map: String = text.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
            for line in text.lines() {
                let decl = line.trim_start_matches("pub ").trim_start_matches("pub(crate) ");
                let Some(module) = decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(';')) else { continue };
                if module == "tests" {
                    continue;
                }
                if !map.contains(&format!("`{module}`")) && !map.contains(&format!("[`{module}`]")) {
                    missing.push(format!("{}: mod {module}", path.display()));
                }
            }
        }
    }
    assert!(missing.is_empty(), "modules missing from their module map (the `//!` lines):\n{}", missing.join("\n"));
}

#[test]
fn the_pure_core_reads_no_clock() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
    let mut reads = Vec::new();
    for (m, path) in modules(&src) {
        if m.last().is_some_and(|l| l == "tests") {
            continue;
        }
        let code = code(&fs::read_to_string(&path).unwrap());
        for clock in ["Utc::now(", "SystemTime::now(", "Instant::now(", "Local::now("] {
            if code.contains(clock) {
                reads.push(format!("{}: {clock}", path.display()));
            }
        }
    }
    assert!(reads.is_empty(), "the core reads a clock (take the time as an argument):\n{}", reads.join("\n"));
}

/// Most lines of a source file, its unit tests apart.
const MAX_FILE_LINES: usize = 800;

/// Most lines of a function, signature to closing brace.
const MAX_FN_LINES: usize = 80;

/// A file's text without its unit tests (a trailing `mod tests`).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |i| &text[..i])
}

/// The functions of rustfmt-formatted `text` over [`MAX_FN_LINES`], as
/// (name, first line, lines): a function ends at the first line that
/// closes a brace at the indentation it starts at.
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let mut words = trimmed
            .split_whitespace()
            .skip_while(|w| w.starts_with("pub") || matches!(*w, "const" | "async" | "unsafe" | "extern" | "\"C\""));
        if words.next() != Some("fn") {
            continue;
        }
        let name: String =
            words.next().unwrap_or("").chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // The signature ends at the first line ending in `{` (a body), `;`
        // (a declaration) or `}` (a body on one line).
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) else { continue };
        if end - i + 1 > MAX_FN_LINES {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
}

/// The exceptions to the size rule docs/architecture.md names: the first
/// cell of each row of its table between `<!-- size-exceptions -->` and
/// `<!-- /size-exceptions -->`, a file (`crates/…/x.rs`) or a function of
/// one (`crates/…/x.rs::name`), each with its reason.
fn size_exceptions() -> BTreeSet<String> {
    let doc = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md")).unwrap();
    let Some(start) = doc.find("<!-- size-exceptions -->") else { return BTreeSet::new() };
    let end = doc[start..].find("<!-- /size-exceptions -->").map_or(doc.len(), |e| start + e);
    doc[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn no_file_or_function_is_too_long_but_the_named_exceptions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut over = BTreeSet::new();
    for krate in crates() {
        for (m, path) in modules(&krate.join("src")) {
            if m.last().is_some_and(|l| l == "tests") {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            let text = without_tests(&text);
            let shown = path.canonicalize().unwrap();
            let shown = shown.strip_prefix(root.canonicalize().unwrap()).unwrap().display().to_string();
            let n = text.lines().count();
            if n > MAX_FILE_LINES {
                over.insert((shown.clone(), format!("{n} lines")));
            }
            for (name, line, n) in long_functions(text) {
                over.insert((format!("{shown}::{name}"), format!("{n} lines, from line {line}")));
            }
        }
    }
    let exceptions = size_exceptions();
    let unnamed: Vec<String> =
        over.iter().filter(|(what, _)| !exceptions.contains(what)).map(|(what, n)| format!("{what}: {n}")).collect();
    assert!(
        unnamed.is_empty(),
        "over {MAX_FILE_LINES} lines a file or {MAX_FN_LINES} a function (split it, or name it with its reason \
         in docs/architecture.md's size exceptions):\n{}",
        unnamed.join("\n")
    );
    let stale: Vec<&String> = exceptions.iter().filter(|e| !over.iter().any(|(what, _)| what == *e)).collect();
    assert!(stale.is_empty(), "size exceptions no longer over the limit (take them off the list): {stale:?}");
}

#[test]
fn the_checks_see_a_circle_and_a_missing_module() {
    let a: Module = vec!["a".into()];
    let b: Module = vec!["b".into()];
    let edges = BTreeMap::from([(a.clone(), BTreeSet::from([b.clone()])), (b.clone(), BTreeSet::from([a.clone()]))]);
    assert!(circle(&edges).is_some());
    let refs =
        references(&vec!["x".into(), "y".into()], "mod k;\nuse super::{z, w::q};\nlet v = crate::a::B::new(k::K);");
    assert!(refs.contains(&vec!["x".into(), "y".into(), "k".into()]), "{refs:?}");
    assert!(refs.contains(&vec!["x".into(), "z".into()]), "{refs:?}");
    assert!(refs.contains(&vec!["x".into(), "w".into(), "q".into()]), "{refs:?}");
    assert!(refs.contains(&vec!["a".into(), "B".into(), "new".into()]), "{refs:?}");
    assert_eq!(code("let s = \"crate::a\"; // crate::b\nx"), "let s = \"\"; \nx\n");
}

#[test]
fn the_size_check_measures_functions_by_their_closing_brace() {
    let body = "        x();\n".repeat(MAX_FN_LINES);
    let text = format!(
        "impl A {{\n    pub(crate) async fn long(\n        a: u8,\n    ) -> u8 {{\n{body}    }}\n\n    fn short() {{}}\n    fn decl();\n}}\n"
    );
    assert_eq!(long_functions(&text), vec![("long".to_string(), 2, MAX_FN_LINES + 4)]);
    assert_eq!(without_tests("a\n#[cfg(test)]\nmod tests {\n}\n"), "a\n");
}
