//! The module graph of each workspace crate, from its `crate::`, `super::` and `self::` paths,
//! and the check that it has no cycle: no module imports another that imports it back.
//!
//! A plain text scan of `src/**/*.rs` (comments and string literals blanked first), not a
//! parser: it reads `use` trees and paths in expressions alike, and follows inline `mod x { }`
//! blocks (tests included) so that `super::` resolves as the compiler resolves it. Only
//! siblings are compared: an edge from `a::b` to `a::c::d` is the edge `b → c` among the
//! children of `a`, and a module naming its own parent or child is no edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
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

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments, string literals and character literals replaced by spaces (newlines
/// kept), so that what is left is code.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && (i == 0
                || !ident(chars[i - 1])
                || (chars[i - 1] == 'b' && (i < 2 || !ident(chars[i - 2]))))
            && matches!(next, Some('"' | '#'))
        {
            // A raw string r"..." or r#"..."#, if that is what follows.
            let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String =
                std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let start = i + 2 + hashes;
            let rest: String = chars[start..].iter().collect();
            let end = rest
                .find(&close)
                .map_or(chars.len(), |at| start + rest[..at].chars().count() + close.len());
            for &c in &chars[i..end] {
                blank(&mut out, c);
            }
            i = end;
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let step = if chars[i] == '\\' { 2 } else { 1 };
                for &c in chars.iter().skip(i).take(step) {
                    blank(&mut out, c);
                }
                i += step;
            }
            if i < chars.len() {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'); otherwise a lifetime or a label.
            let end = match (next, chars.get(i + 2)) {
                (Some('\\'), _) => {
                    chars[i + 2..].iter().position(|&q| q == '\'').map(|p| i + 3 + p)
                }
                (Some(_), Some('\'')) => Some(i + 3),
                _ => None,
            };
            match end {
                Some(end) => {
                    for &c in &chars[i..end.min(chars.len())] {
                        blank(&mut out, c);
                    }
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// One token of code: an identifier (or keyword), `::`, or another character.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path,
    Punct(char),
}

fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token::Path);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// The paths of one `use` tree or expression path starting at `tokens[at]`, each as its
/// segments after `prefix`; returns them with the index after the tree.
fn path_tree(
    tokens: &[Token],
    mut at: usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(at) {
            Some(Token::Ident(name)) => {
                if name != "self" {
                    path.push(name.clone());
                }
                at += 1;
            }
            Some(Token::Punct('{')) => {
                at += 1;
                loop {
                    match tokens.get(at) {
                        Some(Token::Punct('}')) | None => return at + 1,
                        Some(Token::Punct(',')) => at += 1,
                        Some(_) => {
                            let next = path_tree(tokens, at, &path, out);
                            at = if next == at { at + 1 } else { next };
                        }
                    }
                }
            }
            _ => break,
        }
        if tokens.get(at) == Some(&Token::Path) {
            at += 1;
        } else {
            break;
        }
    }
    if tokens.get(at) == Some(&Token::Ident("as".into())) {
        at += 2;
    }
    out.push(path);
    at
}

/// The module paths one file's code names: each `crate::`, `super::` or `self::` path,
/// resolved from the (possibly inline) module it is written in.
fn named_paths(code: &str, module: &ModPath) -> Vec<Vec<String>> {
    let tokens = tokens(code);
    let mut paths = Vec::new();
    // Inline modules open here, with the brace depth their block opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let here = || -> ModPath {
            let mut m = module.clone();
            m.extend(inline.iter().map(|(name, _)| name.clone()));
            m
        };
        match &tokens[i] {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                }
            }
            Token::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && tokens.get(i + 1) == Some(&Token::Path)
                    // Not the tail of a longer path (`$crate` has no `$` here: a macro's
                    // `$crate::` names the crate it is defined in, which is this one).
                    && (i == 0 || tokens[i - 1] != Token::Path) =>
            {
                let mut base = here();
                let mut at = i;
                match word.as_str() {
                    "crate" => {
                        base.clear();
                        at += 2;
                    }
                    "self" => at += 2,
                    _ => {
                        while tokens.get(at) == Some(&Token::Ident("super".into()))
                            && tokens.get(at + 1) == Some(&Token::Path)
                        {
                            base.pop();
                            at += 2;
                        }
                    }
                }
                i = path_tree(&tokens, at, &base, &mut paths).max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    paths
}

/// Edges among siblings: (parent, from child, to child) → the first file that makes it.
type Edges = BTreeMap<(ModPath, String, String), PathBuf>;

fn sibling_edges(krate: &CrateSources) -> Edges {
    let mut modules: BTreeSet<ModPath> = krate.files.iter().map(|(_, m)| m.clone()).collect();
    let mut per_file = Vec::new();
    for (file, module) in &krate.files {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        // Inline modules are modules too (`mod tests { }`), so paths into them resolve.
        let tokens = tokens(&code);
        for pair in tokens.windows(3) {
            if let [Token::Ident(m), Token::Ident(name), Token::Punct('{')] = pair
                && m == "mod"
            {
                let mut inner = module.clone();
                inner.push(name.clone());
                modules.insert(inner);
            }
        }
        per_file.push((file, module, named_paths(&code, module)));
    }
    let mut edges = Edges::new();
    for (file, module, paths) in per_file {
        for path in paths {
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

/// No module imports another that imports it back, in any crate of the workspace: the
/// pipeline, the web layer and the broker are layered, and a cycle is where they stop being.
#[test]
fn no_module_imports_one_that_imports_it_back() {
    let root = crate::workspace::root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    let members: Vec<&str> = members.split(',').map(|m| m.trim().trim_matches('"')).collect();
    assert!(members.contains(&"frontend"), "read the members from Cargo.toml: {members:?}");
    let mut found = Vec::new();
    let mut edge_count = 0;
    for member in members.iter().filter(|m| !m.is_empty()) {
        for krate in crates_of(&root.join(member), member) {
            let edges = sibling_edges(&krate);
            edge_count += edges.len();
            found.extend(cycles(&edges, &root).into_iter().map(|c| format!("{}: {c}", krate.name)));
        }
    }
    assert!(edge_count > 50, "found only {edge_count} module edges: the scan is broken");
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn the_scan_reads_use_trees_paths_and_inline_modules() {
    let code = code_only(
        "use crate::{a::{self, B}, b::c as d};\n\
         // crate::commented::Out\n\
         const S: &str = \"crate::quoted\"; const R: &str = r#\"crate::raw\"#;\n\
         fn f<'a>(x: &'a u8) -> char { let _ = crate::e::F::new(); '{' }\n\
         mod tests { use super::*; use super::super::g; fn t() { self::h(); } }\n\
         fn z() { crate::last(); }",
    );
    let paths = named_paths(&code, &vec!["m".to_owned(), "n".to_owned()]);
    let s = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        paths,
        vec![
            s(&["a"]),
            s(&["a", "B"]),
            s(&["b", "c"]),
            s(&["e", "F", "new"]),
            s(&["m", "n"]),
            s(&["m", "g"]),
            s(&["m", "n", "tests", "h"]),
            s(&["last"]),
        ]
    );
}
