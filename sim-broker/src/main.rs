//! `amd-hsmp-sim-broker`: `amd-hsmp-broker` serving the built-in firmware simulator instead of
//! this machine's devices, for the demo, dashboard work and the end-to-end suite. The same flags,
//! start-up sequence and lockdown as the broker ([`amd_hsmp_broker::daemon`]), plus the machine
//! profile (`--simulate`) and its events (`--simulate.scenario`). A binary of its own so that the
//! packaged, privileged broker links none of the simulator.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use amd_hsmp_broker::daemon::{Machine, Simulation};
use amd_hsmp_sim as sim;
use clap::builder::TypedValueParser as _;
use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser};
use std::process::ExitCode;
use std::time::Duration;

/// Serves the built-in firmware simulator of an AMD EPYC machine, as amd-hsmp-broker serves
/// /dev/hsmp: for demos, dashboards and tests, never for a production node.
#[derive(Debug, Parser)]
#[command(name = "amd-hsmp-sim-broker", about, long_about = None, disable_version_flag = true)]
struct Cli {
    /// Serve the built-in firmware simulator for this machine profile instead of the devices.
    /// The broker also serves its own uid, so that a user runs the demo without root.
    #[arg(long, value_name = "PROFILE", required_unless_present = "version",
          value_parser = clap::builder::PossibleValuesParser::new(sim::Profile::names())
              .try_map(|name| name.parse::<sim::Profile>()))]
    simulate: Option<sim::Profile>,

    /// The events the simulated machine goes through (for demos and the live check of the
    /// alerts): normal, thermal-event, prochot-flapping.
    #[arg(long = "simulate.scenario", value_name = "SCENARIO", default_value_t = sim::Scenario::Normal)]
    simulate_scenario: sim::Scenario,

    /// The instant the simulated machine's clock reads at start (RFC 3339, e.g.
    /// 2026-01-01T03:00:00Z); it runs at the real rate from there. Its load follows the day on
    /// that clock, so the instant decides whether a socket is at its power peak. Without the
    /// flag, the variable AMD_HSMP_SIMULATE_TIME; without either, this machine's clock. Each
    /// start at a fixed instant begins the day there again, counters included: for tests, which
    /// must not depend on the hour they run at.
    #[arg(long = "simulate.time", value_name = "RFC3339", value_parser = parse_instant)]
    simulate_time: Option<f64>,

    #[command(flatten)]
    broker: amd_hsmp_broker::Args,
}

/// The variable `--simulate.time` falls back to.
const TIME_VARIABLE: &str = "AMD_HSMP_SIMULATE_TIME";

/// An RFC 3339 instant as seconds after the Unix epoch.
fn parse_instant(text: &str) -> Result<f64, String> {
    let time = humantime::parse_rfc3339(text)
        .map_err(|e| format!("{e}: expected an RFC 3339 instant such as 2026-01-01T03:00:00Z"))?;
    time.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .map_err(|_| "the instant is before 1970".to_owned())
}

/// Where the simulated clock starts: `--simulate.time`, else [`TIME_VARIABLE`], else the
/// wall clock; a variable that does not parse is an error, never the wall clock.
fn clock(flag: Option<f64>, variable: Option<std::ffi::OsString>) -> Result<sim::Clock, String> {
    if let Some(at) = flag {
        return Ok(sim::Clock::from_unix(at));
    }
    match variable {
        None => Ok(sim::Clock::wall()),
        Some(value) => {
            let text = value.to_str().ok_or(format!("{TIME_VARIABLE} is not UTF-8"))?;
            parse_instant(text)
                .map(sim::Clock::from_unix)
                .map_err(|e| format!("{TIME_VARIABLE}={text:?}: {e}"))
        }
    }
}

/// The instant `clock` reads now, RFC 3339, for the start-up line.
fn instant(clock: &sim::Clock) -> String {
    let at = clock.epoch_s() + clock.now_s();
    let time = std::time::UNIX_EPOCH + Duration::from_secs_f64(at.max(0.0));
    humantime::format_rfc3339_seconds(time).to_string()
}

/// The simulated machine of `--simulate` and `--simulate.scenario`.
struct Simulated {
    profile: sim::Profile,
    scenario: sim::Scenario,
    clock: sim::Clock,
}

impl Simulation for Simulated {
    fn profile(&self) -> String {
        self.profile.to_string()
    }

    fn serve(&self) -> Machine {
        tracing::warn!(
            profile = %self.profile,
            scenario = %self.scenario,
            time = %instant(&self.clock),
            "SIMULATION: serving the built-in firmware simulator, not this machine's devices"
        );
        // A real mailbox round trip takes ~100 µs (the driver sleeps before its first poll), so
        // scrape durations in the demo look like a real machine's.
        let mut config = sim::FirmwareConfig::live();
        config.faults.latency = Duration::from_micros(100);
        config.scenario = self.scenario;
        config.clock = self.clock.clone();
        machine(sim::Machine::new(self.profile.spec(), config))
    }

    fn check(&self) -> Machine {
        let config =
            sim::FirmwareConfig { clock: self.clock.clone(), ..sim::FirmwareConfig::live() };
        machine(sim::Machine::new(self.profile.spec(), config))
    }
}

fn machine(machine: std::sync::Arc<sim::Machine>) -> Machine {
    Machine {
        topology: machine.topology().clone(),
        hsmp: Box::new(machine.hsmp_opener()),
        msr: Box::new(machine.msr_opener()),
        perf: Box::new(machine.perf_locator()),
        online: Some(Box::new(machine.online_cpus())),
    }
}

const PROGRAM: &str = "amd-hsmp-sim-broker";

/// The broker's flags the simulator ignores, by clap id: where the devices and the topology
/// are. Still accepted (a broker's command line runs unchanged), left out of `--help`.
const IGNORED: [&str; 5] = ["hsmp_device", "msr_device_root", "perf_pmu_root", "procfs", "sysfs"];

/// The command line: the broker's, with [`IGNORED`] hidden.
fn command() -> clap::Command {
    let command = amd_hsmp_broker::serving_rules(Cli::command());
    IGNORED.iter().fold(command, |cmd, id| cmd.mut_arg(*id, |a| a.hide(true)))
}

fn main() -> ExitCode {
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.simulate {
        Some(profile) => {
            let clock = match clock(cli.simulate_time, std::env::var_os(TIME_VARIABLE)) {
                Ok(clock) => clock,
                Err(e) => command().error(ErrorKind::ValueValidation, e).exit(),
            };
            let simulated = Simulated { profile, scenario: cli.simulate_scenario, clock };
            // The checks on the simulated machine: in this process, which holds it.
            if cli.broker.check {
                return amd_hsmp_broker::check::main(PROGRAM, cli.broker, Some(&simulated));
            }
            amd_hsmp_broker::daemon::main(PROGRAM, cli.broker, Some(&simulated))
        }
        // `--version` alone: answered before anything is opened.
        None if cli.broker.common.version => {
            amd_hsmp_broker::daemon::main(PROGRAM, cli.broker, None)
        }
        None => command()
            .error(ErrorKind::MissingRequiredArgument, "--simulate PROFILE is required")
            .exit(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_the_profiles_and_leaves_out_the_flags_the_simulator_ignores() {
        let help = command().render_long_help().to_string();
        for profile in sim::Profile::names() {
            assert!(help.contains(profile), "{profile} missing:\n{help}");
        }
        for flag in ["--hsmp.device", "--msr.device-root", "--path.procfs", "--path.sysfs"] {
            assert!(!help.contains(flag), "{flag} in:\n{help}");
        }
        assert!(help.contains("--simulate.scenario") && help.contains("--listen"));
        // Still accepted, so a broker's command line runs unchanged.
        let m = command()
            .try_get_matches_from(["x", "--simulate", "milan-1p", "--hsmp.device", "/dev/null"])
            .map_err(|e| e.to_string())
            .and_then(|m| Cli::from_arg_matches(&m).map_err(|e| e.to_string()));
        assert!(matches!(m, Ok(Cli { simulate: Some(sim::Profile::Milan1p), .. })), "{m:?}");
    }

    #[test]
    fn the_simulated_instant_comes_from_the_flag_then_the_variable_and_a_bad_one_is_an_error() {
        let at = |flag: Option<f64>, var: Option<&str>| {
            clock(flag, var.map(Into::into)).map(|c| (c.epoch_s() / 60.0).round() * 60.0)
        };
        let three = 1_767_236_400.0; // 2026-01-01T03:00:00Z
        assert_eq!(parse_instant("2026-01-01T03:00:00Z"), Ok(three));
        assert_eq!(at(Some(three), Some("2026-01-01T19:00:00Z")), Ok(three));
        assert_eq!(at(None, Some("2026-01-01T19:00:00Z")), Ok(three + 16.0 * 3600.0));
        let e = at(None, Some("19:00"));
        assert!(
            e.as_ref().is_err_and(|e| e.contains(TIME_VARIABLE) && e.contains("RFC 3339")),
            "{e:?}"
        );
        assert!(parse_instant("yesterday").is_err());
        assert_eq!(instant(&sim::Clock::from_unix(three)), "2026-01-01T03:00:00Z");
        let m = command().try_get_matches_from([
            "x",
            "--simulate",
            "milan-1p",
            "--simulate.time",
            "03:00",
        ]);
        assert!(m.is_err(), "a bad instant is refused by the command line");
    }

    #[test]
    fn the_command_line_is_well_formed() {
        command().debug_assert();
    }
}
