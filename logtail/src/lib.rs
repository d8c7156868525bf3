//! The last lines of a log file, for error messages: when a process that fjord supervises
//! (postgres under compute_ctl; the pageserver, safekeepers and compute_ctl under the `fjord`
//! CLI) exits during start-up, the error shows the end of its log, so the user sees why
//! without opening the file.
//!
//! One function, in a crate of its own because both supervisors need it and neither may link
//! the other. It never fails: a log that cannot be read becomes a line saying so, since it
//! only ever decorates another error.

use std::path::Path;

/// The last `lines` lines of the file at `path` (invalid UTF-8 replaced), or a note that it
/// could not be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&path, 2), "c\nd");
        assert_eq!(log_tail(&path, 10), "a\nb\nc\nd");
        assert_eq!(log_tail(&path, 0), "");
        std::fs::write(&path, b"ok\n\xff\xfe\n").unwrap();
        assert_eq!(log_tail(&path, 1), "\u{fffd}\u{fffd}");
        assert!(log_tail(&dir.path().join("missing"), 2).contains("could not read"));
    }
}
