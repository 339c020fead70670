//! xtask's golden files: the packages' expected contents, the mixin's generated rule files and
//! dashboards, the man pages, completions and `--help` texts. Each is text xtask makes now,
//! compared with the committed file; with `UPDATE_GOLDEN=1` the committed file is written over,
//! to be reviewed as a diff.

use anyhow::{Context, Result, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Whether the golden files are to be rewritten: `UPDATE_GOLDEN=1`.
pub fn updating() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1")
}

/// Compares `actual` with the file at `path`, or writes it there when [`updating`]. A difference
/// is shown line by line (`-` committed, `+` made now).
pub fn expect_file(path: &Path, actual: &str) -> Result<()> {
    if updating() {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, actual).with_context(|| format!("cannot write {}", path.display()))?;
        println!("rewrote {}", path.display());
        return Ok(());
    }
    let expected = fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {}; create it by running the check with UPDATE_GOLDEN=1",
            path.display()
        )
    })?;
    if expected == actual {
        return Ok(());
    }
    let diff = line_diff(&expected, actual);
    bail!(
        "{} differs from what was built (- expected, + built):\n{diff}accept by running the check \
         again with UPDATE_GOLDEN=1 and review the diff",
        path.display()
    )
}

/// The lines of `expected` that `actual` lacks (`- `) and those it adds (`+ `), each in its
/// text's order; a note when both have the same lines.
pub fn line_diff(expected: &str, actual: &str) -> String {
    let expected_lines: BTreeSet<&str> = expected.lines().collect();
    let actual_lines: BTreeSet<&str> = actual.lines().collect();
    let mut diff = String::new();
    for line in expected.lines().filter(|l| !actual_lines.contains(l)) {
        diff.push_str(&format!("- {line}\n"));
    }
    for line in actual.lines().filter(|l| !expected_lines.contains(l)) {
        diff.push_str(&format!("+ {line}\n"));
    }
    if diff.is_empty() {
        diff.push_str("(same lines, different order or repetition)\n");
    }
    diff
}

/// [`expect_file`] for every file of `files` (a path under `dir` and its text), naming each one
/// that differs; and in each directory of `owned` (under `dir`, made only by this check), a file
/// that `files` lacks is an error too, removed when [`updating`]. Returns how many were removed.
pub fn expect_files(dir: &Path, files: &BTreeMap<String, String>, owned: &[&str]) -> Result<usize> {
    let mut problems = Vec::new();
    for (name, text) in files {
        if let Err(e) = expect_file(&dir.join(name), text) {
            problems.push(format!("{e:#}"));
        }
    }
    let mut removed = 0;
    for sub in owned {
        let listed = dir.join(sub);
        for entry in
            fs::read_dir(&listed).with_context(|| format!("cannot list {}", listed.display()))?
        {
            let name = format!("{sub}/{}", entry?.file_name().to_string_lossy());
            if files.contains_key(&name) {
                continue;
            }
            if updating() {
                fs::remove_file(dir.join(&name))
                    .with_context(|| format!("cannot remove {name}"))?;
                removed += 1;
            } else {
                problems.push(format!("{name}: nothing makes it any more"));
            }
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Out of `UPDATE_GOLDEN=1` (as `cargo test` runs), a committed file that differs from what
    /// is made, and a file in an owned directory that nothing makes, are both named.
    #[test]
    fn a_changed_file_and_a_file_nothing_makes_are_both_reported() {
        if updating() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("out")).unwrap();
        fs::write(dir.path().join("out/kept.json"), "same\n").unwrap();
        fs::write(dir.path().join("out/old.json"), "orphan\n").unwrap();
        fs::write(dir.path().join("rules.yaml"), "a: 1\nb: 2\n").unwrap();
        let files: BTreeMap<String, String> = [
            ("out/kept.json".to_owned(), "same\n".to_owned()),
            ("rules.yaml".to_owned(), "a: 1\nb: 3\n".to_owned()),
        ]
        .into();
        let err = expect_files(dir.path(), &files, &["out"]).unwrap_err().to_string();
        assert!(err.contains("rules.yaml differs") && err.contains("- b: 2\n+ b: 3"), "{err}");
        assert!(err.contains("out/old.json: nothing makes it any more"), "{err}");
        assert!(!err.contains("kept"), "{err}");
        fs::remove_file(dir.path().join("out/old.json")).unwrap();
        fs::write(dir.path().join("rules.yaml"), "a: 1\nb: 3\n").unwrap();
        assert_eq!(expect_files(dir.path(), &files, &["out"]).unwrap(), 0);
    }
}
