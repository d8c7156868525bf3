//! Tidy checks over the whole tree, in the spirit of rust-analyzer's: each one turns an
//! "Architecture invariant" of ARCHITECTURE.md into a test that names the offending line.
//!
//! - The leaf crates (`proto`, `pgwal`, `quorum`) do no I/O: only allowed dependencies, and
//!   no source line that reaches files, sockets, processes, threads or (for the consensus
//!   core) clocks. Every service depends on them and their decoders and state machines are
//!   fuzzed and simulated in isolation; I/O there would leak into all of them.
//! - The storage engine (`layerstore`) knows nothing of PostgreSQL: no dependency on a crate
//!   that does, and no source line that names WAL, PostgreSQL or the services above it.
//! - Modules form no cycles in any crate (`module_graph` says what an edge is and how parents
//!   and children count), and the pageserver's PostgreSQL data path (`pgdata`) never calls
//!   its service layer.
//! - Comments state rules in the present tense: no issue numbers, no dates (`comments`).
//! - No file holds a merge conflict's markers.
//! - The docs list what the tree holds: every workspace crate has a README and appears in
//!   ARCHITECTURE.md's code map and README.md's layout table; every script is named in both.

mod comments;
mod module_graph;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

/// Module cycles that are still allowed, each as its crate and the exact set of modules
/// that reach each other. Every other crate has none, a cycle that grows or is new fails,
/// and an entry that matches no cycle any more fails too, so that it is removed.
const MODULE_CYCLES_ALLOWED: &[(&str, &[&str])] = &[];

/// The crate roots of every workspace member, each read into its module tree, by member:
/// read once for all the checks that use them.
fn member_crates() -> &'static BTreeMap<String, Vec<(PathBuf, module_graph::Crate)>> {
    static CRATES: OnceLock<BTreeMap<String, Vec<(PathBuf, module_graph::Crate)>>> = OnceLock::new();
    CRATES.get_or_init(|| {
        workspace_members()
            .into_iter()
            .map(|member| {
                let roots = module_graph::crate_roots(&root().join(&member).join("src"));
                assert!(!roots.is_empty(), "{member}/src has no lib.rs, main.rs or bin/");
                let crates = roots.into_iter().map(|r| (r.clone(), module_graph::Crate::load(&module_graph::Disk, &r, &root()))).collect();
                (member, crates)
            })
            .collect()
    })
}

/// The library of a workspace member.
fn library(member: &str) -> &'static module_graph::Crate {
    let crates = &member_crates()[member];
    &crates.iter().find(|(file, _)| file.ends_with("src/lib.rs")).unwrap_or_else(|| panic!("{member} has no src/lib.rs")).1
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut cycles = Vec::new();
    let mut allowed_seen = vec![false; MODULE_CYCLES_ALLOWED.len()];
    for (member, crates) in member_crates() {
        for (file, krate) in crates {
            for (tangle, report) in module_graph::tangles_of(krate) {
                let allowed = MODULE_CYCLES_ALLOWED
                    .iter()
                    .position(|(k, set)| *k == member && set.len() == tangle.len() && set.iter().all(|m| tangle.contains(*m)));
                match allowed {
                    Some(i) => allowed_seen[i] = true,
                    None => cycles.push(format!("{}: {report}", file.strip_prefix(root()).unwrap_or(file).display())),
                }
            }
        }
    }
    for ((krate, set), seen) in MODULE_CYCLES_ALLOWED.iter().zip(allowed_seen) {
        if !seen {
            cycles.push(format!("{krate} no longer has the module cycle {set:?}: remove it from MODULE_CYCLES_ALLOWED"));
        }
    }
    assert!(cycles.is_empty(), "module cycles (move what both sides use into a leaf module):\n{}", cycles.join("\n"));
}

#[test]
fn the_module_graph_sees_the_engine_and_the_pageserver() {
    for member in ["layerstore", "pageserver"] {
        let edges = library(member).edges();
        assert!(edges.len() >= 10, "{member}: found too few edges: {:?}", edges.keys().collect::<Vec<_>>());
    }
}

#[test]
fn the_postgres_data_path_never_calls_the_service() {
    let up: Vec<String> = library("pageserver")
        .edges()
        .into_iter()
        .filter(|((from, to), _)| from.first().is_some_and(|m| m == "pgdata") && to.first().is_some_and(|m| m == "service"))
        .map(|((from, to), w)| format!("{} -> {}: {w}", module_graph::name(&from), module_graph::name(&to)))
        .collect();
    assert!(up.is_empty(), "the data path must not call the service:\n{}", up.join("\n"));
}

/// Every file under `dir` whose comments are checked, with its language. Build output
/// (`target`), hidden directories (but `.ci`), caches and fuzzing's own directories are
/// skipped, and so are symbolic links (`target/...` links into the cache).
fn commented_files(dir: &Path, out: &mut Vec<(PathBuf, comments::Language)>) {
    let mut files = Vec::new();
    tree_files(dir, &mut files);
    out.extend(files.into_iter().filter_map(|path| {
        let lang = comments::language(path.strip_prefix(root()).expect("under the root"))?;
        Some((path, lang))
    }));
}

/// Every file under `dir` but in the directories [`commented_files`] skips.
fn tree_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display())) {
        let entry = entry.expect("read a directory entry");
        let (path, name, kind) = (entry.path(), entry.file_name().to_string_lossy().to_string(), entry.file_type().expect("a file type"));
        if kind.is_symlink() {
            continue;
        }
        if kind.is_dir() {
            let skipped = ["target", "__pycache__", "node_modules", "corpus", "artifacts", "seeds"].contains(&name.as_str())
                || (name.starts_with('.') && name != ".ci");
            if !skipped {
                tree_files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

#[test]
fn comments_state_rules_without_issue_numbers_or_dates() {
    let mut files = Vec::new();
    commented_files(&root(), &mut files);
    assert!(files.len() >= 100, "found only {} files with comments", files.len());
    let mut found = Vec::new();
    for (path, lang) in files {
        for (line, what, text) in comments::narrating(&comments::comments(lang, &read(&path))) {
            found.push(format!("{}:{line}: {what:?}: {text}", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "comments narrate history (state the rule and its reason instead; a decision that was not obvious goes to docs/decisions/):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_file_holds_a_merge_conflict() {
    // Built at run time, so that this file does not hold the markers it looks for.
    let (ours, theirs) = ("<".repeat(7) + " ", ">".repeat(7) + " ");
    let mut files = Vec::new();
    tree_files(&root(), &mut files);
    let mut found = Vec::new();
    for path in files.into_iter().filter(|p| fs::metadata(p).is_ok_and(|m| m.len() < 4 << 20)) {
        let Ok(text) = fs::read_to_string(&path) else { continue };
        for (i, line) in text.lines().enumerate() {
            if line.starts_with(&ours) || line.starts_with(&theirs) {
                found.push(format!("{}:{}: {line}", path.strip_prefix(root()).expect("under the root").display(), i + 1));
            }
        }
    }
    assert!(found.is_empty(), "merge conflict markers left in:\n{}", found.join("\n"));
}
