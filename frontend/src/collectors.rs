//! The exporter's collector table: one row per collector, from which its `--collector.NAME` and
//! `--no-collector.NAME` flags, their help, its default and its `collector` label are made, as
//! node_exporter's `registerCollector(name, defaultEnabled, factory)` makes them from one call.
//!
//! A collector is a broker [`Family`] (the broker is asked for it only while it is on) or one of
//! the exporter's own ([`Collector::CoreOwner`], which reads the cgroup hierarchy). A new family
//! is one row in [`Collector::row`], which the compiler asks for.

use amd_hsmp_proto::{Families, Family, PerFamily};
use clap::{Arg, ArgAction, ArgMatches, Command, FromArgMatches};

/// One collector of the exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collector {
    /// A family the broker reads.
    Family(Family),
    /// The owner of each core, from the cgroup v2 cpusets (`--path.cgroupfs`).
    CoreOwner,
}

/// What the table says of one collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Whether it runs when neither of its flags is given.
    pub on_by_default: bool,
    /// What it exports, completing "Export …" in the help of `--collector.NAME`.
    pub exports: &'static str,
    /// The help of `--no-collector.NAME`: what turning it off saves (no final period, as clap
    /// prints help).
    pub off: &'static str,
}

impl Collector {
    /// Every collector, in the order of their flags in `--help`.
    pub fn all() -> impl Iterator<Item = Collector> {
        Family::ALL.into_iter().map(Collector::Family).chain([Collector::CoreOwner])
    }

    /// The collector name: `--collector.NAME`, the `collector` label of
    /// `amd_hsmp_scrape_errors_total`.
    pub fn name(self) -> &'static str {
        match self {
            Collector::Family(family) => family.name(),
            Collector::CoreOwner => "core-owner",
        }
    }

    /// The collector's row of the table.
    pub fn row(self) -> Row {
        let (on_by_default, exports, off) = match self {
            Collector::Family(Family::CoreEnergy) => (
                true,
                "per-core energy",
                "Do not export per-core energy; the broker is not asked for it",
            ),
            Collector::Family(Family::BoostLimit) => (
                true,
                "per-core boost limits",
                "Do not export per-core boost limits; the broker is not asked for them",
            ),
            Collector::Family(Family::Prochot) => (
                true,
                "per-socket PROCHOT status",
                "Do not export PROCHOT status; the broker is not asked for it",
            ),
            Collector::Family(Family::FrequencyLimit) => (
                true,
                "per-socket frequency limits and the limiters imposing them",
                "Do not export socket frequency limits; the broker is not asked for them",
            ),
            Collector::Family(Family::CoreFrequencyLimit) => (
                false,
                "per-core frequency limits, which costs one mailbox message per core a scrape",
                "Do not export per-core frequency limits; the broker is not asked for them (the \
                 default)",
            ),
            Collector::Family(Family::PackageEnergy) => (
                true,
                "per-socket package energy, the cores and the uncore beside them (HSMP \
                 GET_RAPL_PACKAGE_COUNTER, where the firmware answers it)",
                "Do not export per-socket package energy; the broker is not asked for it",
            ),
            Collector::CoreOwner => (
                false,
                "which workload each physical core is assigned to, from the cgroup v2 cpusets \
                 under --path.cgroupfs",
                "Do not export core owners; the cgroup hierarchy is not read (the default)",
            ),
        };
        Row { on_by_default, exports, off }
    }

    fn on_flag(self) -> String {
        format!("collector.{}", self.name())
    }

    fn off_flag(self) -> String {
        format!("no-collector.{}", self.name())
    }
}

/// Which collectors run: the table's defaults, changed by the flags (the last of a
/// collector's two flags wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collectors {
    families: PerFamily<bool>,
    core_owner: bool,
}

impl Default for Collectors {
    /// The table's defaults.
    fn default() -> Collectors {
        Collectors {
            families: PerFamily::from_fn(|family| Collector::Family(family).row().on_by_default),
            core_owner: Collector::CoreOwner.row().on_by_default,
        }
    }
}

impl Collectors {
    /// Whether `collector` runs.
    pub fn is_on(&self, collector: Collector) -> bool {
        match collector {
            Collector::Family(family) => self.families[family],
            Collector::CoreOwner => self.core_owner,
        }
    }

    fn set(&mut self, collector: Collector, on: bool) {
        match collector {
            Collector::Family(family) => self.families[family] = on,
            Collector::CoreOwner => self.core_owner = on,
        }
    }

    /// The families the broker is asked for.
    pub fn families(&self) -> Families {
        let mut families = Families::default();
        for (family, &on) in self.families.iter() {
            families.set(family, on);
        }
        families
    }
}

impl FromArgMatches for Collectors {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Collectors, clap::Error> {
        let mut collectors = Collectors::default();
        collectors.update_from_arg_matches(matches)?;
        Ok(collectors)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for collector in Collector::all() {
            // The two flags override each other, so at most one of them is still set.
            if matches.get_flag(&collector.on_flag()) {
                self.set(collector, true);
            } else if matches.get_flag(&collector.off_flag()) {
                self.set(collector, false);
            }
        }
        Ok(())
    }
}

impl clap::Args for Collectors {
    fn augment_args(mut command: Command) -> Command {
        for collector in Collector::all() {
            let row = collector.row();
            let default = if row.on_by_default { "on" } else { "off" };
            let (on, off) = (collector.on_flag(), collector.off_flag());
            command = command
                .arg(
                    Arg::new(on.clone())
                        .long(on.clone())
                        .action(ArgAction::SetTrue)
                        .overrides_with(off.clone())
                        .help(format!("Export {} ({default} by default)", row.exports)),
                )
                .arg(
                    Arg::new(off.clone())
                        .long(off)
                        .action(ArgAction::SetTrue)
                        .overrides_with(on)
                        .help(row.off),
                );
        }
        command
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Only {
        #[command(flatten)]
        collectors: Collectors,
    }

    fn parse(args: &[&str]) -> Collectors {
        Only::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
            .unwrap()
            .collectors
    }

    #[test]
    fn every_collector_has_both_flags_and_its_default_without_them() {
        let none = parse(&[]);
        for collector in Collector::all() {
            let name = collector.name();
            assert_eq!(none.is_on(collector), collector.row().on_by_default, "{name}");
            assert!(parse(&[&format!("--collector.{name}")]).is_on(collector), "{name}");
            assert!(!parse(&[&format!("--no-collector.{name}")]).is_on(collector), "{name}");
        }
    }

    #[test]
    fn the_last_of_a_collectors_two_flags_wins() {
        for collector in Collector::all() {
            let name = collector.name();
            let (on, off) = (format!("--collector.{name}"), format!("--no-collector.{name}"));
            assert!(parse(&[&off, &on]).is_on(collector), "{name}");
            assert!(!parse(&[&on, &off]).is_on(collector), "{name}");
            assert!(!parse(&[&on, &off, &on, &off]).is_on(collector), "{name}");
        }
    }

    #[test]
    fn turning_one_collector_off_asks_the_broker_for_every_other_family() {
        let default = Families::ALL.without(Family::CoreFrequencyLimit);
        assert_eq!(parse(&[]).families(), default, "all but the per-core frequency limit");
        let every = ["--collector.core-frequency-limit"];
        assert_eq!(parse(&every).families(), Families::ALL);
        for family in Family::ALL {
            let off = parse(&[every[0], &format!("--no-collector.{family}")]).families();
            assert!(!off.contains(family), "{family}");
            assert_eq!(off.iter().count(), Family::COUNT - 1, "{family}");
        }
        let owner = parse(&["--collector.core-owner"]);
        assert_eq!(owner.families(), default, "the core owners are not the broker's");
    }

    #[test]
    fn collector_names_are_unique() {
        let mut names: Vec<&str> = Collector::all().map(Collector::name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
