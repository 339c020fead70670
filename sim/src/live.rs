//! The live machine behind [`crate::Mode::Live`]: per-core power that follows a daily load
//! pattern and stays within the simulated SKU's TDP, boost limits at the SKU's maximum that drop
//! only during power or thermal events, and PROCHOT episodes that occur and clear, all a pure
//! function of the seed, the [`Scenario`] and the time read from a [`Clock`], whose instant of
//! the day is an input ([`Clock::from_unix`], `--simulate.time`).
//!
//! The model, per socket `s` and core `i` at simulated time `t` (seconds since start):
//!
//! - load `L_i(t)` in [0, 1]: a daily wave of the socket (0.3 at night to 0.8 at the peak, the
//!   same phase on every socket of the machine), a job wave of 15 to 45 minutes (±0.08), and a
//!   wave of the core (±0.03 to ±0.12, 2 to 10 minutes) around a bias of its own (±0.05);
//! - power `P_i(t) = idle + (core_max − idle) × L_i(t)`, where `core_max` is the cores' share of
//!   the TDP ([`CORE_SHARE_OF_TDP`]) divided among the socket's cores and `idle` is
//!   [`IDLE_SHARE`] of it, so the cores of a socket never draw more than 75 % of its TDP (the
//!   rest is the I/O die's); under PROCHOT it is [`PROCHOT_POWER`] of that;
//! - package energy of a socket: its cores' energy plus the I/O die and uncore, which draw a
//!   constant [`UNCORE_SHARE`] of the TDP the cores leave them, since the epoch;
//! - energy: what a hardware counter holds, which a restart of the simulating process does not
//!   reset: a starting offset drawn from the seed (up to one 32-bit MSR wrap, so wraps come at
//!   different times) plus, at the simulation's start, the closed-form integral of the power
//!   without PROCHOT or clamping since a fixed epoch (the Unix epoch of the simulated clock), so
//!   that a new process on the real clock continues where the last one was, never back; from
//!   the start on, each step of [`STEP_S`] adds the step's energy (Simpson's rule over the
//!   clamped power, PROCHOT included: positive weights, so never more than the step's highest
//!   power allows), spread evenly over the step. The counter therefore never advances faster
//!   than a core's cap over any window, however short: an integral of the clamped power by
//!   left rectangles, as this model had before, ran above the cap within a step as the load
//!   rose into the clamp (up to 1.962 W of Turin's 1.953 W over one second);
//! - boost limit: the SKU's maximum, except during a power event (the socket's load above
//!   [`POWER_EVENT_LOAD`]: its loaded cores lose 100 to 400 MHz, redrawn every 30 s) and under
//!   PROCHOT (every core of the socket at [`PROCHOT_BOOST`] of the maximum);
//! - socket frequency limit: under PROCHOT the PROCHOT boost limit, imposed by PROCHOT and
//!   cHTC; during a power event PPT, 100 to 400 MHz below the maximum as the socket's load
//!   rises from [`POWER_EVENT_LOAD`] to its daily peak; otherwise the maximum, imposed by the
//!   part's OPN maximum; a core's limit is the lower of its boost limit and its socket's;
//! - PROCHOT: in [`Scenario::Normal`], short episodes (10 s to 2 min) in about 3 % of each
//!   socket's 15-minute slots, none in the first slot; the other scenarios add a schedule.

use crate::profile::MachineSpec;
use amd_hsmp_device::messages::{LimitReasons, SocketFreqLimit};
use std::f64::consts::TAU;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Share of a socket's TDP its cores draw at full load; the rest is the I/O die and uncore.
pub const CORE_SHARE_OF_TDP: f64 = 0.75;
/// The power the I/O die and uncore draw beside the cores, as a share of the TDP the cores
/// leave them (1 − [`CORE_SHARE_OF_TDP`]): constant, so a socket never draws above its TDP.
pub const UNCORE_SHARE: f64 = 0.6;
/// A core's idle power as a share of its full-load power.
pub const IDLE_SHARE: f64 = 0.15;
/// Socket load above which the socket is at its power limit and trims its loaded cores' boost.
pub const POWER_EVENT_LOAD: f64 = 0.8;
/// Boost limit under PROCHOT, as a share of the SKU's maximum.
pub const PROCHOT_BOOST: f64 = 0.6;
/// Power under PROCHOT, as a share of what the load would draw.
pub const PROCHOT_POWER: f64 = 0.55;
/// How far a power event's PPT limit holds a socket below the maximum, MHz: the least at
/// [`POWER_EVENT_LOAD`], the most at [`PEAK_SOCKET_LOAD`] (the same range as the boost trims).
pub const PPT_TRIM_MHZ: (u32, u32) = (100, 400);
/// The highest load of a socket: the daily wave's peak plus the job wave's.
pub const PEAK_SOCKET_LOAD: f64 = 0.88;
/// When a scenario's first event starts, s: long enough for a Prometheus scraping every 15 s
/// to see the socket healthy first (AmdHsmpBoostLimitLow compares with the day's maximum).
pub const SCENARIO_WARM_UP_S: f64 = 15.0;

/// 2026-01-01T00:00:00Z, s after the Unix epoch: the day [`Live::daily_peak_s`] looks at.
pub const DAY_2026_01_01: f64 = 1_767_225_600.0;
/// Integration step of the energy counters, s.
const STEP_S: f64 = 1.0;
/// One day, s.
const DAY_S: f64 = 86_400.0;
/// PROCHOT slot of [`Scenario::Normal`], s.
const THERMAL_SLOT_S: f64 = 900.0;
/// Share of the slots with an episode.
const THERMAL_SLOT_SHARE: f64 = 0.03;
/// How long a power event's boost trim of one core lasts before it is redrawn, s.
const POWER_SLOT_S: f64 = 30.0;

/// A schedule of events on top of the normal machine: what `--simulate.scenario` selects, for
/// demos and for the live check of the alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scenario {
    /// The machine as it usually is: load following the day, rare short PROCHOT episodes, boost
    /// trims and a PPT frequency limit at the daily peak. No alert of the mixin fires on it.
    #[default]
    Normal,
    /// The last socket overheats: from 15 s after start it holds PROCHOT for 20 minutes, its
    /// boost limits and its frequency limit (imposed by PROCHOT and cHTC) at 60 % of the
    /// maximum and its power cut, then recovers; every hour. Fires
    /// AmdHsmpProchotAsserted (after 5 minutes), AmdHsmpBoostLimitLow and
    /// AmdHsmpFrequencyLimited (after 15 minutes) and, since 20 minutes is a third of an hour,
    /// AmdHsmpProchotFrequent.
    ThermalEvent,
    /// Socket 0 throttles again and again: from 15 s after start, PROCHOT for 1 minute of every
    /// 3. Fires AmdHsmpProchotFrequent (a third of the hour) and never AmdHsmpProchotAsserted
    /// (no episode lasts 5 minutes) nor AmdHsmpBoostLimitLow and AmdHsmpFrequencyLimited (no
    /// dip lasts 15 minutes).
    ProchotFlapping,
}

/// A scenario name that is not one of [`Scenario::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown simulator scenario {name:?}, expected one of: {}", Scenario::names().join(", "))]
pub struct UnknownScenario {
    /// The name given.
    pub name: String,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 3] =
        [Scenario::Normal, Scenario::ThermalEvent, Scenario::ProchotFlapping];

    /// The name accepted by `--simulate.scenario`.
    pub const fn name(self) -> &'static str {
        match self {
            Scenario::Normal => "normal",
            Scenario::ThermalEvent => "thermal-event",
            Scenario::ProchotFlapping => "prochot-flapping",
        }
    }

    /// The names of [`Scenario::ALL`].
    pub fn names() -> Vec<&'static str> {
        Scenario::ALL.iter().map(|s| s.name()).collect()
    }

    /// Whether the scenario's own schedule holds PROCHOT on `socket` of `sockets` at `t`.
    fn scheduled_prochot(self, socket: u32, sockets: u32, t: f64) -> bool {
        match self {
            Scenario::Normal => false,
            Scenario::ThermalEvent => {
                socket + 1 == sockets && in_window(t, SCENARIO_WARM_UP_S, 1200.0, 3600.0)
            }
            Scenario::ProchotFlapping => {
                socket == 0 && in_window(t, SCENARIO_WARM_UP_S, 60.0, 180.0)
            }
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = UnknownScenario;

    fn from_str(s: &str) -> Result<Scenario, UnknownScenario> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.name() == s)
            .ok_or_else(|| UnknownScenario { name: s.to_owned() })
    }
}

/// Whether `t` falls in `[start + k × period, start + k × period + len)` for some `k ≥ 0`.
fn in_window(t: f64, start: f64, len: f64, period: f64) -> bool {
    t >= start && (t - start).rem_euclid(period) < len
}

/// Where the live firmware reads the time from.
#[derive(Debug, Clone)]
pub enum Clock {
    /// Real time since `start`, on a simulated clock that read `epoch_s` seconds after the Unix
    /// epoch at `start`: the real day for the demo ([`Clock::wall`]), a chosen instant of the
    /// day for tests ([`Clock::from_unix`], `--simulate.time`).
    Wall {
        /// When the simulation started.
        start: Instant,
        /// Seconds from the Unix epoch to `start` on the simulated clock.
        epoch_s: f64,
    },
    /// Time set by a test, shared with every clone of the handle; the counters' epoch is the
    /// start of the simulation.
    Manual(ManualClock),
}

impl Clock {
    /// Wall-clock time from now on: the simulated day is this machine's.
    pub fn wall() -> Clock {
        let epoch_s = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Clock::from_unix(epoch_s.as_secs_f64())
    }

    /// A clock that reads `epoch_s` seconds after the Unix epoch now and runs at the real rate
    /// from there: the instant of the simulated day is an input, whatever the wall clock says.
    pub fn from_unix(epoch_s: f64) -> Clock {
        Clock::Wall { start: Instant::now(), epoch_s: epoch_s.max(0.0) }
    }

    /// Seconds since the simulation started: the time scenarios are scheduled on.
    pub fn now_s(&self) -> f64 {
        match self {
            Clock::Wall { start, .. } => start.elapsed().as_secs_f64(),
            Clock::Manual(manual) => manual.get().as_secs_f64(),
        }
    }

    /// Seconds from the energy counters' epoch to the start of the simulation: where a new
    /// process continues the counters (see [`Live::since_epoch`]).
    pub fn epoch_s(&self) -> f64 {
        match self {
            Clock::Wall { epoch_s, .. } => *epoch_s,
            Clock::Manual(_) => 0.0,
        }
    }
}

impl PartialEq for Clock {
    fn eq(&self, other: &Clock) -> bool {
        match (self, other) {
            (Clock::Wall { start: a, .. }, Clock::Wall { start: b, .. }) => a == b,
            (Clock::Manual(a), Clock::Manual(b)) => Arc::ptr_eq(&a.0, &b.0),
            _ => false,
        }
    }
}

impl Eq for Clock {}

/// A clock that moves only when told: tests put the live machine at any instant of its day.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at `t` since the start.
    pub fn at(t: Duration) -> ManualClock {
        let clock = ManualClock::default();
        clock.set(t);
        clock
    }

    /// The time since the start.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }

    /// Sets the time since the start.
    pub fn set(&self, t: Duration) {
        self.0.store(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// Moves the clock on by `d`.
    pub fn advance(&self, d: Duration) {
        self.set(self.get().saturating_add(d));
    }
}

/// One socket's load waves.
#[derive(Debug, Clone, Copy)]
struct SocketWave {
    day_phase: f64,
    job_omega: f64,
    job_phase: f64,
}

/// One core's load wave.
#[derive(Debug, Clone, Copy)]
struct CoreWave {
    socket: u32,
    bias: f64,
    amp: f64,
    omega: f64,
    phase: f64,
    offset_j: f64,
}

/// A core's energy since `t` = 0, counted up to a whole step.
#[derive(Debug, Clone, Copy, Default)]
struct Integral {
    steps: u64,
    joules: f64,
}

/// The live model of one machine; see the module documentation.
#[derive(Debug)]
pub struct Live {
    seed: u64,
    scenario: Scenario,
    sockets: u32,
    boost_mhz: u32,
    core_max_w: f64,
    idle_w: f64,
    uncore_w: f64,
    socket_waves: Vec<SocketWave>,
    cores: Vec<CoreWave>,
    /// Seconds from the counters' epoch to `t` = 0: the load waves run on the time since it.
    epoch_s: f64,
    /// Per core, what its counter holds at `t` = 0: its offset and, since the epoch, the
    /// closed-form energy of [`Live::energy_before_start_j`]; set with the epoch.
    start_j: Vec<f64>,
    /// Per core, the energy counted since `t` = 0 over whole steps.
    integrals: Vec<Mutex<Integral>>,
}

impl Live {
    /// The live model of `spec`, whose cores are numbered in (socket, core) order.
    pub fn new(spec: &MachineSpec, seed: u64, scenario: Scenario) -> Live {
        let per_socket = spec.core_ids.len().max(1) as f64;
        let core_max_w = CORE_SHARE_OF_TDP * f64::from(spec.tdp_w) / per_socket;
        // The whole machine shares one day; sockets differ in their jobs.
        let day_phase = TAU * unit(seed, 0xDA7, 0);
        let socket_waves = (0..spec.sockets)
            .map(|s| SocketWave {
                day_phase,
                job_omega: TAU / (900.0 + 1800.0 * unit(seed, 0x50C, u64::from(s))),
                job_phase: TAU * unit(seed, 0x50D, u64::from(s)),
            })
            .collect();
        let mut cores = Vec::new();
        for socket in 0..spec.sockets {
            for _ in &spec.core_ids {
                let i = cores.len() as u64;
                cores.push(CoreWave {
                    socket,
                    bias: 0.1 * unit(seed, i, 1) - 0.05,
                    amp: 0.03 + 0.09 * unit(seed, i, 2),
                    omega: TAU / (120.0 + 480.0 * unit(seed, i, 3)),
                    phase: TAU * unit(seed, i, 4),
                    offset_j: 65_536.0 * unit(seed, i, 5),
                });
            }
        }
        Live {
            seed,
            scenario,
            sockets: spec.sockets,
            boost_mhz: spec.boost_mhz,
            core_max_w,
            idle_w: IDLE_SHARE * core_max_w,
            uncore_w: UNCORE_SHARE * (1.0 - CORE_SHARE_OF_TDP) * f64::from(spec.tdp_w),
            socket_waves,
            epoch_s: 0.0,
            integrals: cores.iter().map(|_| Mutex::new(Integral::default())).collect(),
            // At the epoch itself nothing has been counted yet but the offset.
            start_j: cores.iter().map(|c| c.offset_j).collect(),
            cores,
        }
    }

    /// The model whose counters' epoch was `epoch_s` seconds before `t` = 0 (the simulation's
    /// start; [`Clock::epoch_s`]): its load waves, and so its energy counters, run on the time
    /// since the epoch, so that a simulation started later continues the counters of one that
    /// ran before it.
    pub fn since_epoch(mut self, epoch_s: f64) -> Live {
        self.epoch_s = epoch_s.max(0.0);
        self.start_j = (0..self.cores.len())
            .map(|i| self.cores[i].offset_j + self.energy_before_start_j(i))
            .collect();
        self
    }

    /// The second of the day (UTC on the simulated clock, to the minute) at which `socket`'s
    /// daily and job waves together peak on the first day of 2026: where a test finds the
    /// power peak, whatever the seed's phase.
    pub fn daily_peak_s(&self, socket: u32) -> f64 {
        let midnight = DAY_2026_01_01 - self.epoch_s;
        let load = |s: f64| self.socket_load(socket, midnight + s);
        (0..1440)
            .map(|m| f64::from(m) * 60.0)
            .max_by(|a, b| load(*a).total_cmp(&load(*b)))
            .unwrap_or_default()
    }

    /// The scenario.
    pub fn scenario(&self) -> Scenario {
        self.scenario
    }

    /// Most power one core can draw, W.
    pub fn core_max_w(&self) -> f64 {
        self.core_max_w
    }

    /// The load of `socket` at `t`, without the cores' own waves: the daily and the job wave.
    pub fn socket_load(&self, socket: u32, t: f64) -> f64 {
        let Some(w) = self.socket_waves.get(socket as usize) else { return 0.0 };
        let t = self.epoch_s + t;
        0.55 + 0.25 * (TAU * t / DAY_S + w.day_phase).sin()
            + 0.08 * (w.job_omega * t + w.job_phase).sin()
    }

    /// The load of core `i` at `t` before the clamp to [0, 1].
    fn raw_load(&self, i: usize, t: f64) -> f64 {
        let c = &self.cores[i];
        self.socket_load(c.socket, t)
            + c.bias
            + c.amp * (c.omega * (self.epoch_s + t) + c.phase).sin()
    }

    /// The load of core `i` at `t`, in [0, 1].
    pub fn core_load(&self, i: usize, t: f64) -> f64 {
        self.raw_load(i, t).clamp(0.0, 1.0)
    }

    /// The power of core `i` at `t`, W.
    pub fn power_w(&self, i: usize, t: f64) -> f64 {
        let c = &self.cores[i];
        let p = self.idle_w + (self.core_max_w - self.idle_w) * self.core_load(i, t);
        if self.prochot(c.socket, t) { p * PROCHOT_POWER } else { p }
    }

    /// The energy core `i` would have counted from the epoch to `t` = 0 without PROCHOT and the
    /// clamp, J: the closed-form integral of its unclamped load's waves (≥ the clamped energy:
    /// the raw load never falls below 0, so the clamp only takes power away).
    fn energy_before_start_j(&self, i: usize) -> f64 {
        let c = &self.cores[i];
        let Some(w) = self.socket_waves.get(c.socket as usize) else { return 0.0 };
        let t = self.epoch_s;
        // ∫₀ᵗ sin(ωτ + φ) dτ
        let wave = |omega: f64, phase: f64| (phase.cos() - (omega * t + phase).cos()) / omega;
        let load = (0.55 + c.bias) * t
            + 0.25 * wave(TAU / DAY_S, w.day_phase)
            + 0.08 * wave(w.job_omega, w.job_phase)
            + c.amp * wave(c.omega, c.phase);
        self.idle_w * t + (self.core_max_w - self.idle_w) * load
    }

    /// The energy core `i` counts over step `k` (from `k` × [`STEP_S`]), J: Simpson's rule
    /// over its power, clamp and PROCHOT included. The weights are positive and add up to one
    /// step, so the step never counts more than its highest power for a step.
    fn step_energy_j(&self, i: usize, k: u64) -> f64 {
        let t0 = k as f64 * STEP_S;
        let p = |t: f64| self.power_w(i, t);
        (p(t0) + 4.0 * p(t0 + 0.5 * STEP_S) + p(t0 + STEP_S)) * STEP_S / 6.0
    }

    /// The energy core `i` has counted at `t`, J: what it held at the simulation's start
    /// (the offset and the closed-form energy from the epoch), and each step's energy since ([`Live::step_energy_j`]),
    /// the current step's spread evenly over it. Never decreases as `t` grows, never advances
    /// faster than the core's highest power over any window, and a model started later (a
    /// restart of the simulating process: [`Live::since_epoch`]) never counts less, since the
    /// clamp and PROCHOT only ever take power away.
    pub fn energy_j(&self, i: usize, t: f64) -> f64 {
        let t = t.max(0.0);
        let whole = (t / STEP_S).floor() as u64;
        // Plain numbers, valid even if a holder panicked.
        let mut integral = self.integrals[i].lock().unwrap_or_else(PoisonError::into_inner);
        if integral.steps > whole {
            // A manual clock set back: integrate again from the start.
            *integral = Integral::default();
        }
        while integral.steps < whole {
            integral.joules += self.step_energy_j(i, integral.steps);
            integral.steps += 1;
        }
        let partial = (t - whole as f64 * STEP_S) / STEP_S;
        let current = self.step_energy_j(i, whole) * partial;
        self.start_j[i] + integral.joules + current
    }

    /// The energy the I/O die and uncore of one socket have counted at `t`, J (since the
    /// epoch, like the cores'): the package energy less its cores'.
    pub fn uncore_energy_j(&self, t: f64) -> f64 {
        self.uncore_w * (self.epoch_s + t.max(0.0))
    }

    /// The power the I/O die and uncore of one socket draw, W.
    pub fn uncore_w(&self) -> f64 {
        self.uncore_w
    }

    /// The boost limit of core `i` at `t`, MHz.
    pub fn boost_mhz(&self, i: usize, t: f64) -> u32 {
        let c = &self.cores[i];
        if self.prochot(c.socket, t) {
            return throttled_mhz(self.boost_mhz);
        }
        if self.socket_load(c.socket, t) > POWER_EVENT_LOAD && self.core_load(i, t) > 0.7 {
            let slot = (t / POWER_SLOT_S).floor() as u64;
            let trim = 100 * (1 + (hash(self.seed ^ 0xB005_7000, i as u64, slot) % 4) as u32);
            return self.boost_mhz.saturating_sub(trim);
        }
        self.boost_mhz
    }

    /// The frequency limit of `socket` at `t` and the limiters imposing it.
    pub fn socket_freq_limit(&self, socket: u32, t: f64) -> SocketFreqLimit {
        let (mhz, reasons) = if self.prochot(socket, t) {
            (throttled_mhz(self.boost_mhz), LimitReasons::PROCHOT | LimitReasons::CHTC)
        } else {
            let load = self.socket_load(socket, t);
            if load > POWER_EVENT_LOAD {
                (ppt_limit_mhz(self.boost_mhz, load), LimitReasons::PPT)
            } else {
                (self.boost_mhz, LimitReasons::OPN_MAX)
            }
        };
        SocketFreqLimit { mhz: u16::try_from(mhz).unwrap_or(u16::MAX), reasons }
    }

    /// The frequency limit of core `i` at `t`, MHz: the lower of its boost limit and its
    /// socket's limit.
    pub fn core_freq_limit_mhz(&self, i: usize, t: f64) -> u32 {
        let socket = self.cores[i].socket;
        self.boost_mhz(i, t).min(u32::from(self.socket_freq_limit(socket, t).mhz))
    }

    /// Whether `socket` has PROCHOT asserted at `t`.
    pub fn prochot(&self, socket: u32, t: f64) -> bool {
        self.scenario.scheduled_prochot(socket, self.sockets, t) || self.thermal_episode(socket, t)
    }

    /// The rare short episodes of the normal machine.
    fn thermal_episode(&self, socket: u32, t: f64) -> bool {
        if t < THERMAL_SLOT_S {
            return false;
        }
        let slot = (t / THERMAL_SLOT_S).floor();
        let key = slot as u64;
        let seed = self.seed ^ 0x9807_4074;
        if unit(seed, u64::from(socket), key) >= THERMAL_SLOT_SHARE {
            return false;
        }
        let length = 10.0 + 110.0 * unit(seed ^ 1, u64::from(socket), key);
        let start = slot * THERMAL_SLOT_S
            + (THERMAL_SLOT_S - length) * unit(seed ^ 2, u64::from(socket), key);
        (start..start + length).contains(&t)
    }
}

/// The boost limit under PROCHOT: [`PROCHOT_BOOST`] of the maximum, in 25 MHz steps.
pub fn throttled_mhz(max_mhz: u32) -> u32 {
    ((f64::from(max_mhz) * PROCHOT_BOOST / 25.0).round() as u32) * 25
}

/// The PPT limit of a socket at `load` (above [`POWER_EVENT_LOAD`]): [`PPT_TRIM_MHZ`] below
/// `max_mhz`, growing with the load, in 25 MHz steps.
fn ppt_limit_mhz(max_mhz: u32, load: f64) -> u32 {
    let (least, most) = PPT_TRIM_MHZ;
    let share = ((load - POWER_EVENT_LOAD) / (PEAK_SOCKET_LOAD - POWER_EVENT_LOAD)).clamp(0.0, 1.0);
    let trim = f64::from(least) + f64::from(most - least) * share;
    max_mhz.saturating_sub(((trim / 25.0).round() as u32) * 25)
}

/// SplitMix64 finaliser: a well-mixed deterministic hash of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A deterministic hash of (seed, a, b).
fn hash(seed: u64, a: u64, b: u64) -> u64 {
    mix(seed ^ mix(a ^ mix(b)))
}

/// A deterministic number in [0, 1) from (seed, a, b).
fn unit(seed: u64, a: u64, b: u64) -> f64 {
    (hash(seed, a, b) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    /// Socket power at `t` (the sum of its cores' power), W.
    fn socket_power(live: &Live, spec: &MachineSpec, socket: u32, t: f64) -> f64 {
        let n = spec.core_ids.len();
        (socket as usize * n..(socket as usize + 1) * n).map(|i| live.power_w(i, t)).sum()
    }

    #[test]
    fn socket_power_stays_within_the_tdp_and_follows_the_day() {
        for profile in Profile::ALL {
            let spec = profile.spec();
            let live = Live::new(&spec, 3, Scenario::Normal);
            let (mut low, mut high) = (f64::MAX, 0.0f64);
            for hour in 0..48 {
                let t = f64::from(hour) * 1800.0;
                let w = socket_power(&live, &spec, 0, t);
                assert!(w <= f64::from(spec.tdp_w) * CORE_SHARE_OF_TDP, "{profile} at {t}: {w} W");
                low = low.min(w);
                high = high.max(w);
            }
            let tdp = f64::from(spec.tdp_w);
            // Night and day differ by at least a fifth of the TDP; the night is not idle.
            assert!(high - low > 0.2 * tdp, "{profile}: {low}..{high} W of {tdp}");
            assert!(low > 0.15 * tdp, "{profile}: {low} W");
        }
    }

    #[test]
    fn turin_2p_draws_a_believable_share_of_its_500_w() {
        let spec = Profile::Turin2p.spec();
        assert_eq!(spec.tdp_w, 500);
        let live = Live::new(&spec, 0, Scenario::Normal);
        let day: Vec<f64> =
            (0..96).map(|q| socket_power(&live, &spec, 1, f64::from(q) * 900.0)).collect();
        let mean = day.iter().sum::<f64>() / day.len() as f64;
        assert!((150.0..=300.0).contains(&mean), "{mean} W");
        assert!(day.iter().all(|&w| w < 375.0), "{day:?}");
    }

    #[test]
    fn cores_differ_and_energy_integrates_the_power() {
        let spec = Profile::Genoa2p.spec();
        let live = Live::new(&spec, 1, Scenario::Normal);
        assert_ne!(live.power_w(0, 100.0), live.power_w(1, 100.0));
        let e0 = live.energy_j(5, 1000.0);
        let e1 = live.energy_j(5, 1010.0);
        let expected: f64 = (1000..1010).map(|s| live.power_w(5, f64::from(s))).sum();
        // Each second is Simpson's rule over the power, spread evenly over the second.
        assert!((e1 - e0 - expected).abs() < 1e-2 * expected, "{} vs {expected}", e1 - e0);
        // Reading an earlier time again gives the same answer (a manual clock set back).
        assert_eq!(live.energy_j(5, 1000.0), e0);
    }

    /// Midnight (UTC) of the day the sweeps visit.
    const MIDNIGHT: f64 = DAY_2026_01_01;

    /// The instants of the day a sweep visits for `live`: every hour on the hour and the peak
    /// of socket 0's load, as seconds after [`MIDNIGHT`].
    fn day_instants(live: &Live) -> Vec<f64> {
        (0..24).map(|h| f64::from(h) * 3600.0).chain([live.daily_peak_s(0)]).collect()
    }

    #[test]
    fn no_core_counts_above_its_cap_over_any_window_at_any_hour_of_the_day() {
        // The windows the exporter takes power over: one mailbox round trip, the sample a page
        // view takes, the landing page's second sample (`MIN_POWER_INTERVAL` later, give or
        // take the sample itself), a scrape interval; each started part-way into a step.
        let windows = [0.01, 0.3, 0.96, 1.0, 1.04, 15.0];
        for profile in [Profile::Turin2p, Profile::Genoa2p, Profile::Milan1p] {
            let spec = profile.spec();
            let probe = Live::new(&spec, 0, Scenario::Normal);
            let cap = probe.core_max_w();
            let tdp = f64::from(spec.tdp_w);
            let mut at_cap = 0;
            for at in day_instants(&probe) {
                let live = Live::new(&spec, 0, Scenario::Normal).since_epoch(MIDNIGHT + at);
                let mut socket_j = vec![0.0; spec.sockets as usize];
                for i in 0..live.cores.len() {
                    let mut last = live.energy_j(i, 0.0);
                    let j = live.energy_j(i, 16.0) - live.energy_j(i, 1.0);
                    socket_j[live.cores[i].socket as usize] += j;
                    // In the order of time from here: a read earlier than the last integrates
                    // again from the start.
                    for (k, &w) in windows.iter().enumerate() {
                        let from = 0.37 * k as f64 + 0.5;
                        let (e0, e1) = (live.energy_j(i, from), live.energy_j(i, from + w));
                        // What f64 can hold of a counter this size, not a looser bound.
                        let ulps = 4.0 * f64::EPSILON * e1;
                        assert!(e1 >= e0 && e0 >= last, "{profile} {at} core {i}: went back");
                        last = e0;
                        let watts = (e1 - e0) / w;
                        assert!(
                            e1 - e0 <= cap * w + ulps,
                            "{profile} at {at} s core {i}: {watts} W over {w} s, cap {cap} W"
                        );
                        at_cap += usize::from(watts > 0.999 * cap);
                    }
                }
                for (s, j) in socket_j.iter().enumerate() {
                    let w = j / 15.0 + live.uncore_w();
                    assert!(w <= tdp, "{profile} at {at} s: socket {s} draws {w} W of {tdp} W");
                }
            }
            // The sweep reaches the clamp, where a rectangle rule ran over it.
            assert!(at_cap > 0, "{profile}: no core near its cap all day");
        }
    }

    #[test]
    fn the_energy_of_a_step_is_its_power_and_the_clamp_holds_within_it() {
        // The core of Turin 2P that the landing page caught above its cap at 19:00 UTC, at
        // every step of the minutes around the peak: the count is linear within a step and its
        // slope is the step's power, never above the cap.
        let spec = Profile::Turin2p.spec();
        let probe = Live::new(&spec, 0, Scenario::Normal);
        let peak = *day_instants(&probe).last().expect("the peak");
        let live = Live::new(&spec, 0, Scenario::Normal).since_epoch(MIDNIGHT + peak - 600.0);
        for i in 0..spec.core_ids.len() {
            for k in 0..1200u32 {
                let t = f64::from(k);
                // In the order of time: an earlier read integrates again from the start.
                let (e0, e_half, e1) =
                    (live.energy_j(i, t), live.energy_j(i, t + 0.5), live.energy_j(i, t + 1.0));
                let (step, half) = (e1 - e0, e_half - e0);
                let tol = 4.0 * f64::EPSILON * e1;
                assert!((2.0 * half - step).abs() <= 2.0 * tol, "core {i} step {k}");
                assert!(step <= live.core_max_w() + tol, "core {i} step {k}: {step} J");
                let (lo, hi) = (live.power_w(i, t), live.power_w(i, t + 1.0));
                let mid = live.power_w(i, t + 0.5);
                let (min, max) = (lo.min(hi).min(mid), lo.max(hi).max(mid));
                assert!(step >= min - tol && step <= max + tol, "core {i} step {k}");
            }
        }
    }

    #[test]
    fn a_simulation_started_later_continues_the_energy_counters() {
        let spec = Profile::Turin2p.spec();
        for scenario in Scenario::ALL {
            // A process that started 1000 s after boot ran 3600 s (a thermal event and its
            // saving included); the next starts 1 s after, and another much later.
            let first = Live::new(&spec, 4, scenario).since_epoch(1000.0);
            let second = Live::new(&spec, 4, scenario).since_epoch(4601.0);
            let third = Live::new(&spec, 4, scenario).since_epoch(90_000.0);
            for i in [0, 191, 383] {
                let end = first.energy_j(i, 3600.0);
                let next = second.energy_j(i, 0.0);
                assert!(next >= end, "{scenario} core {i}: {end} J, then {next} J");
                // Forward by about a second's power and what the first withheld, not more.
                assert!(next - end < 0.6 * 3600.0 * first.core_max_w(), "{scenario} core {i}");
                assert!(third.energy_j(i, 0.0) >= second.energy_j(i, 600.0));
            }
        }
    }

    #[test]
    fn energy_never_decreases() {
        let live = Live::new(&Profile::Turin2p.spec(), 9, Scenario::ThermalEvent);
        let mut last = 0.0;
        for step in 0..5000 {
            let e = live.energy_j(383, f64::from(step) * 0.7);
            assert!(e >= last, "step {step}: {last} -> {e}");
            last = e;
        }
    }

    #[test]
    fn normal_boost_is_at_the_maximum_unless_an_event_runs() {
        let spec = Profile::Turin2p.spec();
        let live = Live::new(&spec, 0, Scenario::Normal);
        let (mut at_max, mut trimmed) = (0, 0);
        for m in 0..(2 * 24 * 60) {
            let t = f64::from(m) * 60.0;
            for i in [0usize, 77, 191, 300] {
                let mhz = live.boost_mhz(i, t);
                let socket = (i / 192) as u32;
                if mhz == spec.boost_mhz {
                    at_max += 1;
                } else {
                    trimmed += 1;
                    let power_event = live.socket_load(socket, t) > POWER_EVENT_LOAD;
                    assert!(power_event || live.prochot(socket, t), "dip at {t} without event");
                    assert!(mhz >= throttled_mhz(spec.boost_mhz));
                }
            }
        }
        assert!(trimmed > 0 && at_max > 2 * trimmed, "{at_max} at max, {trimmed} trimmed");
    }

    /// Episodes of `socket` as (start, length) in minutes, sampled every 5 s for `hours`.
    fn episodes(live: &Live, socket: u32, hours: u32) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        let mut start = None;
        for k in 0..hours * 720 {
            let t = f64::from(k) * 5.0;
            match (live.prochot(socket, t), start) {
                (true, None) => start = Some(t),
                (false, Some(s)) => {
                    out.push((s / 60.0, (t - s) / 60.0));
                    start = None;
                }
                _ => {}
            }
        }
        out
    }

    #[test]
    fn normal_prochot_episodes_are_rare_short_and_clear() {
        let live = Live::new(&Profile::Genoa2p.spec(), 11, Scenario::Normal);
        let found = episodes(&live, 1, 24 * 14);
        // About 3 % of 96 slots a day for 14 days: 40 expected.
        assert!((15..=80).contains(&found.len()), "{} episodes", found.len());
        assert!(found.iter().all(|&(start, len)| start >= 15.0 && len <= 2.1), "{found:?}");
    }

    #[test]
    fn thermal_event_holds_the_last_socket_for_20_minutes_every_hour() {
        let spec = Profile::Turin2p.spec();
        let live = Live::new(&spec, 0, Scenario::ThermalEvent);
        assert!(!live.prochot(1, 10.0) && live.prochot(1, 16.0) && live.prochot(1, 1214.0));
        assert!(!live.prochot(1, 1216.0) || live.thermal_episode(1, 1216.0));
        assert!(live.prochot(1, 3616.0));
        let first = episodes(&live, 1, 3)[0];
        assert!((first.1 - 20.0).abs() < 0.1, "{first:?}");
        assert_eq!(live.boost_mhz(300, 600.0), 2225);
        assert!(live.power_w(300, 600.0) < PROCHOT_POWER * live.core_max_w() + 1e-9);
        let share = (0..720).filter(|&k| live.prochot(1, 3600.0 + f64::from(k) * 5.0)).count();
        assert!(share > 720 / 4, "{share} of 720");
    }

    #[test]
    fn prochot_flapping_is_a_third_of_the_time_in_one_minute_episodes() {
        let live = Live::new(&Profile::Milan1p.spec(), 0, Scenario::ProchotFlapping);
        let found = episodes(&live, 0, 2);
        let scheduled: Vec<_> = found.iter().filter(|&&(_, len)| (len - 1.0).abs() < 0.1).collect();
        assert!(scheduled.len() >= 36, "{found:?}");
        assert!(found.iter().all(|&(_, len)| len < 5.0), "{found:?}");
        let on = (0..720).filter(|&k| live.prochot(0, 3600.0 + f64::from(k) * 5.0)).count();
        assert!((230..=290).contains(&on), "{on} of 720");
    }

    /// The first time in `0..end` (every `step` s) at which `pred` holds.
    fn first(step: f64, end: f64, pred: impl Fn(f64) -> bool) -> Option<f64> {
        (0..(end / step) as u32).map(|k| f64::from(k) * step).find(|&t| pred(t))
    }

    #[test]
    fn a_prochot_episode_limits_the_socket_by_prochot_and_chtc() {
        let spec = Profile::Turin2p.spec();
        let live = Live::new(&spec, 0, Scenario::ThermalEvent);
        let limit = live.socket_freq_limit(1, 600.0);
        assert!(live.prochot(1, 600.0));
        assert_eq!(limit.reasons, LimitReasons::PROCHOT | LimitReasons::CHTC);
        assert_eq!(u32::from(limit.mhz), throttled_mhz(spec.boost_mhz));
        assert_eq!(live.core_freq_limit_mhz(300, 600.0), 2225);
        // The other socket and the time before the event are not held by PROCHOT.
        for (socket, t) in [(0, 600.0), (1, 10.0)] {
            let other = live.socket_freq_limit(socket, t);
            assert!(!other.reasons.intersects(LimitReasons::PROCHOT), "{socket} at {t}");
            assert!(u32::from(other.mhz) > throttled_mhz(spec.boost_mhz), "{socket} at {t}");
        }
    }

    #[test]
    fn the_daily_peak_limits_the_socket_by_ppt_where_boost_limits_drop() {
        let spec = Profile::Turin2p.spec();
        let live = Live::new(&spec, 0, Scenario::Normal);
        let peak = first(60.0, DAY_S, |t| {
            live.socket_load(0, t) > POWER_EVENT_LOAD + 0.04 && !live.prochot(0, t)
        })
        .expect("a power event in the day");
        let limit = live.socket_freq_limit(0, peak);
        assert_eq!(limit.reasons, LimitReasons::PPT);
        let trim = spec.boost_mhz - u32::from(limit.mhz);
        assert!((PPT_TRIM_MHZ.0..=PPT_TRIM_MHZ.1).contains(&trim), "{trim} MHz");
        let cores = 0..spec.core_ids.len();
        assert!(cores.clone().any(|i| live.boost_mhz(i, peak) < spec.boost_mhz));
        assert!(cores.clone().all(|i| live.core_freq_limit_mhz(i, peak) <= u32::from(limit.mhz)));
        assert!(cores.clone().all(|i| {
            live.core_freq_limit_mhz(i, peak) == live.boost_mhz(i, peak).min(limit.mhz.into())
        }));
    }

    #[test]
    fn otherwise_the_socket_runs_to_its_opn_maximum() {
        let spec = Profile::Genoa2p.spec();
        let live = Live::new(&spec, 4, Scenario::Normal);
        let quiet = first(60.0, DAY_S, |t| {
            live.socket_load(1, t) < POWER_EVENT_LOAD && !live.prochot(1, t)
        })
        .expect("a quiet minute");
        let limit = live.socket_freq_limit(1, quiet);
        assert_eq!(limit, SocketFreqLimit { mhz: 3_800, reasons: LimitReasons::OPN_MAX });
        assert_eq!(u32::from(limit.mhz), spec.boost_mhz);
        let i = spec.core_ids.len();
        assert_eq!(live.core_freq_limit_mhz(i, quiet), live.boost_mhz(i, quiet));
    }

    #[test]
    fn scenario_names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(s.to_string().parse::<Scenario>(), Ok(s));
        }
        let e = "meltdown".parse::<Scenario>().unwrap_err().to_string();
        assert!(e.contains("meltdown") && e.contains("thermal-event"), "{e}");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let manual = ManualClock::at(Duration::from_secs(5));
        let clock = Clock::Manual(manual.clone());
        assert_eq!(clock.now_s(), 5.0);
        manual.advance(Duration::from_millis(1500));
        assert_eq!(clock.now_s(), 6.5);
        assert_eq!(clock, Clock::Manual(manual));
        assert_ne!(clock, Clock::Manual(ManualClock::default()));
    }
}
