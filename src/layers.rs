//! The layering of docs/ARCHITECTURE.md, checked: every `crate::…` path in `src/` (outside
//! comments) is read, and a module may only use modules of its own layer or below, with no
//! circle between top-level modules. Inside `db/`, the engines use only the leaf `rows`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first (see docs/ARCHITECTURE.md, "Layers").
const LAYERS: &[(&str, &[&str])] = &[
    (
        "cross-cutting",
        &["failpoint", "telemetry", "shutdown", "exit"],
    ),
    ("core", &["config", "job", "door", "render"]),
    ("adapters", &["db", "broker", "smtp"]),
    (
        "loops",
        &["relay", "worker", "dlq", "status", "jobs", "overview"],
    ),
    ("faces", &["http", "console"]),
    ("wiring", &["startup"]),
    ("command line", &["cli"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments, which is all the house writes).
fn code_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => line[..at].to_string(),
            None => line.to_string(),
        })
        .collect()
}

/// Every `prefix<name>` in `line`: the module names a path starts with.
fn paths_after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    line.match_indices(prefix)
        .map(|(at, _)| {
            let rest = &line[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// (module, what it uses) for every top-level module of the crate.
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_str().unwrap().trim_end_matches(".rs").to_string();
        if ["lib", "main", "layers"].contains(&module.as_str()) {
            continue;
        }
        let used = uses.entry(module.clone()).or_default();
        for line in code_lines(&file) {
            for name in paths_after(&line, "crate::") {
                if name != module {
                    used.insert(name.to_string());
                }
            }
        }
    }
    uses
}

#[test]
fn every_module_belongs_to_a_layer() {
    let unplaced: Vec<_> = uses()
        .into_keys()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "{unplaced:?}: give each a layer in src/layers.rs and docs/ARCHITECTURE.md"
    );
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let mut wrong = Vec::new();
    for (module, used) in uses() {
        let Some(own) = layer_of(&module) else {
            continue;
        };
        for name in used {
            let Some(theirs) = layer_of(&name) else {
                continue;
            };
            // Cross-cutting modules are leaves: they use nothing of ours.
            if theirs > own || (own == 0 && theirs == 0) {
                wrong.push(format!(
                    "{module} ({}) uses {name} ({})",
                    LAYERS[own].0, LAYERS[theirs].0
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn no_two_top_level_modules_use_each_other_even_through_others() {
    let uses = uses();
    // Depth-first search from each module; a path back to it is a circle.
    for start in uses.keys() {
        let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
        let mut seen = BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = *path.last().unwrap();
            for next in uses.get(last).into_iter().flatten() {
                let mut longer = path.clone();
                longer.push(next.as_str());
                assert_ne!(next, start, "a circle: {}", longer.join(" → "));
                if seen.insert(next.as_str()) {
                    stack.push(longer);
                }
            }
        }
    }
}

#[test]
fn the_database_engines_use_only_the_shared_row_types() {
    let db = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/db");
    let mut files = Vec::new();
    rust_files(&db, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let name = file
            .strip_prefix(&db)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let engine = name.starts_with("postgres") || name.starts_with("mysql");
        // An engine's own submodule (postgres/group.rs) reaches its engine through `super::`.
        let submodule = name.contains('/');
        if !engine && name != "rows.rs" {
            continue;
        }
        for line in code_lines(&file) {
            let mut used = paths_after(&line, "crate::db::");
            if !submodule {
                used.extend(paths_after(&line, "super::"));
            }
            for module in used {
                if !engine || module != "rows" {
                    wrong.push(format!("db/{name} uses db::{module}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
