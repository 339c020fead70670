//! The module graph of each workspace crate, from its `crate::`, `super::` and `self::` paths,
//! and the check that it has no cycle: no module imports another that imports it back.
//!
//! Each file of `src/**/*.rs` is parsed with `syn`: its `use` trees (in functions and inline
//! modules too) and its paths in expressions, types and patterns count alike, as do the paths in
//! macro arguments; comments and string literals are not code. Inline `mod x { }` blocks (tests
//! included) are followed so that `super::` resolves as the compiler resolves it. Only
//! siblings are compared: an edge from `a::b` to `a::c::d` is the edge `b → c` among the
//! children of `a`, and a module naming its own parent or child is no edge.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::{self, Visit};
use syn::{ItemMod, ItemUse, UseTree};

/// A module path inside one crate, `[]` for the crate root.
type ModPath = Vec<String>;

/// One crate root (`lib.rs`, `main.rs`, `bin/x.rs`, `bin/x/main.rs`) and its module files.
#[derive(Debug)]
struct CrateSources {
    /// `folder/src/lib.rs` and the like, for messages.
    name: String,
    /// Each file with the module it is.
    files: Vec<(PathBuf, ModPath)>,
}

/// The crates whose sources live under `src`: the library (or the binary without one) owns
/// every file outside `src/bin/`; each binary under `src/bin/` owns its own folder.
fn crates_of(folder: &Path, label: &str) -> Vec<CrateSources> {
    let src = folder.join("src");
    let files = super::rust_files(&src);
    let main_root = if src.join("lib.rs").exists() { "lib.rs" } else { "main.rs" };
    let mut crates: BTreeMap<String, CrateSources> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap().to_path_buf();
        let parts: Vec<String> =
            relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let (root, module) = match parts.as_slice() {
            [bin, one] if bin == "bin" => (format!("bin/{one}"), Vec::new()),
            [bin, name, rest @ ..] if bin == "bin" => (format!("bin/{name}"), rest.to_vec()),
            _ if parts == [main_root] => (main_root.to_owned(), Vec::new()),
            // A second root beside the library (its `main.rs`) is a crate of its own.
            [other] if other == "main.rs" || other == "lib.rs" => (other.clone(), Vec::new()),
            _ => (main_root.to_owned(), parts),
        };
        let module = module_path(&module);
        let name = format!("{label}/src/{root}");
        crates
            .entry(root)
            .or_insert_with(|| CrateSources { name, files: Vec::new() })
            .files
            .push((file, module));
    }
    crates.into_values().collect()
}

/// `["sampler", "mod.rs"]` → `sampler`; `["check", "tests.rs"]` → `check::tests`;
/// `["main.rs"]` (a binary's own folder) → the root.
fn module_path(parts: &[String]) -> ModPath {
    let mut path: ModPath = parts.iter().map(|p| p.trim_end_matches(".rs").to_owned()).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "main" | "lib")) {
        path.pop();
    }
    path
}

/// What one file names: each `crate::`, `super::` or `self::` path, resolved to segments from the
/// crate root, and the inline modules (`mod x { }`) it declares.
#[derive(Debug, Default)]
struct Named {
    paths: Vec<Vec<String>>,
    inline_modules: Vec<ModPath>,
}

/// Walks one file's syntax tree from the module it is, collecting what it names into [`Named`].
struct PathVisitor {
    /// The module the visitor is in: the file's, then each inline module it entered.
    here: ModPath,
    named: Named,
}

impl PathVisitor {
    /// The module a path's leading `crate`, `super`s or `self` stand for, and how many segments
    /// they take; `None` for a path that starts elsewhere (an external crate, a local name).
    fn base<'a>(&self, mut segments: impl Iterator<Item = &'a str>) -> Option<(ModPath, usize)> {
        match segments.next()? {
            "crate" => Some((Vec::new(), 1)),
            "self" => Some((self.here.clone(), 1)),
            "super" => {
                let mut base = self.here.clone();
                base.pop();
                let mut taken = 1;
                while segments.next() == Some("super") {
                    base.pop();
                    taken += 1;
                }
                Some((base, taken))
            }
            _ => None,
        }
    }

    /// A `use` tree from its root: counted if it starts with `crate`, `super` or `self`.
    fn use_root(&mut self, tree: &UseTree) {
        let mut leading = Vec::new();
        let mut rest = tree;
        while let UseTree::Path(p) = rest
            && matches!(p.ident.to_string().as_str(), "crate" | "super" | "self")
            && (leading.is_empty() || p.ident == "super")
        {
            leading.push(p.ident.to_string());
            rest = &p.tree;
        }
        match rest {
            UseTree::Group(group) if leading.is_empty() => {
                group.items.iter().for_each(|item| self.use_root(item));
            }
            _ => {
                if let Some((base, _)) = self.base(leading.iter().map(String::as_str)) {
                    self.use_tree(rest, base);
                }
            }
        }
    }

    /// The paths of a `use` tree below `prefix`: `{a::{self, B}, c as d}` names `a`, `a::B`, `c`.
    fn use_tree(&mut self, tree: &UseTree, mut prefix: Vec<String>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
            }
            UseTree::Name(name) => {
                if name.ident != "self" {
                    prefix.push(name.ident.to_string());
                }
                self.named.paths.push(prefix);
            }
            UseTree::Rename(rename) => {
                if rename.ident != "self" {
                    prefix.push(rename.ident.to_string());
                }
                self.named.paths.push(prefix);
            }
            UseTree::Glob(_) => self.named.paths.push(prefix),
            UseTree::Group(group) => {
                group.items.iter().for_each(|item| self.use_tree(item, prefix.clone()));
            }
        }
    }

    /// A macro's tokens are not parsed: each `crate::`, `super::` or `self::` path in them (a
    /// macro's own `$crate::` included) is read as a `use` tree, from its first segment to the
    /// first token that cannot continue it.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let is_colons = |at: usize| {
            matches!((tokens.get(at), tokens.get(at + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        let mut at = 0;
        while let Some(token) = tokens.get(at) {
            match token {
                TokenTree::Group(group) => self.macro_tokens(group.stream()),
                TokenTree::Ident(ident)
                    if matches!(ident.to_string().as_str(), "crate" | "super" | "self")
                        && is_colons(at + 1)
                        && (at < 2 || !is_colons(at - 2)) =>
                {
                    let start = at;
                    at += 1;
                    while is_colons(at) {
                        match tokens.get(at + 2) {
                            Some(TokenTree::Ident(_)) => at += 3,
                            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                                at += 3;
                                break;
                            }
                            _ => break,
                        }
                    }
                    let path: TokenStream = tokens[start..at].iter().cloned().collect();
                    if let Ok(tree) = syn::parse2::<UseTree>(path) {
                        self.use_root(&tree);
                    }
                    continue;
                }
                _ => {}
            }
            at += 1;
        }
    }
}

impl<'ast> Visit<'ast> for PathVisitor {
    fn visit_item_mod(&mut self, module: &'ast ItemMod) {
        if module.content.is_some() {
            self.here.push(module.ident.to_string());
            self.named.inline_modules.push(self.here.clone());
            visit::visit_item_mod(self, module);
            self.here.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast ItemUse) {
        if item.leading_colon.is_none() {
            self.use_root(&item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if path.leading_colon.is_none()
            && segments.len() > 1
            && let Some((mut base, taken)) = self.base(segments.iter().map(String::as_str))
        {
            base.extend(segments.into_iter().skip(taken));
            self.named.paths.push(base);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        self.macro_tokens(mac.tokens.clone());
    }
}

/// What the source of module `module` names. Comments and string literals are not code, so
/// what they say is no path; `mod tests { }` blocks are followed so that `super::` resolves
/// as the compiler resolves it.
fn named(source: &str, module: &ModPath) -> syn::Result<Named> {
    let file = syn::parse_file(source)?;
    let mut visitor = PathVisitor { here: module.clone(), named: Named::default() };
    visitor.visit_file(&file);
    Ok(visitor.named)
}

/// Edges among siblings: (parent, from child, to child) → the first file that makes it.
type Edges = BTreeMap<(ModPath, String, String), PathBuf>;

/// The sibling edges of files already read: each file's path, its module and what it names.
fn edges_of(files: &[(PathBuf, ModPath, Named)]) -> Edges {
    let mut modules: BTreeSet<ModPath> = files.iter().map(|(_, m, _)| m.clone()).collect();
    // Inline modules are modules too (`mod tests { }`), so paths into them resolve.
    modules.extend(files.iter().flat_map(|(_, _, n)| n.inline_modules.iter().cloned()));
    let mut edges = Edges::new();
    for (file, module, named) in files {
        for path in &named.paths {
            // The module a path names: its longest prefix that is a module.
            let Some(target) =
                (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains(p))
            else {
                continue;
            };
            let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(from), Some(to)) = (module.get(common), target.get(common)) else {
                continue; // the same module, an ancestor or a descendant
            };
            edges
                .entry((module[..common].to_vec(), from.clone(), to.clone()))
                .or_insert_with(|| file.clone());
        }
    }
    edges
}

fn sibling_edges(krate: &CrateSources) -> Edges {
    let files: Vec<(PathBuf, ModPath, Named)> = krate
        .files
        .iter()
        .map(|(file, module)| {
            let source = std::fs::read_to_string(file).unwrap();
            let named = named(&source, module)
                .unwrap_or_else(|e| panic!("{}: cannot parse: {e}", file.display()));
            (file.clone(), module.clone(), named)
        })
        .collect();
    edges_of(&files)
}

/// Each cycle among siblings, as `a → b → a` with the file of each edge.
fn cycles(edges: &Edges, root: &Path) -> Vec<String> {
    let mut by_parent: BTreeMap<&ModPath, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        by_parent.entry(parent).or_default().entry(from).or_default().push(to);
    }
    let mut found = Vec::new();
    for (parent, graph) in by_parent {
        let reach = |start: &str| -> BTreeSet<String> {
            let mut seen = BTreeSet::new();
            let mut stack = vec![start.to_owned()];
            while let Some(node) = stack.pop() {
                for next in graph.get(node.as_str()).into_iter().flatten() {
                    if seen.insert((*next).to_owned()) {
                        stack.push((*next).to_owned());
                    }
                }
            }
            seen
        };
        let mut reported = BTreeSet::new();
        for &start in graph.keys() {
            if reported.contains(start) || !reach(start).contains(start) {
                continue;
            }
            // The shortest way back to `start`, breadth first.
            let mut back: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            'search: while let Some(node) = queue.pop_front() {
                for &next in graph.get(node).into_iter().flatten() {
                    if next == start {
                        back.insert(start, node);
                        break 'search;
                    }
                    if !back.contains_key(next) {
                        back.insert(next, node);
                        queue.push_back(next);
                    }
                }
            }
            let mut cycle = vec![start];
            let mut node = back[start];
            while node != start {
                cycle.push(node);
                node = back[node];
            }
            cycle.push(start);
            cycle.reverse();
            let prefix =
                if parent.is_empty() { String::new() } else { format!("{}::", parent.join("::")) };
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let file = &edges[&(parent.clone(), w[0].to_owned(), w[1].to_owned())];
                    let file = file.strip_prefix(root).unwrap_or(file).display();
                    format!("{prefix}{} → {prefix}{} ({file})", w[0], w[1])
                })
                .collect();
            reported.extend(cycle.iter().map(|s| s.to_owned()));
            found.push(steps.join(", "));
        }
    }
    found
}

/// The workspace's members, read from its `Cargo.toml`.
fn members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    let members: Vec<String> = members
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    assert!(
        members.iter().any(|m| m == "frontend"),
        "read the members from Cargo.toml: {members:?}"
    );
    members
}

/// No module imports another that imports it back, in any crate of the workspace: the
/// pipeline, the web layer and the broker are layered, and a cycle is where they stop being.
#[test]
fn no_module_imports_one_that_imports_it_back() {
    let root = crate::workspace::root();
    let mut found = Vec::new();
    let mut edge_count = 0;
    for member in members(&root) {
        for krate in crates_of(&root.join(&member), &member) {
            let edges = sibling_edges(&krate);
            edge_count += edges.len();
            found.extend(cycles(&edges, &root).into_iter().map(|c| format!("{}: {c}", krate.name)));
        }
    }
    assert!(edge_count > 50, "found only {edge_count} module edges: the scan is broken");
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

/// Where ARCHITECTURE.md lists a library's module edges: from the line
/// `<!-- module-graph: FOLDER -->`...
const GRAPH_OPEN: &str = "<!-- module-graph: ";
/// ...to this line.
const GRAPH_CLOSE: &str = "<!-- /module-graph -->";

/// The edge list ARCHITECTURE.md quotes: per module, the siblings it imports, as a fenced block.
fn edge_list(edges: &Edges) -> String {
    let mut by_module: BTreeMap<(&ModPath, &str), Vec<&str>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        by_module.entry((parent, from)).or_default().push(to);
    }
    let mut text = String::from("```text\n");
    for ((parent, from), to) in by_module {
        let prefix: String = parent.iter().map(|p| format!("{p}::")).collect();
        text.push_str(&format!("{prefix}{from} → {}\n", to.join(", ")));
    }
    text.push_str("```\n");
    text
}

/// `text` with each module-graph block filled from the code: `(new text, [(folder, block)])`.
fn fill_module_graphs(root: &Path, text: &str) -> (String, Vec<(String, String)>) {
    let mut out = String::new();
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(GRAPH_OPEN) {
        let (before, marker) = rest.split_at(open);
        let header_end = marker.find('\n').expect("a line after the module-graph marker") + 1;
        let folder = marker[GRAPH_OPEN.len()..header_end].trim().trim_end_matches("-->").trim();
        let close = marker.find(GRAPH_CLOSE).expect("a <!-- /module-graph --> after the block");
        let krate = crates_of(&root.join(folder), folder)
            .into_iter()
            .find(|k| k.name == format!("{folder}/src/lib.rs"))
            .unwrap_or_else(|| panic!("ARCHITECTURE.md: {folder} is no library of the workspace"));
        let block = edge_list(&sibling_edges(&krate));
        out.push_str(before);
        out.push_str(&marker[..header_end]);
        out.push_str(&block);
        blocks.push((folder.to_owned(), block));
        rest = &marker[close..];
    }
    out.push_str(rest);
    (out, blocks)
}

/// ARCHITECTURE.md's lists of which module imports which, in the broker, the web layer and the
/// frontend, are the code's: each block between the module-graph markers is the edge list this
/// scan derives, rewritten with `UPDATE_GOLDEN=1 cargo test -p xtask tidy`.
#[test]
fn architecture_module_edges_are_the_codes() {
    let root = crate::workspace::root();
    let path = root.join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (filled, blocks) = fill_module_graphs(&root, &text);
    let folders: Vec<&str> = blocks.iter().map(|(f, _)| f.as_str()).collect();
    for layered in ["broker", "frontend", "web"] {
        assert!(folders.contains(&layered), "ARCHITECTURE.md lists no module edges of {layered}");
    }
    if crate::golden::updating() {
        std::fs::write(&path, &filled).unwrap();
        return;
    }
    let marked = |(folder, block): &(String, String)| format!("{GRAPH_OPEN}{folder} -->\n{block}");
    let mut stale: Vec<&(String, String)> =
        blocks.iter().filter(|b| !text.contains(&(marked(b) + GRAPH_CLOSE))).collect();
    if stale.is_empty() && filled != text {
        stale = blocks.iter().collect();
    }
    let stale: Vec<String> =
        stale.into_iter().map(|(folder, block)| format!("{folder}:\n{block}")).collect();
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md's module edges differ from the code; the blocks are now\n{}\
         rewrite them with UPDATE_GOLDEN=1 cargo test -p xtask tidy and review the diff",
        stale.join("\n")
    );
}

/// `s(&["a", "b"])`: a path or module as the scan writes it.
#[cfg(test)]
fn s(path: &[&str]) -> Vec<String> {
    path.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_scan_reads_use_trees_paths_macros_and_inline_modules() {
    let named = named(
        "use crate::{a::{self, B}, b::c as d};\n\
         fn f<'a>(x: &'a u8) -> char { let _ = crate::e::F::new(); '{' }\n\
         mod tests { use super::*; use super::super::g; fn t() { self::h(); } }\n\
         fn z() { crate::last(); assert_eq!(crate::i::J, super::k::L); }",
        &s(&["m", "n"]),
    )
    .unwrap();
    assert_eq!(
        named.paths,
        vec![
            s(&["a"]),
            s(&["a", "B"]),
            s(&["b", "c"]),
            s(&["e", "F", "new"]),
            s(&["m", "n"]),
            s(&["m", "g"]),
            s(&["m", "n", "tests", "h"]),
            s(&["last"]),
            s(&["i", "J"]),
            s(&["m", "k", "L"]),
        ]
    );
    assert_eq!(named.inline_modules, vec![s(&["m", "n", "tests"])]);
}

/// The edges a crate of in-memory files makes: each `(module, source)`.
#[cfg(test)]
fn edges_of_sources(files: &[(&[&str], &str)]) -> Vec<String> {
    let files: Vec<(PathBuf, ModPath, Named)> = files
        .iter()
        .map(|(module, source)| {
            let module = s(module);
            (PathBuf::from(module.join("/")), module.clone(), named(source, &module).unwrap())
        })
        .collect();
    edges_of(&files)
        .into_keys()
        .map(|(parent, from, to)| {
            let prefix: String = parent.iter().map(|p| format!("{p}::")).collect();
            format!("{prefix}{from} → {prefix}{to}")
        })
        .collect()
}

/// A nested `use` tree names each of its leaves (a rename by its original name), and `super::`
/// resolves from the module it is written in.
#[test]
fn a_nested_use_tree_and_super_make_an_edge_to_each_module_they_name() {
    let edges = edges_of_sources(&[
        (&["a"], ""),
        (&["a", "b"], ""),
        (&["a", "c"], "use super::b::Thing;"),
        (&["d"], ""),
        (&["e"], ""),
        (&["m"], "use crate::{a::{b, c}, d as e};"),
        (&["m", "n"], "use super::x;"),
        (&["m", "x"], ""),
    ]);
    assert_eq!(edges, ["m → a", "m → d", "a::c → a::b", "m::n → m::x"]);
}

/// `use crate::x` in a comment, a doc comment, a string or a raw string is not code.
#[test]
fn a_use_in_a_string_or_a_comment_is_no_edge() {
    let edges = edges_of_sources(&[
        (&["a"], ""),
        (&["b"], ""),
        (
            &["m"],
            "// use crate::a;\n/* use crate::a; /* nested */ crate::a::f() */\n\
             /// [`crate::a::f`]\nconst S: &str = \"use crate::a;\";\n\
             const R: &str = r#\"crate::a::f()\"#;\nfn f() { println!(\"{}\", \"crate::a::x\"); }\n\
             use crate::b;",
        ),
    ]);
    assert_eq!(edges, ["m → b"]);
}
