//! The simulated SMU firmware: answers HSMP mailbox messages and core MSR reads for one
//! [`MachineSpec`], with values that either move like a real machine's (live mode) or stay
//! where a test put them (static mode).
//!
//! The firmware knows nothing of the kernel driver: word counts, access modes, socket locks,
//! timeouts and injected faults are the business of [`super::driver`]. It is a pure function of
//! the machine, the mode, the seed and scenario, the time its [`Clock`] reads and, in static
//! mode, the values set. The live values are the model of [`crate::live`].

use super::profile::MachineSpec;
use crate::live::{Clock, Live, Scenario};
use amd_hsmp_device::Errno;
use amd_hsmp_device::messages::{LimitReasons, SocketFreqLimit};
use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT};
use amd_hsmp_device::table::id;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Time unit exponent reported in RAPL units (1/1024 s), as on every EPYC so far.
const TIME_UNIT: u32 = 0xA;
/// [`Mode::Static`]: what each socket's package counter holds beyond its cores' counters, J
/// (the I/O die's and uncore's energy; it moves only with the cores').
pub const STATIC_UNCORE_J: u64 = 50_000;
/// Power unit exponent reported in the RAPL power unit MSR (1/8 W).
const POWER_UNIT: u32 = 0x3;

/// How the firmware's values evolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Values move with the time the firmware's [`Clock`] reads, as [`crate::live`] models
    /// them: per-core power following a daily load pattern within the SKU's TDP, boost limits
    /// at the maximum except during power and thermal events, PROCHOT episodes that clear.
    Live,
    /// Deterministic values that change only through the setters ([`Firmware::advance_energy`],
    /// [`Firmware::set_energy_counter`], [`Firmware::set_boost_limit`],
    /// [`Firmware::set_prochot`], [`Firmware::set_freq_limit`]). Core `i` (in (socket, core)
    /// order) starts at `1000 × (i + 1)` joules, every boost limit at
    /// [`MachineSpec::boost_mhz`], PROCHOT deasserted, every socket's frequency limit at
    /// [`MachineSpec::boost_mhz`] imposed by the OPN maximum alone; a core's frequency limit is
    /// the lower of its boost limit and its socket's limit.
    Static,
}

/// A mailbox status other than OK, as the SMU writes it to the response register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FwStatus {
    /// `HSMP_ERR_INVALID_MSG` (0xFE): the firmware does not implement the message.
    InvalidMessage,
    /// `HSMP_ERR_INVALID_INPUT` (0xFF): an argument is out of range (e.g. an unknown APIC id).
    InvalidInput,
    /// `HSMP_ERR_PREREQ_NOT_SATISFIED` (0xFD).
    PrereqNotSatisfied,
    /// `HSMP_ERR_SMU_BUSY` (0xFC).
    Busy,
}

impl FwStatus {
    /// The status register value.
    pub const fn code(self) -> u32 {
        match self {
            FwStatus::InvalidMessage => 0xFE,
            FwStatus::InvalidInput => 0xFF,
            FwStatus::PrereqNotSatisfied => 0xFD,
            FwStatus::Busy => 0xFC,
        }
    }

    /// The errno the kernel driver turns this status into.
    pub const fn errno(self) -> Errno {
        match self {
            FwStatus::InvalidMessage => libc::ENOMSG,
            FwStatus::InvalidInput => libc::EINVAL,
            FwStatus::PrereqNotSatisfied => libc::EREMOTEIO,
            FwStatus::Busy => libc::EBUSY,
        }
    }
}

/// Why a simulator value could not be set or read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// The machine has no such core.
    #[error("no core {core} on socket {socket}")]
    NoSuchCore {
        /// Socket id.
        socket: u32,
        /// sysfs core id.
        core: u32,
    },
    /// The machine has no such socket.
    #[error("no socket {0}")]
    NoSuchSocket(u32),
    /// Values can only be set in [`Mode::Static`].
    #[error("values can only be set in static mode")]
    NotStatic,
    /// Energy only grows: the amount must be finite and not negative.
    #[error("invalid energy amount {0} J")]
    InvalidEnergy(f64),
}

/// One physical core as the firmware sees it (whether or not Linux has a thread online).
#[derive(Debug, Clone, Copy)]
struct FwCore {
    socket: u32,
    core: u32,
}

/// The values of [`Mode::Static`].
#[derive(Debug)]
struct StaticState {
    energy: Vec<u64>,
    boost: Vec<u32>,
    prochot: Vec<bool>,
    freq_limit: Vec<SocketFreqLimit>,
    /// Per socket, what its package counter holds beyond its cores' counters.
    uncore: Vec<u64>,
}

/// The simulated firmware of one machine. Thread-safe; see the module documentation.
#[derive(Debug)]
pub struct Firmware {
    sockets: u32,
    cores: Vec<FwCore>,
    /// Every thread's APIC id → index into `cores`.
    by_apic: HashMap<u32, usize>,
    /// Linux CPU number → index into `cores`.
    by_cpu: Vec<usize>,
    protocol: Option<u32>,
    rapl: bool,
    freq_limit: bool,
    smu_fw_version: u32,
    esu: u8,
    mode: Mode,
    live: Live,
    clock: Clock,
    state: Mutex<StaticState>,
}

impl Firmware {
    /// The firmware of `spec` on the wall clock, in the normal scenario; `seed` varies the
    /// live load patterns between simulations.
    pub fn new(spec: &MachineSpec, mode: Mode, seed: u64) -> Firmware {
        Firmware::with_clock(spec, mode, seed, Scenario::Normal, Clock::wall())
    }

    /// The firmware of `spec` whose live values follow `scenario` at the time `clock` reads.
    pub fn with_clock(
        spec: &MachineSpec,
        mode: Mode,
        seed: u64,
        scenario: Scenario,
        clock: Clock,
    ) -> Firmware {
        let cpus = spec.cpus();
        let mut index: HashMap<(u32, u32), usize> = HashMap::new();
        let mut cores = Vec::new();
        for socket in 0..spec.sockets {
            for &core in &spec.core_ids {
                index.insert((socket, core), cores.len());
                cores.push(FwCore { socket, core });
            }
        }
        let mut by_apic = HashMap::new();
        let mut by_cpu = Vec::with_capacity(cpus.len());
        for c in &cpus {
            let i = index.get(&(c.socket, c.core)).copied().unwrap_or_default();
            by_apic.insert(c.apic_id, i);
            by_cpu.push(i);
        }
        let esu = spec.esu.min(31);
        let state = StaticState {
            energy: (0..cores.len() as u64).map(|i| (1000 * (i + 1)) << esu).collect(),
            boost: vec![spec.boost_mhz; cores.len()],
            prochot: vec![false; spec.sockets as usize],
            freq_limit: vec![
                SocketFreqLimit {
                    mhz: u16::try_from(spec.boost_mhz).unwrap_or(u16::MAX),
                    reasons: LimitReasons::OPN_MAX,
                };
                spec.sockets as usize
            ],
            uncore: vec![STATIC_UNCORE_J << esu; spec.sockets as usize],
        };
        Firmware {
            sockets: spec.sockets,
            cores,
            by_apic,
            by_cpu,
            protocol: spec.hsmp_protocol,
            rapl: spec.rapl_messages,
            freq_limit: spec.freq_limit_messages(),
            smu_fw_version: spec.smu_fw_version,
            esu,
            mode,
            live: Live::new(spec, seed, scenario).since_epoch(clock.epoch_s()),
            clock,
            state: Mutex::new(state),
        }
    }

    /// Number of sockets.
    pub fn sockets(&self) -> u32 {
        self.sockets
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the machine has an HSMP mailbox at all.
    pub fn has_hsmp(&self) -> bool {
        self.protocol.is_some()
    }

    /// Answers one mailbox message sent to `socket`: the eight data words on success (the
    /// driver copies as many as the message's response size), the SMU status otherwise.
    pub fn answer(&self, socket: u16, msg_id: u32, args: &[u32; 8]) -> Result<[u32; 8], FwStatus> {
        let Some(protocol) = self.protocol else {
            return Err(FwStatus::InvalidMessage);
        };
        let socket = u32::from(socket);
        if socket >= self.sockets {
            return Err(FwStatus::InvalidInput);
        }
        let t = self.elapsed_s();
        let mut out = [0u32; 8];
        match msg_id {
            id::TEST => out[0] = args[0].wrapping_add(1),
            id::GET_SMU_VER => out[0] = self.smu_fw_version,
            id::GET_PROTO_VER => out[0] = protocol,
            id::GET_BOOST_LIMIT => {
                let i = self.core_of_apic(socket, args[0])?;
                out[0] = self.boost_at(i, t);
            }
            id::GET_PROC_HOT => out[0] = u32::from(self.prochot_at(socket, t)),
            id::GET_RAPL_UNITS if self.rapl => {
                out[0] = TIME_UNIT << 16 | u32::from(self.esu) << 8;
            }
            id::GET_RAPL_CORE_COUNTER if self.rapl => {
                let i = self.core_of_apic(socket, args[0] & 0xFFFF)?;
                let counter = self.energy_at(i, t);
                out[0] = counter as u32;
                out[1] = (counter >> 32) as u32;
            }
            id::GET_RAPL_PACKAGE_COUNTER if self.rapl => {
                let counter = self.package_energy_at(socket, t);
                out[0] = counter as u32;
                out[1] = (counter >> 32) as u32;
            }
            id::GET_SOCKET_FREQ_LIMIT if self.freq_limit => {
                out[0] = self.freq_limit_at(socket, t).word();
            }
            id::GET_CCLK_CORE_LIMIT if self.freq_limit => {
                let i = self.core_of_apic(socket, args[0])?;
                out[0] = self.core_freq_limit_at(i, t);
            }
            _ => return Err(FwStatus::InvalidMessage),
        }
        Ok(out)
    }

    /// Reads MSR `msr` on Linux CPU `cpu`: `ENXIO` for a CPU the machine does not have, `EIO`
    /// for a register the simulator does not model (a `#GP` on real hardware).
    pub fn read_msr(&self, cpu: u32, msr: u32) -> Result<u64, Errno> {
        let Some(&i) = self.by_cpu.get(cpu as usize) else {
            return Err(libc::ENXIO);
        };
        match msr {
            MSR_RAPL_PWR_UNIT => {
                Ok(u64::from(TIME_UNIT << 16 | u32::from(self.esu) << 8 | POWER_UNIT))
            }
            MSR_CORE_ENERGY_STAT => Ok(self.energy_at(i, self.elapsed_s()) & 0xFFFF_FFFF),
            _ => Err(libc::EIO),
        }
    }

    /// The core's 64-bit energy counter as the firmware would answer it now.
    pub fn energy_counter(&self, socket: u32, core: u32) -> Result<u64, SimError> {
        let i = self.core_index(socket, core)?;
        Ok(self.energy_at(i, self.elapsed_s()))
    }

    /// The socket's 64-bit package energy counter as the firmware would answer it now (whether
    /// or not it has the RAPL messages): its cores' counters and the I/O die's and uncore's.
    pub fn package_energy_counter(&self, socket: u32) -> Result<u64, SimError> {
        if socket >= self.sockets {
            return Err(SimError::NoSuchSocket(socket));
        }
        Ok(self.package_energy_at(socket, self.elapsed_s()))
    }

    /// The core's boost limit in MHz as the firmware would answer it now.
    pub fn boost_limit(&self, socket: u32, core: u32) -> Result<u32, SimError> {
        let i = self.core_index(socket, core)?;
        Ok(self.boost_at(i, self.elapsed_s()))
    }

    /// The socket's PROCHOT status as the firmware would answer it now.
    pub fn prochot(&self, socket: u32) -> Result<bool, SimError> {
        if socket >= self.sockets {
            return Err(SimError::NoSuchSocket(socket));
        }
        Ok(self.prochot_at(socket, self.elapsed_s()))
    }

    /// The socket's frequency limit and its limiters as the firmware would answer them now
    /// (whether or not its protocol has the message).
    pub fn freq_limit(&self, socket: u32) -> Result<SocketFreqLimit, SimError> {
        if socket >= self.sockets {
            return Err(SimError::NoSuchSocket(socket));
        }
        Ok(self.freq_limit_at(socket, self.elapsed_s()))
    }

    /// The core's frequency limit in MHz as the firmware would answer it now.
    pub fn core_freq_limit(&self, socket: u32, core: u32) -> Result<u32, SimError> {
        let i = self.core_index(socket, core)?;
        Ok(self.core_freq_limit_at(i, self.elapsed_s()))
    }

    /// Static mode: sets the socket's frequency limit and the limiters imposing it.
    pub fn set_freq_limit(&self, socket: u32, limit: SocketFreqLimit) -> Result<(), SimError> {
        if socket >= self.sockets {
            return Err(SimError::NoSuchSocket(socket));
        }
        self.static_state()?.freq_limit[socket as usize] = limit;
        Ok(())
    }

    /// Static mode: sets the core's 64-bit energy counter, in energy status units.
    pub fn set_energy_counter(&self, socket: u32, core: u32, counter: u64) -> Result<(), SimError> {
        let i = self.core_index(socket, core)?;
        self.static_state()?.energy[i] = counter;
        Ok(())
    }

    /// Static mode: adds `joules` to the core's energy counter (rounded to whole units; the
    /// 64-bit counter wraps like the hardware's).
    pub fn advance_energy(&self, socket: u32, core: u32, joules: f64) -> Result<(), SimError> {
        let units = self.joules_to_units(joules)?;
        let i = self.core_index(socket, core)?;
        let mut state = self.static_state()?;
        state.energy[i] = state.energy[i].wrapping_add(units);
        Ok(())
    }

    /// Static mode: adds `joules` to every core's energy counter.
    pub fn advance_all_energy(&self, joules: f64) -> Result<(), SimError> {
        let units = self.joules_to_units(joules)?;
        let mut state = self.static_state()?;
        for e in &mut state.energy {
            *e = e.wrapping_add(units);
        }
        Ok(())
    }

    /// Static mode: sets the core's boost limit in MHz.
    pub fn set_boost_limit(&self, socket: u32, core: u32, mhz: u32) -> Result<(), SimError> {
        let i = self.core_index(socket, core)?;
        self.static_state()?.boost[i] = mhz;
        Ok(())
    }

    /// Static mode: asserts or deasserts PROCHOT on `socket`.
    pub fn set_prochot(&self, socket: u32, asserted: bool) -> Result<(), SimError> {
        if socket >= self.sockets {
            return Err(SimError::NoSuchSocket(socket));
        }
        self.static_state()?.prochot[socket as usize] = asserted;
        Ok(())
    }

    fn joules_to_units(&self, joules: f64) -> Result<u64, SimError> {
        if !joules.is_finite() || joules < 0.0 {
            return Err(SimError::InvalidEnergy(joules));
        }
        // Saturating float-to-int conversion; a test never adds 2^64 units.
        Ok((joules * f64::from(1u32 << self.esu)).round() as u64)
    }

    fn static_state(&self) -> Result<MutexGuard<'_, StaticState>, SimError> {
        match self.mode {
            Mode::Static => Ok(self.lock()),
            Mode::Live => Err(SimError::NotStatic),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StaticState> {
        // The state is plain numbers, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn core_index(&self, socket: u32, core: u32) -> Result<usize, SimError> {
        self.cores
            .iter()
            .position(|c| c.socket == socket && c.core == core)
            .ok_or(SimError::NoSuchCore { socket, core })
    }

    /// The core addressed by `apic_id` on `socket`; an APIC id of another socket's core is as
    /// invalid as an unknown one, since each socket's firmware manages only its own cores.
    fn core_of_apic(&self, socket: u32, apic_id: u32) -> Result<usize, FwStatus> {
        match self.by_apic.get(&apic_id) {
            Some(&i) if self.cores[i].socket == socket => Ok(i),
            _ => Err(FwStatus::InvalidInput),
        }
    }

    fn elapsed_s(&self) -> f64 {
        self.clock.now_s()
    }

    /// The live model, to see what the firmware would answer at any time.
    pub fn live(&self) -> &Live {
        &self.live
    }

    fn energy_at(&self, i: usize, t: f64) -> u64 {
        match self.mode {
            Mode::Static => self.lock().energy[i],
            Mode::Live => {
                let joules = self.live.energy_j(i, t);
                // Saturating conversion; floor keeps the counter monotonic in t.
                (joules * f64::from(1u32 << self.esu)).floor() as u64
            }
        }
    }

    fn package_energy_at(&self, socket: u32, t: f64) -> u64 {
        let cores = (0..self.cores.len())
            .filter(|&i| self.cores[i].socket == socket)
            .fold(0u64, |sum, i| sum.wrapping_add(self.energy_at(i, t)));
        let uncore = match self.mode {
            Mode::Static => self.lock().uncore.get(socket as usize).copied().unwrap_or_default(),
            Mode::Live => {
                (self.live.uncore_energy_j(t) * f64::from(1u32 << self.esu)).floor() as u64
            }
        };
        cores.wrapping_add(uncore)
    }

    fn boost_at(&self, i: usize, t: f64) -> u32 {
        match self.mode {
            Mode::Static => self.lock().boost[i],
            Mode::Live => self.live.boost_mhz(i, t),
        }
    }

    fn freq_limit_at(&self, socket: u32, t: f64) -> SocketFreqLimit {
        match self.mode {
            Mode::Static => {
                let fallback = SocketFreqLimit { mhz: 0, reasons: LimitReasons::NONE };
                self.lock().freq_limit.get(socket as usize).copied().unwrap_or(fallback)
            }
            Mode::Live => self.live.socket_freq_limit(socket, t),
        }
    }

    fn core_freq_limit_at(&self, i: usize, t: f64) -> u32 {
        match self.mode {
            Mode::Static => {
                let mhz = u32::from(self.freq_limit_at(self.cores[i].socket, t).mhz);
                self.lock().boost[i].min(mhz)
            }
            Mode::Live => self.live.core_freq_limit_mhz(i, t),
        }
    }

    fn prochot_at(&self, socket: u32, t: f64) -> bool {
        match self.mode {
            Mode::Static => self.lock().prochot.get(socket as usize).copied().unwrap_or(false),
            Mode::Live => self.live.prochot(socket, t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::ManualClock;
    use crate::profile::Profile;
    use std::time::Duration;

    fn args(a0: u32) -> [u32; 8] {
        [a0, 0, 0, 0, 0, 0, 0, 0]
    }

    /// A live Turin 2P in the thermal-event scenario, on a manual clock at 5 s.
    fn turin_thermal_event_at_5s() -> (MachineSpec, ManualClock, Firmware) {
        let spec = Profile::Turin2p.spec();
        let clock = ManualClock::at(Duration::from_secs(5));
        let manual = Clock::Manual(clock.clone());
        let fw = Firmware::with_clock(&spec, Mode::Live, 0, Scenario::ThermalEvent, manual);
        (spec, clock, fw)
    }

    #[test]
    fn live_values_come_from_the_clock_and_prochot_clears() {
        let (spec, clock, fw) = turin_thermal_event_at_5s();
        let apic = spec.apic_id(1, 0, 0);
        let read = |msg| fw.answer(1, msg, &args(apic)).unwrap()[0];
        let energy = fw.energy_counter(1, 0).unwrap();
        assert_eq!((read(id::GET_PROC_HOT), read(id::GET_BOOST_LIMIT)), (0, 3700));
        // Frozen: the same answer however long the test takes.
        assert_eq!(fw.energy_counter(1, 0).unwrap(), energy);
        clock.set(Duration::from_secs(60));
        assert_eq!((read(id::GET_PROC_HOT), read(id::GET_BOOST_LIMIT)), (1, 2225));
        assert!(fw.energy_counter(1, 0).unwrap() > energy);
        clock.set(Duration::from_secs(1300));
        assert_eq!(read(id::GET_PROC_HOT), u32::from(fw.live().prochot(1, 1300.0)));
        assert_eq!(read(id::GET_PROC_HOT), 0, "the event clears after 20 minutes");
    }

    #[test]
    fn answers_the_implemented_messages() {
        let fw = Firmware::new(&Profile::Turin2p.spec(), Mode::Static, 0);
        assert_eq!(fw.answer(0, id::TEST, &args(41)).unwrap()[0], 42);
        assert_eq!(fw.answer(1, id::GET_PROTO_VER, &args(0)).unwrap()[0], 7);
        assert_eq!(fw.answer(0, id::GET_SMU_VER, &args(0)).unwrap()[0], 0x0005_5A2B);
        let units = fw.answer(0, id::GET_RAPL_UNITS, &args(0)).unwrap()[0];
        assert_eq!((units >> 8) & 0x1f, 16);
        assert_eq!(
            fw.answer(1, id::GET_SOCKET_FREQ_LIMIT, &args(0)).unwrap()[0],
            3700 << 16 | 0x10
        );
        assert_eq!((units >> 16) & 0xf, 0xA);
        assert_eq!(
            fw.answer(0, 0x04, &args(0)),
            Err(FwStatus::InvalidMessage),
            "unimplemented message"
        );
    }

    #[test]
    fn boost_limit_and_rapl_counter_are_addressed_by_apic_id_of_the_socket() {
        let spec = Profile::Genoa2p.spec();
        let mut spec7 = spec.clone();
        spec7.rapl_messages = true;
        let fw = Firmware::new(&spec7, Mode::Static, 0);
        // Socket 1 core 8 thread 1.
        let apic = spec.apic_id(1, 8, 1);
        fw.set_boost_limit(1, 8, 3123).unwrap();
        assert_eq!(fw.answer(1, id::GET_BOOST_LIMIT, &args(apic)).unwrap()[0], 3123);
        // The same APIC id sent to the other socket's mailbox is invalid input.
        assert_eq!(fw.answer(0, id::GET_BOOST_LIMIT, &args(apic)), Err(FwStatus::InvalidInput));
        // So is an APIC id in a disabled core slot (core 4 of CCD 0).
        assert_eq!(
            fw.answer(0, id::GET_BOOST_LIMIT, &args(spec.apic_id(0, 4, 0))),
            Err(FwStatus::InvalidInput)
        );
        fw.set_energy_counter(1, 8, 0x1_2345_6789).unwrap();
        // Bits 31:16 of the argument are not part of the APIC id.
        let words = fw.answer(1, id::GET_RAPL_CORE_COUNTER, &args(0xABCD_0000 | apic)).unwrap();
        assert_eq!((words[0], words[1]), (0x2345_6789, 1));
    }

    /// Issue 28: the package counter is its cores' counters plus the I/O die's and uncore's,
    /// in both modes, in the units of `GET_RAPL_UNITS`.
    #[test]
    fn the_package_counter_holds_its_cores_and_the_uncore() {
        let spec = Profile::Turin2p.spec();
        let fw = Firmware::new(&spec, Mode::Static, 0);
        let esu = spec.esu;
        let cores_of = |fw: &Firmware, socket: u32| -> u64 {
            spec.core_ids.iter().map(|&c| fw.energy_counter(socket, c).unwrap()).sum()
        };
        for socket in 0..2 {
            let words = fw.answer(socket as u16, id::GET_RAPL_PACKAGE_COUNTER, &args(0)).unwrap();
            let package = u64::from(words[0]) | u64::from(words[1]) << 32;
            assert_eq!(package, cores_of(&fw, socket) + (STATIC_UNCORE_J << esu));
        }
        fw.advance_all_energy(2.0).unwrap();
        let cores = spec.core_ids.len() as u64;
        assert_eq!(
            fw.package_energy_counter(1).unwrap(),
            cores_of(&fw, 1) + (STATIC_UNCORE_J << esu)
        );
        assert_eq!(
            cores_of(&fw, 1),
            cores_of(&Firmware::new(&spec, Mode::Static, 0), 1) + ((2 * cores) << esu)
        );
        assert_eq!(fw.package_energy_counter(2), Err(SimError::NoSuchSocket(2)));

        let clock = ManualClock::at(Duration::from_secs(5));
        let manual = Clock::Manual(clock.clone());
        let live = Firmware::with_clock(&spec, Mode::Live, 7, Scenario::Normal, manual);
        let (p0, c0) = (live.package_energy_counter(0).unwrap(), cores_of(&live, 0));
        clock.advance(Duration::from_secs(10));
        let (p1, c1) = (live.package_energy_counter(0).unwrap(), cores_of(&live, 0));
        assert!(p0 > c0 && p1 > c1, "the package holds more than its cores");
        let uncore_j = (p1 - c1).abs_diff(p0 - c0) as f64 / f64::from(1u32 << esu);
        let want = live.live().uncore_w() * 10.0;
        assert!((uncore_j - want).abs() < 0.01, "{uncore_j} J of uncore in 10 s, want {want}");
    }

    #[test]
    fn rapl_messages_are_invalid_without_rapl() {
        let fw = Firmware::new(&Profile::Genoa2p.spec(), Mode::Static, 0);
        for msg in [id::GET_RAPL_UNITS, id::GET_RAPL_CORE_COUNTER, id::GET_RAPL_PACKAGE_COUNTER] {
            assert_eq!(fw.answer(0, msg, &args(0)), Err(FwStatus::InvalidMessage));
        }
    }

    #[test]
    fn static_mode_is_deterministic_and_frozen() {
        let spec = Profile::Milan1p.spec();
        let a = Firmware::new(&spec, Mode::Static, 1);
        let b = Firmware::new(&spec, Mode::Static, 2);
        std::thread::sleep(std::time::Duration::from_millis(5));
        for &core in &spec.core_ids {
            assert_eq!(a.energy_counter(0, core), b.energy_counter(0, core));
            assert_eq!(a.boost_limit(0, core).unwrap(), spec.boost_mhz);
        }
        assert_eq!(a.energy_counter(0, 0).unwrap(), 1000 << 16);
        assert_eq!(a.energy_counter(0, 1).unwrap(), 2000 << 16);
        assert_eq!(a.prochot(0), Ok(false));
        a.advance_energy(0, 1, 1.5).unwrap();
        assert_eq!(a.energy_counter(0, 1).unwrap(), (2000 << 16) + 3 * (1 << 15));
        a.advance_all_energy(1.0).unwrap();
        assert_eq!(a.energy_counter(0, 0).unwrap(), 1001 << 16);
        a.set_prochot(0, true).unwrap();
        assert_eq!(a.answer(0, id::GET_PROC_HOT, &args(0)).unwrap()[0], 1);
    }

    #[test]
    fn setters_refuse_live_mode_and_unknown_cores() {
        let spec = Profile::Genoa2p.spec();
        let live = Firmware::new(&spec, Mode::Live, 0);
        assert_eq!(live.set_boost_limit(0, 0, 1), Err(SimError::NotStatic));
        let fixed = Firmware::new(&spec, Mode::Static, 0);
        assert_eq!(
            fixed.set_energy_counter(0, 4, 0),
            Err(SimError::NoSuchCore { socket: 0, core: 4 })
        );
        assert_eq!(fixed.set_prochot(2, true), Err(SimError::NoSuchSocket(2)));
        assert_eq!(fixed.advance_energy(0, 0, -1.0), Err(SimError::InvalidEnergy(-1.0)));
    }

    #[test]
    fn msr_counter_is_the_low_32_bits_and_wraps() {
        let spec = Profile::Rome1p.spec();
        let fw = Firmware::new(&spec, Mode::Static, 0);
        // CPU 33 is thread 1 of core 1; both threads read the core's counter.
        fw.set_energy_counter(0, 1, (1 << 32) - 10).unwrap();
        assert_eq!(fw.read_msr(1, MSR_CORE_ENERGY_STAT), Ok((1 << 32) - 10));
        fw.advance_energy(0, 1, 20.0 / 65536.0).unwrap();
        assert_eq!(fw.read_msr(33, MSR_CORE_ENERGY_STAT), Ok(10));
        assert_eq!(fw.energy_counter(0, 1).unwrap(), (1 << 32) + 10);
        let unit = fw.read_msr(0, MSR_RAPL_PWR_UNIT).unwrap();
        assert_eq!(unit, 0xA1003);
        assert_eq!(fw.read_msr(0, 0xC001_029B), Err(libc::EIO));
        assert_eq!(fw.read_msr(64, MSR_RAPL_PWR_UNIT), Err(libc::ENXIO));
    }

    #[test]
    fn live_counter_grows_over_20_ms_at_every_hour_of_the_day() {
        let clock = ManualClock::at(Duration::ZERO);
        let manual = Clock::Manual(clock.clone());
        let fw =
            Firmware::with_clock(&Profile::Turin2p.spec(), Mode::Live, 0, Scenario::Normal, manual);
        for hour in 0..24u64 {
            clock.set(Duration::from_secs(hour * 3600));
            let first = fw.energy_counter(1, 191).unwrap();
            clock.set(Duration::from_secs(hour * 3600) + Duration::from_millis(20));
            let second = fw.energy_counter(1, 191).unwrap();
            // A Turin core idles at 15 % of its 1.95 W (0.29 W; 0.16 W under PROCHOT): at
            // least 0.003 J in 20 ms, 209 units at ESU 16.
            assert!(second >= first + 200, "{hour}:00: {first} -> {second}");
        }
    }

    #[test]
    fn a_socket_in_a_prochot_episode_reports_prochot_and_chtc_at_a_lower_limit() {
        let (spec, clock, fw) = turin_thermal_event_at_5s();
        let apic = spec.apic_id(1, 0, 0);
        let read = |msg| fw.answer(1, msg, &args(apic)).unwrap()[0];
        let before = SocketFreqLimit::from_word(read(id::GET_SOCKET_FREQ_LIMIT));
        assert!(!before.reasons.intersects(LimitReasons::PROCHOT | LimitReasons::CHTC));
        clock.set(Duration::from_secs(60));
        let during = SocketFreqLimit::from_word(read(id::GET_SOCKET_FREQ_LIMIT));
        assert_eq!(during.reasons, LimitReasons::PROCHOT | LimitReasons::CHTC);
        assert!(during.mhz < before.mhz, "{during:?} vs {before:?}");
        assert_eq!((during.mhz, read(id::GET_CCLK_CORE_LIMIT)), (2225, 2225));
        assert_eq!(fw.freq_limit(1), Ok(during));
        // The other socket keeps its own limit.
        let other = SocketFreqLimit::from_word(
            fw.answer(0, id::GET_SOCKET_FREQ_LIMIT, &args(0)).unwrap()[0],
        );
        assert!(!other.reasons.intersects(LimitReasons::PROCHOT));
    }

    #[test]
    fn static_frequency_limits_are_the_maximum_by_opn_until_set() {
        let spec = Profile::Genoa2p.spec();
        let fw = Firmware::new(&spec, Mode::Static, 0);
        let apic = spec.apic_id(1, 8, 0);
        let socket_word =
            |fw: &Firmware| fw.answer(1, id::GET_SOCKET_FREQ_LIMIT, &args(0)).unwrap()[0];
        let core = |fw: &Firmware| fw.answer(1, id::GET_CCLK_CORE_LIMIT, &args(apic)).unwrap()[0];
        assert_eq!(socket_word(&fw), 3800 << 16 | 0x10);
        assert_eq!(core(&fw), 3800);
        let ppt = SocketFreqLimit { mhz: 3400, reasons: LimitReasons::PPT };
        fw.set_freq_limit(1, ppt).unwrap();
        assert_eq!(socket_word(&fw), 3400 << 16 | 0x08);
        assert_eq!(core(&fw), 3400, "the core is held by its socket");
        fw.set_boost_limit(1, 8, 3000).unwrap();
        assert_eq!(core(&fw), 3000, "and by its own boost limit");
        assert_eq!(fw.core_freq_limit(1, 8), Ok(3000));
        assert_eq!(fw.freq_limit(0).unwrap().reasons, LimitReasons::OPN_MAX);
        assert_eq!(fw.set_freq_limit(2, ppt), Err(SimError::NoSuchSocket(2)));
        assert_eq!(
            Firmware::new(&spec, Mode::Live, 0).set_freq_limit(0, ppt),
            Err(SimError::NotStatic)
        );
    }

    /// `MachineSpec::answers`, from which the documents' message counts are generated, says
    /// of each family exactly what the firmware answers.
    #[test]
    fn the_spec_says_which_families_the_firmware_answers() {
        use amd_hsmp_proto::Family;
        for profile in Profile::ALL {
            let spec = profile.spec();
            let fw = Firmware::new(&spec, Mode::Static, 0);
            let apic = spec.topology().cores[0].apic_id;
            for family in Family::ALL {
                let msg = MachineSpec::message(family).id();
                let answered = fw.answer(0, msg, &args(apic)).is_ok();
                assert_eq!(answered, spec.answers(family), "{profile} {family}");
            }
        }
    }

    #[test]
    fn firmware_older_than_protocol_5_has_no_frequency_limit_messages() {
        for profile in [Profile::Milan1p, Profile::Rome1p] {
            let fw = Firmware::new(&profile.spec(), Mode::Live, 0);
            for msg in [id::GET_SOCKET_FREQ_LIMIT, id::GET_CCLK_CORE_LIMIT] {
                assert_eq!(fw.answer(0, msg, &args(0)), Err(FwStatus::InvalidMessage), "{profile}");
            }
        }
        let fw = Firmware::new(&Profile::Siena1p.spec(), Mode::Live, 0);
        assert!(fw.answer(0, id::GET_SOCKET_FREQ_LIMIT, &args(0)).is_ok());
    }

    #[test]
    fn no_hsmp_means_every_message_is_invalid() {
        let fw = Firmware::new(&Profile::Rome1p.spec(), Mode::Static, 0);
        assert!(!fw.has_hsmp());
        assert_eq!(fw.answer(0, id::TEST, &args(1)), Err(FwStatus::InvalidMessage));
    }
}
