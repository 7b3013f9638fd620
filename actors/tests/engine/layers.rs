//! The engine's layers, checked from its source: every module imports only from its own layer
//! or the layers before it, and only `exec` may hold an import circle among its files.
//!
//! Layers, in order: `model`, `workflow`, `core`, `persist`, `kinds`, `exec`, `service`,
//! `runtime`; the crate root (`lib.rs`) and `testkit.rs` sit above them all. A file belongs to
//! the layer of its top folder (`exec/body.rs`) or, for a layer's own file, its name
//! (`exec.rs`). Imports are read from the code with comments removed: every `crate::` path and
//! every `super::` path, resolved to the file that defines the module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: &[&str] = &[
    "model", "workflow", "core", "persist", "kinds", "exec", "service", "runtime",
];

/// The layer that may hold a circle among its files.
const CYCLES_ALLOWED: &str = "exec";

/// A source file, named by its module path (`["exec", "body"]`; `[]` is `lib.rs`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Module(Vec<String>);

impl Module {
    fn layer_rank(&self) -> usize {
        match self.0.first() {
            Some(top) => LAYERS.iter().position(|l| l == top).unwrap_or(LAYERS.len()),
            None => LAYERS.len(),
        }
    }

    fn layer(&self) -> &str {
        self.0.first().map_or("crate root", String::as_str)
    }

    /// Unit test modules (`foo/tests.rs`) and their helpers (`testing.rs`).
    fn is_test_only(&self) -> bool {
        self.0
            .last()
            .is_some_and(|last| last == "tests" || last == "testing")
    }

    fn name(&self) -> String {
        if self.0.is_empty() {
            "lib.rs".to_owned()
        } else {
            self.0.join("/") + ".rs"
        }
    }
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts == ["lib"] {
        parts.clear();
    }
    Module(parts)
}

/// The code with line comments, block comments and string literals blanked out.
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(text.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(text.len(), |n| i + n + 2);
            i = end;
        } else if rest.starts_with('"') {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Inline modules (`mod tests { ... }`): their names and the byte span of their bodies.
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("mod ") {
        let at = from + at;
        from = at + 4;
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[at + 4..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        let mut close = code.len();
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        spans.push((name, open..close));
    }
    spans
}

/// Every path the code names (`crate::a::b`, `super::x`, with `{a, b::c}` groups expanded),
/// each with the inline modules it sits in.
fn paths(code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let inline = inline_modules(code);
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let context: Vec<String> = inline
                .iter()
                .filter(|(_, span)| span.contains(&at))
                .map(|(name, _)| name.clone())
                .collect();
            let head = start.trim_end_matches(':').to_owned();
            let mut here = Vec::new();
            expand(&code[from..], vec![head], &mut here);
            found.extend(here.into_iter().map(|p| (context.clone(), p)));
        }
    }
    found
}

fn expand(rest: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    let mut rest = rest;
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let mut end = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                let inner = &group[..end];
                let mut depth = 0;
                let mut piece_start = 0;
                for (i, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            expand(inner[piece_start..i].trim(), path.clone(), out);
                            piece_start = i + 1;
                        }
                        _ => {}
                    }
                }
                expand(inner[piece_start..].trim(), path.clone(), out);
                return;
            }
            out.push(path);
            return;
        }
        rest = &rest[ident.len()..];
        path.push(ident);
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => {
                out.push(path);
                return;
            }
        }
    }
}

/// The file a path leads to: the deepest module of the path that is a file of the crate.
fn resolve(
    from: &Module,
    inline: &[String],
    path: &[String],
    files: &BTreeSet<Module>,
) -> Option<Module> {
    let mut at: Vec<String> = Vec::new();
    let mut steps = path.iter().peekable();
    match steps.next().map(String::as_str) {
        Some("crate") => {}
        Some("super") => {
            at = from.0.clone();
            at.extend(inline.iter().cloned());
            at.pop();
            while steps.peek().is_some_and(|s| s.as_str() == "super") {
                steps.next();
                at.pop();
            }
        }
        _ => return None,
    }
    // Inside an inline module of the file, the file itself is the nearest file.
    while !at.is_empty() && !files.contains(&Module(at.clone())) && at.len() > from.0.len() {
        at.pop();
    }
    let mut best = Module(at.clone());
    for step in steps {
        at.push(step.clone());
        let candidate = Module(at.clone());
        if files.contains(&candidate) {
            best = candidate;
        } else {
            break;
        }
    }
    Some(best)
}

fn import_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut list = Vec::new();
    source_files(&src, &mut list);
    let files: BTreeSet<Module> = list.iter().map(|f| module_of(&src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &list {
        let module = module_of(&src, file);
        if module.is_test_only() {
            // Unit tests sit beside their code and read it from below; they are not part of
            // the engine's structure.
            continue;
        }
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let code = code_only(&text);
        let mut targets = BTreeSet::new();
        // A file declaring `mod child;` depends on its child's file.
        for line in code.lines() {
            let line = line.trim_start();
            let decl = line
                .strip_prefix("pub(crate) mod ")
                .or_else(|| line.strip_prefix("pub mod "))
                .or_else(|| line.strip_prefix("mod "));
            if let Some(name) = decl.and_then(|d| d.strip_suffix(';')) {
                let mut child = module.0.clone();
                child.push(name.trim().to_owned());
                let child = Module(child);
                if !child.is_test_only() {
                    targets.insert(child);
                }
            }
        }
        for (inline, path) in paths(&code) {
            if let Some(target) = resolve(&module, &inline, &path, &files)
                && target != module
            {
                targets.insert(target);
            }
        }
        graph.insert(module, targets);
    }
    graph
}

#[test]
fn no_module_imports_a_later_layer() {
    let graph = import_graph();
    assert!(
        graph.keys().any(|m| m.layer() == "exec"),
        "the layer check found no source files"
    );
    let mut wrong = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if to.0.is_empty() && !from.0.is_empty() {
                wrong.push(format!(
                    "{} names a path through the crate root; import from the layer that defines it",
                    from.name()
                ));
            } else if to.layer_rank() > from.layer_rank() {
                wrong.push(format!(
                    "{} (layer {}) imports {} (layer {}, a later layer)",
                    from.name(),
                    from.layer(),
                    to.name(),
                    to.layer()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn only_exec_holds_an_import_circle() {
    let graph = import_graph();
    let reach = |from: &Module| -> BTreeSet<Module> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&Module> = graph.get(from).into_iter().flatten().collect();
        while let Some(m) = todo.pop() {
            if m.layer() == from.layer() && seen.insert(m.clone()) {
                todo.extend(graph.get(m).into_iter().flatten());
            }
        }
        seen
    };
    let mut circles: BTreeSet<Vec<String>> = BTreeSet::new();
    for module in graph.keys().filter(|m| m.layer() != CYCLES_ALLOWED) {
        let reached = reach(module);
        if reached.contains(module) {
            // The circle: every file this one reaches that reaches it back.
            let mut members: Vec<String> = reached
                .iter()
                .filter(|other| reach(other).contains(module))
                .map(Module::name)
                .collect();
            members.sort();
            circles.insert(members);
        }
    }
    let text: Vec<String> = circles.iter().map(|c| c.join(", ")).collect();
    assert!(
        circles.is_empty(),
        "import circles outside exec (files that import each other):\n{}",
        text.join("\n")
    );
}

#[test]
fn the_checker_sees_imports_and_groups() {
    let code = code_only(
        "use crate::model::{Value, path::NodePath};\n// use crate::exec::X;\nuse super::super::y::Z;",
    );
    let found: Vec<Vec<String>> = paths(&code).into_iter().map(|(_, p)| p).collect();
    assert!(found.contains(&vec!["crate".into(), "model".into(), "Value".into()]));
    assert!(found.contains(&vec![
        "crate".into(),
        "model".into(),
        "path".into(),
        "NodePath".into()
    ]));
    assert!(!found.iter().any(|p| p.contains(&"exec".to_owned())));
    assert!(found.contains(&vec![
        "super".into(),
        "super".into(),
        "y".into(),
        "Z".into()
    ]));
}
