//! ARCHITECTURE.md against the code, beyond the crate and module graphs: the constants it names
//! exist, and the files that name every telemetry family are the list it quotes.

use std::path::Path;

/// The workspace's Rust sources ([`super::rust_files`]), each with its path from `root` and its
/// text.
fn sources(root: &Path) -> Vec<(String, String)> {
    super::rust_files(root)
        .into_iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(&path).ok()?;
            let relative = path.strip_prefix(root).ok()?.display().to_string();
            Some((relative, text))
        })
        .collect()
}

/// The `Family` variants, in `Family::ALL`'s order, read from the protocol crate.
fn families(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("proto/src/lib.rs")).unwrap();
    let all = text.split("pub const ALL: [Family; ").nth(1).expect("Family::ALL in proto");
    let list = all.split_once("= [").expect("Family::ALL's list").1;
    let list = list.split_once("];").expect("the end of Family::ALL").0;
    let variants: Vec<String> = list
        .split(',')
        .map(|v| v.trim().trim_start_matches("Family::").to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    assert!(variants.len() >= 3, "read only {variants:?} from Family::ALL");
    variants
}

/// The files that name every `Family` variant (`Family::X` for each X): the tables and
/// exhaustive `match`es a new family joins.
fn family_files(root: &Path) -> Vec<String> {
    let variants = families(root);
    let mut files: Vec<String> = sources(root)
        .into_iter()
        .filter(|(_, text)| variants.iter().all(|v| names(text, &format!("Family::{v}"))))
        .map(|(path, _)| path)
        .collect();
    files.sort();
    files
}

/// Whether `text` has `name` as a whole path (not the start of a longer identifier).
fn names(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let next = text[at + name.len()..].chars().next();
        !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

const FAMILY_OPEN: &str = "<!-- family-files -->\n";
const FAMILY_CLOSE: &str = "<!-- /family-files -->";

fn family_block(files: &[String]) -> String {
    let list: Vec<String> = files.iter().map(|f| format!("`{f}`")).collect();
    format!(
        "Today {} files name every `Family` variant, each a table or an exhaustive `match` that a\n\
         new family joins (the compiler asks for most of them): {}.\n",
        files.len(),
        list.join(", ")
    )
}

/// The block of ARCHITECTURE.md's "Adding a family" that lists the files naming every family
/// is what the code has; `UPDATE_GOLDEN=1 cargo test -p xtask tidy` rewrites it.
#[test]
fn architecture_lists_the_files_that_name_every_family() {
    let root = crate::workspace::root();
    let path = root.join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (before, rest) = text.split_once(FAMILY_OPEN).expect("a family-files block");
    let (_, after) = rest.split_once(FAMILY_CLOSE).expect("the end of the family-files block");
    let files = family_files(&root);
    assert!(files.iter().any(|f| f == "proto/src/lib.rs"), "the scan missed proto: {files:?}");
    let block = family_block(&files);
    let filled = format!("{before}{FAMILY_OPEN}{block}{FAMILY_CLOSE}{after}");
    if crate::golden::updating() {
        std::fs::write(&path, filled).unwrap();
        return;
    }
    assert!(
        filled == text,
        "ARCHITECTURE.md's list of the files that name every family differs from the code; it \
         is now\n{block}rewrite it with UPDATE_GOLDEN=1 cargo test -p xtask tidy"
    );
}

/// Names the kernel or libc gives, which ARCHITECTURE.md may quote without the code defining
/// them.
const KERNEL_PREFIXES: [&str; 7] = ["CAP_", "RLIMIT_", "O_", "SO_", "CLOCK_", "PR_", "GET_"];

/// Every constant ARCHITECTURE.md names in backticks (`UPPER_SNAKE`, alone or after `Type::`)
/// is defined by some source file, so that the document names values instead of repeating them
/// and a renamed or removed constant fails here.
#[test]
fn architecture_names_constants_the_code_defines() {
    let root = crate::workspace::root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let sources = sources(&root);
    let mut named = std::collections::BTreeSet::new();
    for quoted in text.split('`').skip(1).step_by(2) {
        let name = quoted.rsplit("::").next().unwrap_or_default();
        let constant = name.len() > 3
            && name.contains('_')
            && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && !KERNEL_PREFIXES.iter().any(|p| name.starts_with(p));
        if constant {
            named.insert(name.to_owned());
        }
    }
    assert!(named.len() > 10, "read only {named:?}");
    let missing: Vec<&String> = named
        .iter()
        .filter(|name| {
            let definitions = [format!("const {name}:"), format!("static {name}:")];
            !sources.iter().any(|(_, text)| definitions.iter().any(|d| text.contains(d)))
        })
        .collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md names constants no file defines: {missing:?}");
}

#[test]
fn a_family_variant_is_named_only_as_a_whole_path() {
    assert!(names("x = Family::Prochot;", "Family::Prochot"));
    assert!(names("Family::Prochot", "Family::Prochot"));
    assert!(!names("Family::ProchotCount", "Family::Prochot"));
}
