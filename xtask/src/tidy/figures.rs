//! The mailbox cost of a scrape is stated once: by the rule in the code (`Families::messages`,
//! one message per item of each family asked for), and in the documents only where a test
//! generates the figures from it (docs/metrics.md, "Cost per scrape", between `<!-- …:begin`
//! and `<!-- …:end -->` markers). A figure written by hand elsewhere (a formula such as
//! "2 × cores + 3 × sockets", or a Turin 2P's total) goes stale with the next family: 14 did.

/// Where a figure may be written by hand: measured history, which states what was true when it
/// was measured, and this file's own examples.
const HISTORY: [&str; 4] =
    ["docs/benchmarks.md", "docs/release-notes.md", "CHANGELOG.md", "xtask/src/tidy/figures.rs"];

/// The extensions of files whose every line is prose or configuration an operator reads; of Rust
/// files, the comments are read.
const PROSE: [&str; 7] = ["md", "yaml", "yml", "sh", "tpl", "jsonnet", "libsonnet"];

/// Whether `line` states a mailbox cost: a formula over cores and sockets ("2 × cores",
/// "cores + 3", "cores + sockets", "3 x sockets") or a Turin 2P's total (770, 772, 774).
fn states_a_cost(line: &str) -> bool {
    let formula = ["cores + ", "× cores", "× sockets", " x cores", " x sockets"].iter().any(|p| {
        line.match_indices(p).any(|(at, _)| {
            let after = &line[at + p.len()..];
            match *p {
                "cores + " => after.starts_with("sockets") || after.starts_with(char::is_numeric),
                _ => line[..at].trim_end().ends_with(char::is_numeric),
            }
        })
    });
    let total = line
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| matches!(word, "770" | "772" | "774"));
    formula || total
}

/// The lines of `text` a reader takes as stated: a Rust file's comments, any other file's every
/// line, outside generated blocks. Each with its number.
fn stated(text: &str, rust: bool) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut generated = false;
    for (i, line) in text.lines().enumerate() {
        if line.contains("<!-- ") && line.contains(":begin") {
            generated = true;
        } else if line.contains("<!-- ") && line.contains(":end -->") {
            generated = false;
        } else if !generated && (!rust || line.trim_start().starts_with("//")) {
            out.push((i + 1, line));
        }
    }
    out
}

#[test]
fn no_document_states_a_mailbox_cost_by_hand() {
    let root = crate::workspace::root();
    let mut found = Vec::new();
    let mut read = 0;
    for path in super::files_with(&root, |ext| ext == "rs" || PROSE.contains(&ext)) {
        let rel = path.strip_prefix(&root).unwrap().display().to_string();
        if HISTORY.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        read += 1;
        let rust = path.extension().is_some_and(|e| e == "rs");
        for (n, line) in stated(&text, rust) {
            if states_a_cost(line) {
                found.push(format!("{rel}:{n}: {}", line.trim()));
            }
        }
    }
    assert!(read > 100, "read only {read} files");
    assert!(
        found.is_empty(),
        "mailbox costs stated by hand; state the rule or point to docs/metrics.md's generated \
         \"Cost per scrape\" instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_cost_is_told_from_other_figures() {
    for cost in [
        "a sample costs 2 × cores + 2 × sockets mailbox messages",
        "(2 x cores + 1 messages of 100 ms)",
        "about 770 on a Turin 2P",
        "774 messages",
        "2 * cores + 3 * sockets",
        "cores + 1",
    ] {
        assert!(states_a_cost(cost), "{cost}");
    }
    for other in ["384 cores, 2 sockets", "9 limiters × sockets", "port 7740", "cores + owners"] {
        assert!(!states_a_cost(other), "{other}");
    }
    let text = "a\n<!-- cost:begin: generated -->\n774\n<!-- cost:end -->\n774";
    assert_eq!(stated(text, false), [(1, "a"), (5, "774")]);
    assert_eq!(stated("// 774\nlet x = 774;", true), [(1, "// 774")]);
}
