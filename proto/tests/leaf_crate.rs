//! Enforces that `proto` stays the leaf crate: no async runtime, no sockets, no files.
//!
//! Every service and the extension depend on `proto`, and its decoders are fuzzed in
//! isolation; an I/O dependency here would leak into all of them. The check reads the
//! crate's own manifest and sources, so a violation fails `cargo test` with the offending
//! line rather than surfacing later as a design drift.

use std::fs;
use std::path::Path;

const ALLOWED_DEPENDENCIES: &[&str] = &["thiserror", "serde", "bytes", "crc32c", "hex"];
const FORBIDDEN_PATHS: &[&str] = &["std::fs", "std::net", "tokio", "std::process", "std::os::unix::net"];

fn dependencies_section(manifest: &str) -> Vec<String> {
    let mut in_deps = false;
    let mut names = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
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

/// The crate's directory, from cargo at run time (a test binary reused from another
/// checkout's build must not look at that checkout).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn proto_depends_on_no_io_crates() {
    let dir = &manifest_dir();
    let manifest = fs::read_to_string(dir.join("Cargo.toml")).expect("read proto/Cargo.toml");
    for dep in dependencies_section(&manifest) {
        assert!(
            ALLOWED_DEPENDENCIES.contains(&dep.as_str()),
            "proto must stay free of I/O: dependency {dep:?} is not on the allowed list {ALLOWED_DEPENDENCIES:?}"
        );
    }
}

#[test]
fn proto_sources_use_no_io() {
    fn visit(dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).expect("read proto/src") {
            let path = entry.expect("read dir entry").path();
            if path.is_dir() {
                visit(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).expect("read source file");
                for (i, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    for bad in FORBIDDEN_PATHS {
                        if code.contains(bad) {
                            out.push(format!("{}:{}: uses {bad}", path.display(), i + 1));
                        }
                    }
                }
            }
        }
    }
    let mut violations = Vec::new();
    visit(&manifest_dir().join("src"), &mut violations);
    assert!(violations.is_empty(), "proto must stay free of I/O:\n{}", violations.join("\n"));
}
