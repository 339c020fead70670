//! `cargo xtask man OUTDIR`: man pages (clap_mangen) and bash, zsh and fish completions
//! (clap_complete) for both binaries, generated from the same `clap` definitions they parse.
//!
//! The packages install the copies kept in `packaging/man/` and `packaging/completions/` (so
//! that neither rpmbuild nor cargo-deb has to run xtask); a test regenerates them and fails when
//! they are stale (`UPDATE_GOLDEN=1` rewrites them), as it does for the `--help` goldens in
//! `docs/help/` and for the flag tables of `docs/frontend-flags.md` and the README.

use anyhow::{Context, Result};
use clap_complete::Shell;
use std::fs;
use std::path::{Path, PathBuf};

/// The binaries: name, `clap` definition, and the text of the man page's EXIT STATUS section.
fn binaries() -> [(&'static str, clap::Command, &'static str); 2] {
    [
        (
            "amd-hsmp-broker",
            amd_hsmp_broker::cli::command(),
            "0 after SIGTERM or SIGINT (a socket file created with \\-\\-listen is removed); \
             1 when start\\-up fails (the message names the step); 2 for a bad command line. \
             SIGHUP, SIGUSR1 and SIGUSR2 are ignored. A missing /dev/hsmp is not a start\\-up \
             failure: the broker serves and reports amd_hsmp_up 0.",
        ),
        (
            "amd-hsmp-exporter",
            amd_hsmp_exporter::cli::command(),
            "0 after a clean shutdown on SIGTERM or SIGINT; 1 when start\\-up fails (e.g. an \
             address cannot be bound); 2 for an invalid flag. A missing broker or device is \
             never a reason to exit: the exporter serves amd_hsmp_broker_up 0 or amd_hsmp_up 0.",
        ),
    ]
}

const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// One generated file: its path relative to the output directory, and its text.
struct Generated {
    path: PathBuf,
    text: String,
}

/// Every generated file: `man/NAME.1`, `completions/{bash/NAME,zsh/_NAME,fish/NAME.fish}`.
fn generate() -> Result<Vec<Generated>> {
    let mut files = Vec::new();
    for (name, command, exit_status) in binaries() {
        files.push(Generated {
            path: PathBuf::from(format!("man/{name}.1")),
            text: man_page(command.clone(), name, exit_status)?,
        });
        for shell in SHELLS {
            let mut command = command.clone();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut command, name, &mut out);
            let file = match shell {
                Shell::Bash => format!("bash/{name}"),
                Shell::Zsh => format!("zsh/_{name}"),
                _ => format!("fish/{name}.fish"),
            };
            files.push(Generated {
                path: PathBuf::from("completions").join(file),
                text: String::from_utf8(out).context("a completion script is not UTF-8")?,
            });
        }
    }
    Ok(files)
}

/// The man page: clap_mangen's sections, then EXIT STATUS and SEE ALSO. No date, so that the
/// page depends on the flags alone.
fn man_page(command: clap::Command, name: &str, exit_status: &str) -> Result<String> {
    let version = amd_hsmp_cli::version::VERSION;
    let man = clap_mangen::Man::new(command.version(version))
        .manual("amd-hsmp-exporter")
        .source(format!("amd-hsmp-exporter {version}"));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    let other = if name == "amd-hsmp-broker" { "amd-hsmp-exporter" } else { "amd-hsmp-broker" };
    let other = other.replace('-', "\\-");
    let see_also = format!(
        ".SH \"EXIT STATUS\"\n{exit_status}\n.SH \"SEE ALSO\"\n.BR {other} (1),\n\
         .BR systemd.socket (5)\n.PP\n\
         The operator's guide: /usr/share/doc/amd\\-hsmp\\-exporter/operator\\-guide.md\n"
    );
    out.extend_from_slice(see_also.as_bytes());
    String::from_utf8(out).context("the man page is not UTF-8")
}

/// `cargo xtask man OUTDIR`: writes the man pages and completions under `outdir`.
pub fn run(outdir: &Path) -> Result<()> {
    for file in generate()? {
        let path = outdir.join(&file.path);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        fs::write(&path, &file.text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::{expect_file, expect_files};
    use crate::workspace::root;

    /// The `--help` text of a binary, as `NAME --help` prints it (no colour off a terminal).
    fn long_help(mut command: clap::Command) -> String {
        command.render_long_help().to_string()
    }

    /// The long flags a command takes (`--name`), in definition order, and `--help`.
    fn long_flags(command: &clap::Command) -> Vec<String> {
        let mut flags: Vec<String> = command
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        flags.push("--help".into());
        flags
    }

    /// The flags named in the first column of the first table after the heading `heading`:
    /// each backquoted span's first word when it starts with `--`; `--[no-]x` names both.
    fn table_flags(markdown: &str, heading: &str) -> Result<Vec<String>> {
        let mut lines = markdown.lines().skip_while(|l| l.trim() != heading);
        lines.next().with_context(|| format!("no heading {heading:?}"))?;
        let rows: Vec<&str> = lines
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .collect();
        anyhow::ensure!(!rows.is_empty(), "no table after {heading:?}");
        let mut flags = Vec::new();
        for row in rows {
            let cell = row.trim_start_matches('|').split('|').next().unwrap_or_default();
            for span in cell.split('`').skip(1).step_by(2) {
                let word = span.split_whitespace().next().unwrap_or_default();
                if let Some(rest) = word.strip_prefix("--[no-]") {
                    flags.push(format!("--{rest}"));
                    flags.push(format!("--no-{rest}"));
                } else if word.starts_with("--") {
                    flags.push(word.split('=').next().unwrap_or(word).to_owned());
                }
            }
        }
        Ok(flags)
    }

    /// The flags of `command` that the table under `heading` in `markdown` does not list.
    fn undocumented(command: &clap::Command, markdown: &str, heading: &str) -> Result<Vec<String>> {
        let listed = table_flags(markdown, heading)?;
        Ok(long_flags(command).into_iter().filter(|f| !listed.contains(f)).collect())
    }

    #[test]
    fn packaged_man_pages_and_completions_are_generated_from_the_current_flags() {
        let files = generate().unwrap();
        assert_eq!(files.len(), 8);
        let files = files.into_iter().map(|f| (f.path.to_string_lossy().into_owned(), f.text));
        if let Err(e) = expect_files(&root().join("packaging"), &files.collect(), &[]) {
            panic!("stale generated files:\n{e:#}");
        }
    }

    #[test]
    fn man_pages_mention_every_flag() {
        for (name, command, _) in binaries() {
            let page = man_page(command.clone(), name, "").unwrap();
            assert!(page.contains(&format!(".TH {name} 1")), "no title in {name}.1");
            // clap_mangen escapes every hyphen in a flag name: `\-\-web.listen\-address`.
            for flag in long_flags(&command).iter().filter(|f| *f != "--help") {
                let roff = flag.replace('-', "\\-");
                assert!(page.contains(&roff), "{name}.1 does not mention {flag}");
            }
        }
        let broker = man_page(amd_hsmp_broker::cli::command(), "amd-hsmp-broker", "").unwrap();
        assert!(broker.contains("\\-\\-allow\\-uid"));
        let exporter =
            man_page(amd_hsmp_exporter::cli::command(), "amd-hsmp-exporter", "").unwrap();
        assert!(exporter.contains("\\-\\-web.listen\\-address"));
    }

    #[test]
    fn completions_offer_the_flags_of_each_binary() {
        let files = generate().unwrap();
        for (name, flag) in
            [("amd-hsmp-broker", "--allow-uid"), ("amd-hsmp-exporter", "--web.listen-address")]
        {
            for shell in
                [format!("bash/{name}"), format!("zsh/_{name}"), format!("fish/{name}.fish")]
            {
                let path = PathBuf::from("completions").join(&shell);
                let file = files.iter().find(|f| f.path == path).unwrap();
                let needle = if shell.starts_with("fish") {
                    format!("-l {}", flag.trim_start_matches("--"))
                } else {
                    flag.to_owned()
                };
                assert!(file.text.contains(&needle), "{shell} lacks {flag}");
            }
        }
    }

    #[test]
    fn help_output_matches_the_golden() {
        for (name, command, _) in binaries() {
            let path = root().join("docs/help").join(format!("{name}.txt"));
            expect_file(&path, &long_help(command)).unwrap();
        }
    }

    #[test]
    fn frontend_flags_doc_lists_every_exporter_flag() {
        let doc = fs::read_to_string(root().join("docs/frontend-flags.md")).unwrap();
        let missing = undocumented(&amd_hsmp_exporter::cli::command(), &doc, "## Flags").unwrap();
        assert!(missing.is_empty(), "docs/frontend-flags.md does not list {missing:?}");
    }

    #[test]
    fn readme_broker_table_lists_every_broker_flag() {
        let readme = fs::read_to_string(root().join("README.md")).unwrap();
        let missing =
            undocumented(&amd_hsmp_broker::cli::command(), &readme, "### amd-hsmp-broker").unwrap();
        assert!(missing.is_empty(), "README.md's amd-hsmp-broker table does not list {missing:?}");
    }

    #[test]
    fn a_flag_missing_from_a_table_is_named() {
        let doc = "# x\n\n## Flags\n\n| flag | meaning |\n|---|---|\n\
                   | `--log.level LEVEL` | a |\n| `--[no-]collector.prochot` | b |\n\n\
                   | `--web.telemetry-path` | not in the first table |\n";
        let listed = table_flags(doc, "## Flags").unwrap();
        assert_eq!(listed, ["--log.level", "--collector.prochot", "--no-collector.prochot"]);
        let missing = undocumented(&amd_hsmp_exporter::cli::command(), doc, "## Flags").unwrap();
        assert!(missing.contains(&"--web.telemetry-path".to_owned()), "{missing:?}");
        assert!(!missing.contains(&"--log.level".to_owned()), "{missing:?}");
        assert!(table_flags(doc, "## Nothing").is_err());
    }
}
