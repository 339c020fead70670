//! Golden files: masking the legitimately variable parts of a scrape, comparing byte for byte
//! with `tests/golden/<name>`, and rewriting the files when `UPDATE_GOLDEN=1`.
//!
//! Masked, and only these: the value of `amd_hsmp_scrape_duration_seconds` (wall-clock time),
//! the values of the `process_*` metrics (this process's CPU time, memory, descriptors, start
//! time) and the label values of `amd_hsmp_build_info` (version, git revision, compiler). Names,
//! labels, HELP/TYPE lines, order and every other value are compared exactly.
//!
//! On the landing page ([`mask_page`]): the time between the two samples power is taken from,
//! the time the view took, and the version and revision in the footer.

use std::path::{Path, PathBuf};

/// Set to `1` to write the golden files instead of comparing with them.
pub const UPDATE_ENV: &str = "UPDATE_GOLDEN";

/// What replaces a masked value.
pub const MASK: &str = "<masked>";

/// `tests/golden` in the source tree.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// Whether golden files are being rewritten.
pub fn updating() -> bool {
    std::env::var_os(UPDATE_ENV).is_some_and(|v| v == "1")
}

/// The workspace's root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("/")).to_owned()
}

/// `doc` with the text between the line `begin` and the line `end` replaced by `content` (which
/// ends with a newline).
pub fn replace_block(doc: &str, begin: &str, end: &str, content: &str) -> Result<String, String> {
    let start = doc.find(begin).ok_or_else(|| format!("no `{begin}` line"))? + begin.len();
    let stop = doc[start..].find(end).ok_or_else(|| format!("no `{end}` after `{begin}`"))? + start;
    Ok(format!("{}\n{content}{}", &doc[..start], &doc[stop..]))
}

/// Compares document `file` (relative to the workspace's root) with `want`, the figures the code
/// gives, or writes it when updating; the error shows the stale lines and names `refresh`, the
/// command that regenerates them.
pub fn check_document(file: &str, want: &str, refresh: &str) -> Result<(), String> {
    let path = workspace_root().join(file);
    let have = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if have == want {
        return Ok(());
    }
    if updating() {
        return std::fs::write(&path, want).map_err(|e| format!("{}: {e}", path.display()));
    }
    Err(format!(
        "{file} states figures other than the generated ones (- stated, + generated); refresh with \
         {refresh} and review the diff\n{}",
        diff(&have, want)
    ))
}

/// A fixture machine's name as the documents write it: `turin-2p` → `Turin 2P`.
pub fn machine_name(name: &str) -> String {
    name.split('-')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                let mut c = w.chars();
                c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
            } else {
                w.to_uppercase()
            }
        })
        .collect::<Vec<String>>()
        .join(" ")
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The metric name of a sample line (`name{labels} value` or `name value`).
fn sample_name(line: &str) -> &str {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    &line[..end]
}

/// Masks the variable parts of an exposition (text 0.0.4 or OpenMetrics).
pub fn mask(exposition: &str) -> String {
    let mut out = String::with_capacity(exposition.len());
    for line in exposition.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let name = if body.starts_with('#') { "" } else { sample_name(body) };
        let masked = if name == "amd_hsmp_scrape_duration_seconds" || name.starts_with("process_") {
            mask_value(body)
        } else if name == "amd_hsmp_build_info" {
            mask_label_values(body)
        } else {
            body.to_owned()
        };
        out.push_str(&masked);
        out.push_str(newline);
    }
    out
}

/// `name{labels} value` → `name{labels} <masked>`.
fn mask_value(line: &str) -> String {
    // Label values in these families hold no space, so the value follows the last one.
    match line.rfind(' ') {
        Some(i) => format!("{} {MASK}", &line[..i]),
        None => line.to_owned(),
    }
}

/// `name{a="x",b="y"} 1` → `name{a="<masked>",b="<masked>"} 1`.
fn mask_label_values(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_value = false;
    let mut escaped = false;
    let mut in_labels = false;
    for c in line.chars() {
        if in_value {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_value = false;
                    out.push_str(MASK);
                    out.push('"');
                }
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '{' => in_labels = true,
            '}' => in_labels = false,
            '"' if in_labels => in_value = true,
            _ => {}
        }
        out.push(c);
    }
    out
}

/// Masks the variable parts of the landing page: the interval of the power map's caption
/// (`over the last 1.0 s`: wall-clock time between two samples), and in the footer the version,
/// the revision and the time the view took. The watts are not masked: in static mode the
/// energy does not move between two samples, so every core reads 0 W.
pub fn mask_page(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    for line in html.split_inclusive('\n') {
        let mut line = mask_between(line, "over the last ", " s)");
        if line.starts_with("<p class=\"foot\">") {
            line = mask_between(&line, "version ", " (revision ");
            line = mask_between(&line, "(revision ", ")");
            line = mask_between(&line, " in ", " ms;");
        }
        out.push_str(&line);
    }
    out
}

/// `line` with the text between the first `start` and the next `end` after it masked.
fn mask_between(line: &str, start: &str, end: &str) -> String {
    let Some(from) = line.find(start).map(|i| i + start.len()) else { return line.to_owned() };
    let Some(to) = line[from..].find(end).map(|i| from + i) else { return line.to_owned() };
    format!("{}{MASK}{}", &line[..from], &line[to..])
}

/// Compares `actual` with the golden file `name` (or writes it when updating). The error is a
/// line diff, golden (`-`) against actual (`+`), with the command that refreshes the file.
pub fn check(name: &str, actual: &str) -> Result<(), String> {
    let path = golden_dir().join(name);
    if updating() {
        return std::fs::write(&path, actual)
            .map_err(|e| format!("cannot write {}: {e}", path.display()));
    }
    let want = match std::fs::read_to_string(&path) {
        Ok(want) => want,
        Err(e) => {
            return Err(format!(
                "cannot read golden file {} ({e}); create it with {UPDATE_ENV}=1 cargo test -p \
                 amd-hsmp-e2e and review it",
                path.display()
            ));
        }
    };
    if want == actual {
        return Ok(());
    }
    Err(format!(
        "output differs from {} (- golden, + actual); if the change is intended, refresh with \
         {UPDATE_ENV}=1 cargo test -p amd-hsmp-e2e -- --include-ignored and review the diff\n{}",
        path.display(),
        diff(&want, actual)
    ))
}

/// A line diff of `a` → `b` with two lines of context, from their longest common subsequence.
pub fn diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.split_inclusive('\n').collect();
    let b: Vec<&str> = b.split_inclusive('\n').collect();
    // lcs[i][j]: length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] =
                if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            ops.push(('+', b[j]));
            j += 1;
        } else {
            ops.push(('-', a[i]));
            i += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = String::new();
    let mut last_shown: Option<usize> = None;
    for (k, &(op, line)) in ops.iter().enumerate() {
        let near = changed.iter().any(|&c| c.abs_diff(k) <= CONTEXT);
        if !near {
            continue;
        }
        if last_shown.is_some_and(|l| l + 1 < k) || (last_shown.is_none() && k > 0) {
            out.push_str("@@\n");
        }
        out.push(op);
        out.push_str(line);
        if !line.ends_with('\n') {
            out.push_str("\n\\ no newline at end\n");
        }
        last_shown = Some(k);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "\
# HELP amd_hsmp_build_info Build information.
# TYPE amd_hsmp_build_info gauge
amd_hsmp_build_info{version=\"0.1.0\",revision=\"abc123\",rustversion=\"1.95.0\"} 1
amd_hsmp_core_energy_joules_total{core=\"0\",socket=\"0\"} 1000.0
amd_hsmp_scrape_duration_seconds 0.0123
process_cpu_seconds_total 0.05
process_open_fds 9
# EOF
";

    #[test]
    fn only_durations_process_metrics_and_build_labels_are_masked() {
        assert_eq!(
            mask(SCRAPE),
            "\
# HELP amd_hsmp_build_info Build information.
# TYPE amd_hsmp_build_info gauge
amd_hsmp_build_info{version=\"<masked>\",revision=\"<masked>\",rustversion=\"<masked>\"} 1
amd_hsmp_core_energy_joules_total{core=\"0\",socket=\"0\"} 1000.0
amd_hsmp_scrape_duration_seconds <masked>
process_cpu_seconds_total <masked>
process_open_fds <masked>
# EOF
"
        );
    }

    #[test]
    fn a_changed_value_shows_in_the_diff_with_context() {
        let changed = SCRAPE.replace("1000.0", "1000.5");
        let d = diff(SCRAPE, &changed);
        assert!(d.contains("-amd_hsmp_core_energy_joules_total{core=\"0\",socket=\"0\"} 1000.0\n"));
        assert!(d.contains("+amd_hsmp_core_energy_joules_total{core=\"0\",socket=\"0\"} 1000.5\n"));
        assert!(d.contains(" amd_hsmp_scrape_duration_seconds 0.0123\n"), "{d}");
        assert!(!d.contains("HELP"), "{d}");
        assert_eq!(diff(SCRAPE, SCRAPE), "");
    }

    #[test]
    fn the_page_masks_only_its_times_version_and_revision() {
        let page = "<figcaption>Power per core (0.00 to 0.00 W over the last 1.0 s)</figcaption>\n\
            <p class=\"foot\"><a href=\"/metrics\">Metrics</a> · version 0.1.0 (revision abc) · \
            this page took two samples in 1004 ms; reload for fresh values</p>\n";
        assert_eq!(
            mask_page(page),
            "<figcaption>Power per core (0.00 to 0.00 W over the last <masked> s)</figcaption>\n\
            <p class=\"foot\"><a href=\"/metrics\">Metrics</a> · version <masked> (revision \
            <masked>) · this page took two samples in <masked> ms; reload for fresh values</p>\n"
        );
    }

    #[test]
    fn escaped_quotes_in_label_values_are_masked_whole() {
        assert_eq!(
            mask_label_values(r#"amd_hsmp_build_info{version="a\"b",x="y"} 1"#),
            r#"amd_hsmp_build_info{version="<masked>",x="<masked>"} 1"#
        );
    }
}
