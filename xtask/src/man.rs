//! `cargo xtask man OUTDIR`: man pages (clap_mangen) and bash, zsh and fish completions
//! (clap_complete) for the three programs, generated from the same `clap` definitions they parse.
//!
//! The packages install the copies kept in `packaging/man/` and `packaging/completions/` (so
//! that neither rpmbuild nor cargo-deb has to run xtask); a test regenerates them and fails when
//! they are stale (`UPDATE_GOLDEN=1` rewrites them), as it does for the `--help` goldens in
//! `docs/help/` and for the flag tables of `docs/frontend-flags.md` and the README.

use anyhow::{Context, Result};
use clap_complete::Shell;
use std::fs;
use std::path::{Path, PathBuf};

/// One binary's man page: its name, `clap` definition, section (8 for the broker, a system
/// daemon, as sshd(8), and for amd-hsmp-check, run by the administrator; 1 for the exporter),
/// the page its SEE ALSO names, and the hand-written sections (roff) that follow the options.
struct Page {
    name: &'static str,
    command: clap::Command,
    section: &'static str,
    see_also: (&'static str, &'static str),
    exit_status: &'static str,
    files: &'static str,
    environment: &'static str,
    examples: &'static str,
}

/// The binaries and their man pages.
fn binaries() -> [Page; 3] {
    [
        Page {
            name: "amd-hsmp-broker",
            command: amd_hsmp_broker::command(),
            section: "8",
            see_also: ("amd-hsmp-exporter", "1"),
            exit_status: "0 after SIGTERM or SIGINT (a socket file created with \\-\\-listen is removed); \
             1 when start\\-up fails (the message names the step); 2 for a bad command line; \
             75 to start afresh after CPU hotplug (a core whose energy event was lost, or a CPU \
             offline at start\\-up, is online again; the unit takes it as a clean stop and its \
             socket starts the broker again). SIGHUP, SIGUSR1 and SIGUSR2 are ignored. A missing /dev/hsmp is not a start\\-up \
             failure: the broker serves and reports amd_hsmp_up 0.",
            files: ".TP\n/run/amd\\-hsmp/broker.sock\nThe socket systemd listens on for the broker \
             (amd\\-hsmp\\-broker.socket: mode 0660, group amd\\-hsmp\\-exporter).\n\
             .TP\n/etc/sysconfig/amd\\-hsmp\\-broker (RPM), /etc/default/amd\\-hsmp\\-broker (.deb)\n\
             Extra flags, in OPTIONS.\n\
             .TP\n/usr/lib/systemd/system/amd\\-hsmp\\-broker.socket, amd\\-hsmp\\-broker.service\n\
             The units.\n\
             .TP\n/usr/share/amd\\-hsmp\\-exporter/msr\\-fallback.conf\nThe MSR fallback's drop\\-in, \
             inactive until copied into /etc/systemd/system/amd\\-hsmp\\-broker.service.d/.\n\
             .TP\n/dev/hsmp, /dev/cpu/N/msr\nThe devices read (\\-\\-hsmp.device, \
             \\-\\-msr.device\\-root).\n",
            environment: ".TP\nOPTIONS\nExtra flags, from the unit\\*(Aqs EnvironmentFile.\n\
             .TP\nMSR_FALLBACK_FLAGS\nSet by the MSR drop\\-in to \
             \\-\\-collector.core\\-energy.msr\\-fallback.\n\
             .TP\nLISTEN_FDS, LISTEN_PID\nThe socket passed by systemd socket activation, used \
             without \\-\\-listen.\n",
            examples: "Serve by hand, without systemd, to the exporter\\*(Aqs user:\n.PP\n.nf\n\
             amd\\-hsmp\\-broker \\-\\-listen /run/amd\\-hsmp/broker.sock \\-\\-allow\\-user amd\\-hsmp\\-exporter\n.fi\n",
        },
        Page {
            name: "amd-hsmp-exporter",
            command: amd_hsmp_exporter::cli::command(),
            section: "1",
            see_also: ("amd-hsmp-broker", "8"),
            exit_status: "0 after a clean shutdown on SIGTERM or SIGINT; 1 when start\\-up fails (e.g. an \
             address cannot be bound); 2 for an invalid flag. A missing broker or device is \
             never a reason to exit: the exporter serves amd_hsmp_broker_up 0 or amd_hsmp_up 0.",
            files: ".TP\n/etc/sysconfig/amd\\-hsmp\\-exporter (RPM), /etc/default/amd\\-hsmp\\-exporter (.deb)\n\
             Extra flags, in OPTIONS.\n\
             .TP\n/usr/lib/systemd/system/amd\\-hsmp\\-exporter.service\nThe unit.\n\
             .TP\n/run/amd\\-hsmp/broker.sock\nThe broker\\*(Aqs socket (\\-\\-broker.socket).\n\
             .TP\n/usr/lib/firewalld/services/amd\\-hsmp\\-exporter.xml (RPM)\nfirewalld\\*(Aqs \
             service for tcp/10054.\n",
            environment: ".TP\nOPTIONS\nExtra flags, from the unit\\*(Aqs EnvironmentFile.\n",
            examples: "Serve on one address, then read the metrics:\n.PP\n.nf\n\
             amd\\-hsmp\\-exporter \\-\\-web.listen\\-address 10.0.0.5:10054\n\
             curl http://10.0.0.5:10054/metrics\n.fi\n.PP\n\
             Without the per\\-core boost limits:\n.PP\n.nf\n\
             amd\\-hsmp\\-exporter \\-\\-no\\-collector.boost\\-limit\n.fi\n",
        },
        Page {
            name: "amd-hsmp-check",
            command: amd_hsmp_broker::check::command(),
            section: "8",
            see_also: ("amd-hsmp-broker", "8"),
            exit_status: "0 when nothing a scrape needs fails (warnings included); 1 when a check \
             fails, or when the checks have not finished within \\-\\-check.timeout (a \
             deadline line names the one still waiting); 2 for a bad command line.",
            files: ".TP\n/etc/sysconfig/amd\\-hsmp\\-broker (RPM), /etc/default/amd\\-hsmp\\-broker (.deb)\n\
             The broker\\*(Aqs extra flags (OPTIONS), which it takes to check the service as \
             configured.\n\
             .TP\n/dev/hsmp, /dev/cpu/N/msr, /sys/bus/event_source/devices/power_core\n\
             The devices and the PMU checked (\\-\\-hsmp.device, \\-\\-msr.device\\-root).\n\
             .TP\n/run/amd\\-hsmp/broker.sock\nThe broker\\*(Aqs socket, asked for its protocol \
             (\\-\\-listen).\n",
            environment: ".TP\nOPTIONS\nNot read: give the broker\\*(Aqs flags on the command \
             line, as in EXAMPLES.\n",
            examples: "Check that a scrape can work on this machine, with the service\\*(Aqs \
             flags (the .deb\\*(Aqs file; the RPM\\*(Aqs is /etc/sysconfig/amd\\-hsmp\\-broker):\n\
             .PP\n.nf\n\
             (. /etc/default/amd\\-hsmp\\-broker; amd\\-hsmp\\-check $OPTIONS)\n.fi\n.PP\n\
             With the MSR fallback:\n.PP\n.nf\n\
             amd\\-hsmp\\-check \\-\\-collector.core\\-energy.msr\\-fallback\n.fi\n",
        },
    ]
}

const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// One generated file: its path relative to the output directory, and its text.
struct Generated {
    path: PathBuf,
    text: String,
}

/// Every generated file: `man/NAME.SECTION`,
/// `completions/{bash/NAME,zsh/_NAME,fish/NAME.fish}`.
fn generate() -> Result<Vec<Generated>> {
    let mut files = Vec::new();
    for page in binaries() {
        let (name, command) = (page.name, page.command.clone());
        files.push(Generated {
            path: PathBuf::from(format!("man/{name}.{}", page.section)),
            text: man_page(&page)?,
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

/// The man page: clap_mangen's title, name, description and options, a SYNOPSIS that shows
/// each option's argument, then EXIT STATUS, FILES, ENVIRONMENT, EXAMPLES and SEE ALSO. No date,
/// so that the page depends on the flags alone.
fn man_page(page: &Page) -> Result<String> {
    let version = amd_hsmp_cli::version::VERSION;
    let man = clap_mangen::Man::new(page.command.clone().version(version))
        .section(page.section)
        .manual("amd-hsmp-exporter")
        .source(format!("amd-hsmp-exporter {version}"));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    out.extend_from_slice(synopsis(&page.command, page.name).as_bytes());
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    let (other, other_section) = page.see_also;
    let other = other.replace('-', "\\-");
    let rest = format!(
        ".SH \"EXIT STATUS\"\n{}\n.SH FILES\n{}.SH ENVIRONMENT\n{}.SH EXAMPLES\n{}\
         .SH \"SEE ALSO\"\n.BR {other} ({other_section}),\n.BR systemd.socket (5)\n.PP\n\
         The operator's guide: /usr/share/doc/amd\\-hsmp\\-exporter/operator\\-guide.md\n",
        page.exit_status, page.files, page.environment, page.examples
    );
    out.extend_from_slice(rest.as_bytes());
    String::from_utf8(out).context("the man page is not UTF-8")
}

/// The SYNOPSIS: every option that is not hidden, with its argument (`[--listen PATH]`), where
/// clap_mangen's shows the option alone.
fn synopsis(command: &clap::Command, name: &str) -> String {
    let roff = |s: &str| s.replace('-', "\\-");
    let mut line = format!(".SH SYNOPSIS\n\\fB{}\\fR", roff(name));
    // Built, so that --help and --version are there and every argument's count is known.
    let mut command = command.clone();
    command.build();
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else { continue };
        let flag = match arg.get_short() {
            Some(short) => format!("\\fB\\-{short}\\fR|\\fB\\-\\-{}\\fR", roff(long)),
            None => format!("\\fB\\-\\-{}\\fR", roff(long)),
        };
        let takes_value = arg.get_action().takes_values();
        match arg.get_value_names().and_then(|v| v.first()) {
            Some(value) if takes_value => {
                line.push_str(&format!(" [{flag} \\fI{}\\fR]", roff(value.as_str())));
            }
            _ => line.push_str(&format!(" [{flag}]")),
        }
    }
    line.push('\n');
    line
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
        assert_eq!(files.len(), 12);
        let files = files.into_iter().map(|f| (f.path.to_string_lossy().into_owned(), f.text));
        if let Err(e) = expect_files(&root().join("packaging"), &files.collect(), &[]) {
            panic!("stale generated files:\n{e:#}");
        }
    }

    #[test]
    fn man_pages_mention_every_flag() {
        for page in binaries() {
            let (name, section) = (page.name, page.section);
            let text = man_page(&page).unwrap();
            assert!(text.contains(&format!(".TH {name} {section}")), "no title in {name}");
            // clap_mangen escapes every hyphen in a flag name: `\-\-web.listen\-address`.
            for flag in long_flags(&page.command).iter().filter(|f| *f != "--help") {
                let roff = flag.replace('-', "\\-");
                assert!(text.contains(&roff), "{name}.{section} does not mention {flag}");
            }
        }
    }

    #[test]
    fn man_pages_have_files_environment_examples_and_a_synopsis_with_arguments() {
        let [broker, exporter, check] = binaries();
        assert_eq!((broker.section, exporter.section), ("8", "1"), "the daemon is in section 8");
        for page in [&broker, &exporter, &check] {
            let text = man_page(page).unwrap();
            for section in [".SH FILES", ".SH ENVIRONMENT", ".SH EXAMPLES", ".SH SYNOPSIS"] {
                assert!(text.contains(section), "{} lacks {section}", page.name);
            }
            assert!(text.contains("/etc/default/") && text.contains("/etc/sysconfig/"));
        }
        let text = man_page(&broker).unwrap();
        assert!(text.contains("[\\fB\\-\\-listen\\fR \\fIPATH\\fR]"), "{text}");
        assert!(text.contains("[\\fB\\-\\-check\\fR]"), "{text}");
        assert!(text.contains(".BR amd\\-hsmp\\-exporter (1)"));
        let text = man_page(&exporter).unwrap();
        assert!(text.contains(".BR amd\\-hsmp\\-broker (8)"));
        // The program checks; its own flag for it is hidden.
        let text = man_page(&check).unwrap();
        assert!(text.contains("[\\fB\\-\\-check.timeout\\fR \\fIDURATION\\fR]"), "{text}");
        assert!(!text.contains("[\\fB\\-\\-check\\fR]"), "{text}");
        assert!(text.contains(".BR amd\\-hsmp\\-broker (8)"));
    }

    #[test]
    fn completions_offer_the_flags_of_each_binary() {
        let files = generate().unwrap();
        for (name, flag) in [
            ("amd-hsmp-broker", "--allow-uid"),
            ("amd-hsmp-exporter", "--web.listen-address"),
            ("amd-hsmp-check", "--check.timeout"),
        ] {
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
        for page in binaries() {
            let path = root().join("docs/help").join(format!("{}.txt", page.name));
            expect_file(&path, &long_help(page.command)).unwrap();
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
            undocumented(&amd_hsmp_broker::command(), &readme, "### amd-hsmp-broker").unwrap();
        assert!(missing.is_empty(), "README.md's amd-hsmp-broker table does not list {missing:?}");
    }

    /// The README's and docs/frontend-flags.md's flag tables say of each collector whether it is
    /// on by default as the collector table does: which families a default scrape has.
    #[test]
    fn the_flag_tables_give_each_collector_the_default_of_the_collector_table() {
        use amd_hsmp_exporter::collectors::Collector;
        for file in ["README.md", "docs/frontend-flags.md"] {
            let doc = fs::read_to_string(root().join(file)).unwrap();
            for collector in Collector::all() {
                let flag = format!("collector.{}`", collector.name());
                let first_cell = |l: &&str| l.split('|').nth(1).is_some_and(|c| c.contains(&flag));
                let rows: Vec<&str> =
                    doc.lines().filter(|l| l.starts_with("| `--")).filter(first_cell).collect();
                assert_eq!(rows.len(), 1, "{file}: the rows of --collector.{}", collector.name());
                let default = rows[0].split('|').nth(2).unwrap().trim();
                let want = if collector.row().on_by_default { "on" } else { "off" };
                let said = default.split([',', ' ']).next().unwrap();
                assert_eq!(said, want, "{file}: the default of {}: {}", collector.name(), rows[0]);
            }
        }
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
