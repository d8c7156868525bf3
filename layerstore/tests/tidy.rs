//! Tidy checks for the architecture invariant of this crate: the engine knows nothing of
//! the database above it. They fail on a dependency on the WAL decoder and on a source file
//! that names the database's log, the database, or the service that serves its pages, so
//! that the boundary is kept by a test instead of by a sentence in ARCHITECTURE.md.

use std::path::Path;

/// Words that belong to the layers above the engine (matched case-insensitively: "wal" as
/// a word, so that "walk" passes, the others anywhere in a line).
const FOREIGN_WORDS: &[&str] = &["wal", "postgres", "pgwal", "page service", "page_service", "getpage", "basebackup", "safekeeper"];

fn words(line: &str) -> Vec<String> {
    line.to_lowercase().split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_string).collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn depends_on_no_database_specific_crate() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    for line in manifest.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let name = line.split(['=', '.', ' ']).next().unwrap_or("");
        assert!(!["pgwal", "pageserver", "safekeeper", "walproposer"].contains(&name), "layerstore must not depend on {name}");
    }
}

#[test]
fn no_source_file_names_the_layers_above() {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.len() > 10, "found only {} source files", files.len());
    let mut found = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let ws = words(line);
            for foreign in FOREIGN_WORDS {
                // "wal" as a word (also inside snake_case names); the rest anywhere.
                let hit = if *foreign == "wal" { ws.iter().any(|w| w == foreign) } else { lower.contains(foreign) };
                if hit {
                    found.push(format!("{}:{}: {foreign}: {line}", path.display(), i + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "the engine names what it must not know:\n{}", found.join("\n"));
}
