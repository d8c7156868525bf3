//! Tidy checks over the whole tree, in the spirit of rust-analyzer's: each one turns an
//! "Architecture invariant" of ARCHITECTURE.md into a test that names the offending line.
//!
//! - The leaf crates (`proto`, `pgwal`, `quorum`) do no I/O: only allowed dependencies, and
//!   no source line that reaches files, sockets, processes, threads or (for the consensus
//!   core) clocks. Every service depends on them and their decoders and state machines are
//!   fuzzed and simulated in isolation; I/O there would leak into all of them.
//! - The storage engine (`layerstore`) knows nothing of PostgreSQL: no dependency on a crate
//!   that does, and no source line that names WAL, PostgreSQL or the services above it.
//! - Modules form no cycles in the engine and the pageserver, and the pageserver's PostgreSQL
//!   data path (`pgdata`) never calls its service layer.
//! - The docs list what the tree holds: every workspace crate has a README and appears in
//!   ARCHITECTURE.md's code map and README.md's layout table; every script is named in both.

use std::fs;
use std::path::{Path, PathBuf};

/// The repository root, from cargo at run time (a test binary reused from another
/// checkout's build must not look at that checkout).
fn root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    dir.parent().expect("tidy/ has a parent").to_path_buf()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The names in a manifest's `[dependencies]` section.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut in_deps = false;
    let mut names = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && !line.is_empty() && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                names.push(name.trim().trim_end_matches(".workspace").to_string());
            }
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display())) {
        let path = entry.expect("read a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `(file:line: line)` of `krate/src` whose code (comments excluded) contains one of
/// `needles`.
fn source_lines_using(krate: &str, needles: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root().join(krate).join("src"), &mut files);
    assert!(!files.is_empty(), "{krate}/src has no Rust files");
    let mut hits = Vec::new();
    for path in files {
        for (i, line) in read(&path).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in needles {
                if code.contains(needle) {
                    hits.push(format!("{}:{}: {needle}: {}", path.display(), i + 1, line.trim()));
                }
            }
        }
    }
    hits
}

const IO_PATHS: &[&str] = &["std::fs", "std::net", "tokio", "std::process", "std::os::unix::net", "std::thread", "std::io::stdin"];

/// The leaf crates: their allowed dependencies and what their sources must not use.
const LEAF_CRATES: &[(&str, &[&str], &[&str])] = &[
    ("proto", &["thiserror", "serde", "bytes", "crc32c", "hex"], IO_PATHS),
    ("pgwal", &["proto", "thiserror", "bytes", "crc32c", "lz4_flex", "zstd"], IO_PATHS),
    // The consensus core also reads no clock and draws no randomness: time and choices come
    // in as inputs, so a seeded simulation replays any run exactly.
    (
        "quorum",
        &["proto", "bytes", "thiserror"],
        &["std::fs", "std::net", "tokio", "std::process", "std::thread", "Instant", "SystemTime", "rand::"],
    ),
    // The compute's caches: the extension's shared-memory data structures without pgrx; the
    // extension does the I/O and provides the memory and the locks.
    (
        "compute_caches",
        &["crc32c"],
        &[
            "std::fs",
            "std::net",
            "tokio",
            "std::process",
            "std::os::unix::net",
            "std::thread",
            "std::io::stdin",
            "Instant",
            "SystemTime",
            "pgrx",
        ],
    ),
];

#[test]
fn leaf_crates_depend_on_no_io_crates() {
    for (krate, allowed, _) in LEAF_CRATES {
        for dep in dependencies(&read(&root().join(krate).join("Cargo.toml"))) {
            assert!(
                allowed.contains(&dep.as_str()),
                "{krate} must stay a leaf crate: dependency {dep:?} is not on its allowed list {allowed:?}"
            );
        }
    }
}

#[test]
fn leaf_crates_do_no_io() {
    let mut violations = Vec::new();
    for (krate, _, forbidden) in LEAF_CRATES {
        violations.extend(source_lines_using(krate, forbidden));
    }
    assert!(violations.is_empty(), "leaf crates must stay free of I/O:\n{}", violations.join("\n"));
}

#[test]
fn the_storage_engine_depends_on_nothing_that_knows_postgres() {
    for dep in dependencies(&read(&root().join("layerstore/Cargo.toml"))) {
        assert!(
            !["pgwal", "pageserver", "pageserver_api", "safekeeper", "walproposer"].contains(&dep.as_str()),
            "layerstore must not depend on {dep}"
        );
    }
}

#[test]
fn the_storage_engine_names_nothing_above_it() {
    let mut files = Vec::new();
    rust_files(&root().join("layerstore/src"), &mut files);
    let mut found = Vec::new();
    for path in files {
        for (i, line) in read(&path).lines().enumerate() {
            let lower = line.to_lowercase();
            // "wal" as a word (also inside snake_case names, so "walk" passes); the rest anywhere.
            let wal = lower.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "wal");
            let other = ["postgres", "pgwal", "page service", "page_service", "getpage", "basebackup", "safekeeper"]
                .into_iter()
                .find(|w| lower.contains(w));
            if let Some(word) = other.or(wal.then_some("wal")) {
                found.push(format!("{}:{}: {word}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "the engine names what it must not know:\n{}", found.join("\n"));
}

/// The workspace members, from the root manifest's `members` list.
fn workspace_members() -> Vec<String> {
    let manifest = read(&root().join("Cargo.toml"));
    let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("a members list");
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn every_crate_has_a_readme_and_is_in_the_maps() {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    let readme = read(&root().join("README.md"));
    let members = workspace_members();
    assert!(members.len() >= 10, "found only {members:?}");
    for member in members {
        assert!(root().join(&member).join("README.md").is_file(), "{member}/ has no README.md");
        let entry = format!("`{member}/`");
        assert!(architecture.contains(&entry), "ARCHITECTURE.md's code map does not mention {entry}");
        assert!(readme.contains(&entry), "README.md's layout table does not mention {entry}");
    }
}

#[test]
fn every_script_is_named_in_the_docs() {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    let readme = read(&root().join("README.md"));
    for entry in fs::read_dir(root().join("scripts")).expect("list scripts/") {
        let path = entry.expect("read a directory entry").path();
        if !path.is_file() {
            continue;
        }
        let name = format!("`{}`", path.file_name().expect("a file name").to_string_lossy());
        assert!(architecture.contains(&name), "ARCHITECTURE.md does not name the script {name}");
        assert!(readme.contains(&name), "README.md does not name the script {name}");
    }
}

/// The module a source file of `krate/src` belongs to, for the dependency graph: the first
/// path component, or the first two under one of `layers` (the pageserver's `pgdata` and
/// `service`). `None` for the crate root and binaries, which may use anything.
fn module_of(rel: &Path, layers: &[&str]) -> Option<String> {
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    match parts.as_slice() {
        [first, ..] if first == "lib" || first == "main" || first == "bin" => None,
        [layer, module, ..] if layers.contains(&layer.as_str()) && module != "mod" => Some(format!("{layer}::{module}")),
        [layer, ..] if layers.contains(&layer.as_str()) => None,
        [first, ..] => Some(first.clone()),
        [] => None,
    }
}

/// Edges `module -> module` of `krate` from `crate::` paths in non-test code: a file named
/// `tests.rs` is skipped, and so is everything after a `#[cfg(test)]` line (tests sit at
/// the end of a file here), because a test may use the whole crate.
fn module_graph(krate: &str, layers: &[&str]) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = root().join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for path in files {
        let rel = path.strip_prefix(&src).expect("under src");
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let Some(from) = module_of(rel, layers) else { continue };
        for line in read(&path).lines().take_while(|l| l.trim() != "#[cfg(test)]") {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let rest: Vec<&str> = code[i + "crate::".len()..].split("::").take(2).collect();
                let word = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
                let first = word(rest[0]);
                let to = if layers.contains(&first.as_str()) {
                    match rest.get(1).map(|s| word(s)) {
                        Some(m) if !m.is_empty() => format!("{first}::{m}"),
                        _ => continue,
                    }
                } else {
                    first
                };
                if to != from && !to.is_empty() {
                    graph.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    graph
}

/// A cycle in `graph`, if it has one.
fn find_cycle(graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = Default::default();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_storage_engine_and_the_pageserver_have_no_module_cycles() {
    for (krate, layers) in [("layerstore", &[][..]), ("pageserver", &["pgdata", "service"][..])] {
        let graph = module_graph(krate, layers);
        assert!(graph.len() >= 4, "{krate}: found too few modules: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{krate} has a module cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_postgres_data_path_never_calls_the_service() {
    let graph = module_graph("pageserver", &["pgdata", "service"]);
    for (from, tos) in &graph {
        if from.starts_with("pgdata::") {
            let up: Vec<_> = tos.iter().filter(|t| t.starts_with("service::")).collect();
            assert!(up.is_empty(), "{from} uses {up:?}: the data path must not call the service");
        }
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut g: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&g), Some(vec!["a".to_string(), "b".into(), "c".into(), "a".into()]));
}
