//! The graph reader on small crates held in memory.

use super::*;

/// A crate of `files` (path under `src/`, text), rooted at `src/lib.rs`.
fn krate(files: &[(&str, &str)]) -> Crate {
    let source: BTreeMap<PathBuf, String> = files.iter().map(|(p, t)| (Path::new("src").join(p), t.to_string())).collect();
    Crate::load(&source, Path::new("src/lib.rs"), Path::new(""))
}

fn edge_names(k: &Crate) -> Vec<String> {
    k.edges().keys().map(|(a, b)| format!("{} -> {}", name(a), name(b))).collect()
}

fn cycles(k: &Crate) -> Vec<String> {
    tangles_of(k).into_iter().map(|(_, report)| report.lines().next().unwrap_or_default().to_string()).collect()
}

#[test]
fn crate_super_self_child_and_imported_paths_are_edges() {
    let k = krate(&[
        ("lib.rs", "mod a; mod b; pub mod store;"),
        ("a.rs", "pub fn f() { crate::b::g(); }"),
        ("b.rs", "pub fn g() {}"),
        // nested modules, in a directory and in the file of their parent
        ("store/mod.rs", "mod wal; mod journal; pub mod nested { pub fn h() { super::wal::w(); } }\npub fn s() { wal::w(); }"),
        ("store/wal.rs", "use super::journal::Writer;\npub fn w() { let _ = Writer; self::inner(); }\nfn inner() { let _ = crate::a::f; }"),
        ("store/journal.rs", "pub struct Writer;\npub fn j() { format!(\"{:?}\", crate::b::g()); }"),
    ]);
    assert_eq!(
        edge_names(&k),
        [
            "crate::a -> crate::b",
            "crate::store -> crate::store::wal",
            "crate::store::journal -> crate::b",
            "crate::store::nested -> crate::store::wal",
            "crate::store::wal -> crate::a",
            "crate::store::wal -> crate::store::journal",
        ]
    );
    assert!(cycles(&k).is_empty());
}

#[test]
fn a_cycle_between_nested_siblings_through_super_is_found() {
    let k = krate(&[
        ("lib.rs", "pub mod storage;"),
        ("storage/mod.rs", "mod wal; mod removal;"),
        ("storage/wal.rs", "pub struct Extent; pub fn remove() { super::removal::removable(); }"),
        ("storage/removal.rs", "use super::wal::Extent;\npub fn removable() -> Option<Extent> { None }"),
    ]);
    assert_eq!(cycles(&k), ["crate::storage::removal -> crate::storage::wal -> crate::storage::removal"]);
    let (_, report) = &tangles_of(&k)[0];
    assert!(report.contains("src/storage/wal.rs:1: super::removal::removable"), "{report}");
    assert!(report.contains("src/storage/removal.rs:1: super::wal::Extent"), "{report}");
}

#[test]
fn edges_deep_in_two_subtrees_make_a_cycle_of_the_subtrees() {
    let k = krate(&[
        ("lib.rs", "mod a; mod b;"),
        ("a/mod.rs", "mod x;"),
        ("a/x.rs", "fn f() { crate::b::y::g(); }"),
        ("b/mod.rs", "pub mod y; mod z;"),
        ("b/y.rs", "pub fn g() {}"),
        ("b/z.rs", "fn h() { let _ = crate::a::x::f; }"),
    ]);
    assert_eq!(cycles(&k), ["crate::a -> crate::b -> crate::a"]);
}

#[test]
fn the_crate_root_that_modules_share_items_with_is_in_the_cycle() {
    let k = krate(&[
        ("lib.rs", "mod core;\npub struct Shared;\npub fn start() { core::run(); }"),
        ("core.rs", "use crate::Shared;\npub fn run() { let _ = Shared; }"),
    ]);
    assert_eq!(cycles(&k), ["crate (own items) -> crate::core -> crate (own items)"]);
}

#[test]
fn a_re_export_leads_to_the_module_that_defines_the_item() {
    let k = krate(&[
        ("lib.rs", "mod core; mod shared;\npub use shared::Shared;\npub fn start() { core::run(); }"),
        ("core.rs", "pub fn run() { let _ = crate::Shared; }"),
        ("shared.rs", "pub struct Shared;"),
    ]);
    assert_eq!(edge_names(&k), ["crate -> crate::core", "crate::core -> crate::shared"]);
    assert!(cycles(&k).is_empty());
}

#[test]
fn a_nested_parent_and_its_children_may_use_each_other() {
    let k = krate(&[
        ("lib.rs", "mod parse;"),
        ("parse/mod.rs", "mod heap;\npub enum Record { Heap(heap::Bits) }\npub fn parse() -> Record { heap::parse() }"),
        ("parse/heap.rs", "pub struct Bits;\npub fn parse() -> super::Record { super::Record::Heap(Bits) }"),
    ]);
    assert_eq!(edge_names(&k), ["crate::parse -> crate::parse::heap", "crate::parse::heap -> crate::parse"]);
    assert!(cycles(&k).is_empty());
}

#[test]
fn test_code_visibilities_docs_and_locals_are_not_edges() {
    let k = krate(&[
        ("lib.rs", "mod a; mod b;"),
        (
            "a.rs",
            "/// Uses [`crate::b::g`].\npub(crate) fn f() { let b = 1; let _ = b; }\n\
             #[cfg(test)]\nmod tests { fn t() { crate::b::g(); } }\n#[cfg(test)]\nmod more;\n\
             #[test]\nfn t2() { crate::b::g(); }",
        ),
        ("b.rs", "pub fn g() { crate::a::f(); }"),
    ]);
    assert_eq!(edge_names(&k), ["crate::b -> crate::a"]);
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    assert!(tangles(&g).is_empty());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&g), Some(vec!["a".to_string(), "b".into(), "c".into(), "a".into()]));
    assert_eq!(tangles(&g), [["a", "b", "c"].into_iter().map(String::from).collect::<BTreeSet<_>>()]);
}
