//! Compiles the C half of the extension (the WAL redo process, `c/walredo.c`, and a read
//! replica's redo filter, `c/replica.c`) against the
//! server headers of the PostgreSQL we build, found through `pg_config`.
//!
//! `FJORD_PG_CONFIG` names that `pg_config` (scripts/setup sets it); without it, the first
//! `pg_config` on PATH is used. The WAL redo loop is C because it is a standalone-backend
//! bootstrap made of PostgreSQL internals, many of them macros, that no binding covers.

use std::process::Command;

fn pg_config(pg_config: &str, arg: &str) -> String {
    let out = Command::new(pg_config).arg(arg).output().unwrap_or_else(|e| panic!("cannot run {pg_config} {arg}: {e}"));
    assert!(out.status.success(), "{pg_config} {arg} failed");
    String::from_utf8(out.stdout).expect("pg_config prints UTF-8").trim().to_string()
}

fn main() {
    println!("cargo:rerun-if-env-changed=FJORD_PG_CONFIG");
    println!("cargo:rerun-if-changed=c/walredo.c");
    println!("cargo:rerun-if-changed=c/replica.c");
    println!("cargo:rerun-if-changed=c/replica_feedback.c");
    let pg_config_path = std::env::var("FJORD_PG_CONFIG").unwrap_or_else(|_| "pg_config".to_string());
    println!("cargo:rerun-if-changed={pg_config_path}");
    let include_server = pg_config(&pg_config_path, "--includedir-server");
    cc::Build::new()
        .file("c/walredo.c")
        .file("c/replica.c")
        .file("c/replica_feedback.c")
        .include(&include_server)
        // The flags PostgreSQL itself is built with that change semantics.
        .flag("-fwrapv")
        .flag("-fno-strict-aliasing")
        .flag_if_supported("-fexcess-precision=standard")
        .flag("-Wno-unused-parameter")
        .flag("-Wno-missing-field-initializers")
        .flag("-Wno-sign-compare")
        // ereport() expands to a comma expression that -Wextra flags.
        .flag("-Wno-unused-value")
        .compile("fjord_walredo");
}
