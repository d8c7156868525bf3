//! The module graph of a crate, read with `syn`: which module's code names which other
//! module, and the cycles in it.
//!
//! A crate root (`src/lib.rs`, `src/main.rs`, each `src/bin/*.rs`) and the `mod` items it
//! declares, followed into their files, give the tree of modules. The code of each module
//! (test code left out: a `#[cfg(test)]` or `#[test]` item, and so a `#[cfg(test)] mod
//! tests;` file, because a test may use the whole crate) is searched for paths: `crate::a::b`,
//! `super::x`, `self::x`, a child's name (`wal::Wal`), and a name brought in by `use`. Each is
//! resolved to the module that defines the item, through re-exports (`pub use`) and globs,
//! so that `crate::Event` re-exported from `core` is an edge to `core`, not to the crate
//! root. Paths inside macro calls count too (`format!("{}", crate::a::B)`); doc comments
//! and visibilities (`pub(crate)`) do not. A private `use` of a module's own items is an
//! edge (the compiler makes sure it is used); a `pub use` is not (a re-export is the
//! child's surface, and whoever names it gets the edge to the child).
//!
//! The rule, [`levels`]: at every level of the tree the children of a module form no cycle,
//! and at the top the crate root's own items (the code in `lib.rs` or `main.rs` besides its
//! `mod` and `pub use` lines) form none with the top-level modules. An edge from anywhere
//! under `a::x` to anywhere under `a::y` counts as `a::x -> a::y`.
//!
//! Parents and children: a nested module and its children are one subsystem seen from
//! outside; the children use the parent's items (`super::MainData`, an enum over what each
//! child parses), and the parent uses its children; so an edge between a nested module and
//! one of its own descendants is not counted, and only cycles among siblings are. The crate
//! root is different: every module can name `crate::X`, and the root uses its modules, so an
//! item that modules share placed in the root closes a loop through all of them; the root
//! declares, re-exports and assembles (`main`, the public API), and what modules share
//! belongs in a leaf module that they all use.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path from its crate root: empty for the root, `["storage", "wal"]` for
/// `crate::storage::wal`.
pub type ModPath = Vec<String>;

/// A graph whose nodes are names: what [`find_cycle`] searches.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Where an edge comes from: `file:line: path`.
pub type Witness = String;

#[derive(Default)]
struct Module {
    children: BTreeSet<String>,
    /// The names this module defines (other than modules).
    items: BTreeSet<String>,
    /// `(name, path as written)` of every `use`; `*` for a glob.
    imports: Vec<(String, Vec<String>)>,
    /// Paths named by the module's code, with where.
    refs: Vec<(Vec<String>, Witness)>,
}

/// The modules of one crate root, by path.
pub struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().is_ident("test") {
            return true;
        }
        if !a.path().is_ident("cfg") {
            return false;
        }
        let syn::Meta::List(list) = &a.meta else { return false };
        let cfg: String = list.tokens.to_string().split_whitespace().collect();
        cfg == "test" || cfg.starts_with("all(test,")
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        syn::Meta::NameValue(syn::MetaNameValue { value: syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }), .. }) => {
            Some(s.value())
        }
        _ => None,
    })
}

/// `(name, path)` for each leaf of a `use` tree; `*` names a glob.
fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.last().cloned().unwrap_or_default(), prefix.clone()));
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push((n.ident.to_string(), path));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((r.rename.to_string(), path));
        }
        syn::UseTree::Glob(_) => out.push(("*".to_string(), prefix.clone())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

/// Collects the paths and `use`s of one module's non-test code (nested `mod` items are
/// modules of their own, read by [`Crate::load_items`]).
struct Collector<'a> {
    module: &'a mut Module,
    file: &'a str,
}

impl Collector<'_> {
    fn witness(&self, span: proc_macro2::Span, path: &[String]) -> Witness {
        format!("{}:{}: {}", self.file, span.start().line, path.join("::"))
    }

    /// Paths of two or more segments in a macro's tokens (`crate::a::b`, `$crate::x`,
    /// `wal::Wal`); a lone word there may be a local variable, so it is not taken.
    fn scan_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let tokens: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let proc_macro2::TokenTree::Group(g) = &tokens[i] {
                self.scan_tokens(g.stream());
                i += 1;
                continue;
            }
            let proc_macro2::TokenTree::Ident(first) = &tokens[i] else {
                i += 1;
                continue;
            };
            // Not the tail of a longer path or a field or method after a dot.
            let after_sep = i > 0 && matches!(&tokens[i - 1], proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' || p.as_char() == '.');
            let mut path = vec![first.to_string()];
            let mut j = i + 1;
            loop {
                match (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2)) {
                    (
                        Some(proc_macro2::TokenTree::Punct(a)),
                        Some(proc_macro2::TokenTree::Punct(b)),
                        Some(proc_macro2::TokenTree::Ident(next)),
                    ) if a.as_char() == ':' && b.as_char() == ':' => {
                        path.push(next.to_string());
                        j += 3;
                    }
                    _ => break,
                }
            }
            if !after_sep && path.len() >= 2 {
                let w = self.witness(first.span(), &path);
                self.module.refs.push((path, w));
            }
            i = j;
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Mod(_) => return,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let test = match item {
            syn::ImplItem::Fn(f) => is_test(&f.attrs),
            syn::ImplItem::Const(c) => is_test(&c.attrs),
            _ => false,
        };
        if !test {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_some() {
            return;
        }
        let mut leaves = Vec::new();
        flatten_use(&item.tree, &mut Vec::new(), &mut leaves);
        let private = matches!(item.vis, syn::Visibility::Inherited);
        for (name, path) in leaves {
            if private {
                let w = self.witness(item.use_token.span, &path);
                self.module.refs.push((path.clone(), w));
            }
            self.module.imports.push((name, path));
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let span = path.segments.first().map(|s| s.ident.span()).unwrap_or_else(proc_macro2::Span::call_site);
            let w = self.witness(span, &segs);
            self.module.refs.push((segs, w));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.scan_tokens(mac.tokens.clone());
    }

    // `pub(crate)`, `pub(super)`: who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    // Derives and other attributes name macros, not modules; doc comments are attributes too.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// How a crate's files are read: from disk, or from a map in the tests of this module.
pub trait Source {
    fn read(&self, path: &Path) -> Option<String>;
}

pub struct Disk;

impl Source for Disk {
    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

impl Source for BTreeMap<PathBuf, String> {
    fn read(&self, path: &Path) -> Option<String> {
        self.get(path).cloned()
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

impl Crate {
    /// Reads the crate whose root file is `root` (the tree under its directory), naming
    /// files in witnesses relative to `base`.
    pub fn load(source: &dyn Source, root: &Path, base: &Path) -> Crate {
        let mut krate = Crate { modules: BTreeMap::new() };
        let dir = root.parent().expect("a crate root has a directory").to_path_buf();
        krate.load_file(source, root, Vec::new(), dir, base);
        krate
    }

    fn load_file(&mut self, source: &dyn Source, file: &Path, path: ModPath, child_dir: PathBuf, base: &Path) {
        let text = source.read(file).unwrap_or_else(|| panic!("read {}", file.display()));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("parse {}: {e}", file.display()));
        self.load_items(source, file, &ast.items, path, &child_dir, base);
    }

    fn load_items(&mut self, source: &dyn Source, file: &Path, items: &[syn::Item], path: ModPath, child_dir: &Path, base: &Path) {
        let shown = file.strip_prefix(base).unwrap_or(file).display().to_string();
        let mut module = Module::default();
        let mut nested = Vec::new();
        for item in items {
            match item {
                syn::Item::Mod(m) if !is_test(&m.attrs) => {
                    let name = m.ident.to_string();
                    module.children.insert(name.clone());
                    nested.push(m);
                }
                syn::Item::Mod(_) => {}
                other => {
                    if let Some(name) = item_name(other) {
                        module.items.insert(name);
                    }
                    Collector { module: &mut module, file: &shown }.visit_item(other);
                }
            }
        }
        self.modules.insert(path.clone(), module);
        for m in nested {
            let name = m.ident.to_string();
            let mut child = path.clone();
            child.push(name.clone());
            if let Some((_, items)) = &m.content {
                self.load_items(source, file, items, child, &child_dir.join(&name), base);
                continue;
            }
            let (child_file, grandchildren) = match path_attr(&m.attrs) {
                Some(p) => {
                    let f = file.parent().expect("a file has a directory").join(p);
                    let d = f.parent().expect("a file has a directory").to_path_buf();
                    (f, d)
                }
                None => {
                    let flat = child_dir.join(format!("{name}.rs"));
                    if source.read(&flat).is_some() {
                        (flat, child_dir.join(&name))
                    } else {
                        (child_dir.join(&name).join("mod.rs"), child_dir.join(&name))
                    }
                }
            };
            self.load_file(source, &child_file, child, grandchildren, base);
        }
    }

    /// The module a path named in module `from` leads to, or `None` for another crate or a
    /// name that is no module's item (a local variable, a type's associated item).
    fn resolve(&self, from: &ModPath, segs: &[String], depth: usize) -> Option<ModPath> {
        if depth > 16 || segs.is_empty() {
            return None;
        }
        let module = self.modules.get(from)?;
        let (mut cur, rest): (ModPath, &[String]) = match segs[0].as_str() {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (from.clone(), &segs[1..]),
            "super" => {
                let mut cur = from.clone();
                let mut rest = segs;
                while rest.first().is_some_and(|s| s == "super") {
                    cur.pop()?;
                    rest = &rest[1..];
                }
                (cur, rest)
            }
            first if segs.len() > 1 && module.children.contains(first) => {
                let mut cur = from.clone();
                cur.push(first.to_string());
                (cur, &segs[1..])
            }
            first => {
                let (_, target) = module.imports.iter().find(|(n, _)| n == first)?;
                let mut full = target.clone();
                full.extend_from_slice(&segs[1..]);
                return self.resolve(from, &full, depth + 1);
            }
        };
        for (i, seg) in rest.iter().enumerate() {
            let m = self.modules.get(&cur)?;
            if m.children.contains(seg) {
                cur.push(seg.clone());
                continue;
            }
            if m.items.contains(seg) {
                return Some(cur);
            }
            if let Some((_, target)) = m.imports.iter().find(|(n, _)| n == seg) {
                let mut full = target.clone();
                full.extend_from_slice(&rest[i + 1..]);
                return self.resolve(&cur, &full, depth + 1);
            }
            for (_, glob) in m.imports.iter().filter(|(n, _)| n == "*") {
                let mut full = glob.clone();
                full.push(seg.clone());
                if let Some(t) = self.resolve(&cur, &full, depth + 1) {
                    let tm = &self.modules[&t];
                    if tm.items.contains(seg) || tm.children.contains(seg) {
                        return Some(t);
                    }
                }
            }
            // An enum's variant or a name made by a macro: it is this module's.
            return Some(cur);
        }
        Some(cur)
    }

    /// Every edge `module -> other module` with the first place that makes it.
    pub fn edges(&self) -> BTreeMap<(ModPath, ModPath), Witness> {
        let mut edges = BTreeMap::new();
        for (from, module) in &self.modules {
            for (segs, witness) in &module.refs {
                if let Some(to) = self.resolve(from, segs, 0) {
                    if &to != from {
                        edges.entry((from.clone(), to)).or_insert_with(|| witness.clone());
                    }
                }
            }
        }
        edges
    }
}

/// How a module is named in a report: `crate::storage::wal`.
pub fn name(path: &[String]) -> String {
    std::iter::once("crate").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join("::")
}

/// The graph the rule checks, built from `edges`: at every level, the children of a module;
/// at the top, the crate root's own items too. An edge from under `a::x` to under `a::y` is
/// `a::x -> a::y`; an edge between the crate root's own code and a module under its child
/// `c` is between `crate (own items)` and `crate::c`; an edge between a nested module and
/// its own descendant is not one (see the module documentation). Each lifted edge keeps the
/// witness of the first edge it stands for.
pub fn levels(edges: &BTreeMap<(ModPath, ModPath), Witness>) -> (Graph, BTreeMap<(String, String), Witness>) {
    const ROOT_OWN: &str = "crate (own items)";
    let mut graph = Graph::new();
    let mut witnesses = BTreeMap::new();
    for ((from, to), witness) in edges {
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        let (a, b) = match (from.len() == common, to.len() == common) {
            (false, false) => (name(&from[..=common]), name(&to[..=common])),
            (true, _) if common == 0 => (ROOT_OWN.to_string(), name(&to[..1])),
            (_, true) if common == 0 => (name(&from[..1]), ROOT_OWN.to_string()),
            _ => continue,
        };
        graph.entry(a.clone()).or_default().insert(b.clone());
        witnesses.entry((a, b)).or_insert_with(|| witness.clone());
    }
    (graph, witnesses)
}

/// A cycle in `graph`, if it has one: its nodes, the first repeated at the end.
pub fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
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
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The crate roots of a package's `src`: `lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`.
pub fn crate_roots(src: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).filter(|p| p.is_file()).collect();
    if let Ok(entries) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = entries
            .map(|e| e.expect("read a directory entry").path())
            .filter_map(|p| {
                if p.is_dir() {
                    Some(p.join("main.rs")).filter(|m| m.is_file())
                } else {
                    Some(p).filter(|p| p.extension().is_some_and(|e| e == "rs"))
                }
            })
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
}

/// The tangles of a crate (sets of modules at one level that reach each other), each with
/// a report: one cycle through it, then each of its edges with the place that makes it.
pub fn tangles_of(krate: &Crate) -> Vec<(BTreeSet<String>, String)> {
    let (graph, witnesses) = levels(&krate.edges());
    tangles(&graph)
        .into_iter()
        .map(|tangle| {
            let inside: Graph = graph
                .iter()
                .filter(|(n, _)| tangle.contains(*n))
                .map(|(n, tos)| (n.clone(), tos.iter().filter(|t| tangle.contains(*t)).cloned().collect()))
                .collect();
            let cycle = find_cycle(&inside).expect("a tangle holds a cycle");
            let mut lines = vec![cycle.join(" -> ")];
            for pair in cycle.windows(2) {
                let w = &witnesses[&(pair[0].clone(), pair[1].clone())];
                lines.push(format!("  {} -> {}: {w}", pair[0], pair[1]));
            }
            (tangle, lines.join("\n"))
        })
        .collect()
}

/// The strongly connected parts of `graph` that hold a cycle (two or more nodes).
pub fn tangles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start.to_string()];
        while let Some(n) = stack.pop() {
            for next in graph.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for node in graph.keys() {
        if out.iter().any(|t| t.contains(node)) {
            continue;
        }
        let from = reach(node);
        let part: BTreeSet<String> =
            from.iter().filter(|m| *m != node && reach(m).contains(node)).cloned().chain(std::iter::once(node.clone())).collect();
        if part.len() > 1 {
            out.push(part);
        }
    }
    out
}

#[cfg(test)]
mod tests;
