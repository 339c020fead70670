//! Tests of the sampler against the simulated machine of `amd_hsmp_sim`, through a recording
//! wrapper; events are ordered with the simulator's mailbox gates, not with sleeps, and the
//! tests of deadlines and of the freshness bound run on a [`ManualClock`] they move by hand.

use super::*;
use crate::msr::MsrEnergy;
use amd_hsmp_device::messages::{LimitReasons, SocketFreqLimit};
use amd_hsmp_device::{Errno, HsmpMessage, Message};
use amd_hsmp_proto::{Energy, FrequencyLimit};
use amd_hsmp_sim::{
    AccessMode, Driver, FaultGroup, Faults, FirmwareConfig, Machine, MachineSpec, Mode, Profile,
    Target,
};
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::time::Duration;

/// The families the tests of the sampler's mechanics (deadlines, freshness, queues) ask for and
/// count the messages of: PROCHOT, core energy and boost limit. The frequency-limit families
/// go through the same table and have tests of their own.
const V2_FAMILIES: Families =
    Families::of(&[Family::CoreEnergy, Family::BoostLimit, Family::Prochot]);

/// How long a test waits for a gate before it fails; never reached when the code is right.
const GATE: Duration = Duration::from_secs(20);

/// Stops the sender of one message until the test lets it go.
#[derive(Debug)]
struct Pause {
    /// The message number (1 = the next one sent) to stop at.
    at: usize,
    reached: mpsc::SyncSender<()>,
    resume: mpsc::Receiver<()>,
}

/// What [`Opener`] and its transports share.
#[derive(Debug)]
struct Recorder {
    machine: Arc<Machine>,
    /// When set, opening fails with this errno.
    refuse: Mutex<Option<Errno>>,
    opens: AtomicUsize,
    /// Bumped by [`Opener::replace`]: descriptors of an older generation answer `ENODEV`.
    generation: AtomicUsize,
    /// Every message that reached the device, in order.
    sent: Mutex<Vec<HsmpMessage>>,
    pause: Mutex<Option<Pause>>,
}

/// Opens the simulated `/dev/hsmp` through a recording wrapper.
#[derive(Debug, Clone)]
struct Opener(Arc<Recorder>);

impl Opener {
    fn new(machine: &Arc<Machine>) -> Opener {
        Opener(Arc::new(Recorder {
            machine: Arc::clone(machine),
            refuse: Mutex::new(None),
            opens: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            sent: Mutex::new(Vec::new()),
            pause: Mutex::new(None),
        }))
    }

    fn refuse(&self, errno: Option<Errno>) {
        *self.0.refuse.lock().unwrap() = errno;
    }

    fn opens(&self) -> usize {
        self.0.opens.load(Ordering::SeqCst)
    }

    /// Replaces the device under the open descriptors, as a driver rebind does.
    fn replace(&self) {
        self.0.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn sent(&self) -> Vec<HsmpMessage> {
        self.0.sent.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.0.sent.lock().unwrap().len()
    }

    fn count_of(&self, message: Message) -> usize {
        self.sent().iter().filter(|m| m.msg_id == message.id()).count()
    }

    /// Stops the `at`-th message from now before it reaches the device; returns the gate that
    /// says it got there and the switch that lets it go on.
    fn pause_at(&self, at: usize) -> (mpsc::Receiver<()>, mpsc::SyncSender<()>) {
        let (reached_tx, reached) = mpsc::sync_channel(1);
        let (resume, resume_rx) = mpsc::sync_channel(1);
        let at = self.count() + at;
        *self.0.pause.lock().unwrap() = Some(Pause { at, reached: reached_tx, resume: resume_rx });
        (reached, resume)
    }
}

impl HsmpOpener for Opener {
    fn open(&self) -> Result<Arc<dyn HsmpTransport>, Errno> {
        self.0.opens.fetch_add(1, Ordering::SeqCst);
        if let Some(errno) = *self.0.refuse.lock().unwrap() {
            return Err(errno);
        }
        let driver = self.0.machine.open_hsmp(AccessMode::ReadOnly)?;
        let generation = self.0.generation.load(Ordering::SeqCst);
        Ok(Arc::new(Recording { driver, recorder: Arc::clone(&self.0), generation }))
    }
}

/// A descriptor of the simulated device that records what it sends.
#[derive(Debug)]
struct Recording {
    driver: Driver,
    recorder: Arc<Recorder>,
    generation: usize,
}

impl HsmpTransport for Recording {
    fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
        let r = &self.recorder;
        if self.generation != r.generation.load(Ordering::SeqCst) {
            return Err(libc::ENODEV);
        }
        let n = {
            let mut sent = r.sent.lock().unwrap();
            sent.push(*msg);
            sent.len()
        };
        let pause = r.pause.lock().unwrap().take_if(|p| p.at == n);
        if let Some(pause) = pause {
            pause.reached.send(()).unwrap();
            pause.resume.recv_timeout(GATE).unwrap();
        }
        self.driver.send(msg)
    }
}

/// A Turin 2P with `cores` cores per socket (static values): RAPL, protocol 7, ESU 16, APIC
/// ids that are not CPU numbers.
fn turin(cores: usize) -> Arc<Machine> {
    let mut spec = Profile::Turin2p.spec();
    spec.core_ids.truncate(cores);
    Machine::new(spec, FirmwareConfig::new(Mode::Static))
}

/// A Genoa 2P with `cores` cores per socket: no RAPL messages, protocol 5.
fn genoa(cores: usize) -> Arc<Machine> {
    let mut spec = Profile::Genoa2p.spec();
    spec.core_ids.truncate(cores);
    Machine::new(spec, FirmwareConfig::new(Mode::Static))
}

/// A sampler with no freshness allowance: a request takes only reads that begin after it
/// arrived, so every request that comes alone reads the mailbox.
fn sampler(machine: &Arc<Machine>) -> (Opener, Sampler) {
    sampler_with_max_age(machine, Duration::ZERO)
}

fn sampler_with_max_age(machine: &Arc<Machine>, max_age: Duration) -> (Opener, Sampler) {
    let opener = Opener::new(machine);
    let topology = machine.topology().clone();
    let sampler = Sampler::with_max_age(topology, Box::new(opener.clone()), None, max_age);
    (opener, sampler)
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn after(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// A clock that moves only when the test moves it: a deadline passes, and a read ages, when
/// the test says so, however fast the threads run.
#[derive(Debug, Clone)]
struct ManualClock(Arc<Mutex<Instant>>);

impl ManualClock {
    fn new() -> ManualClock {
        ManualClock(Arc::new(Mutex::new(Instant::now())))
    }

    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }

    /// `ms` milliseconds from now on this clock.
    fn after(&self, ms: u64) -> Instant {
        self.now() + Duration::from_millis(ms)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

/// A sampler on a [`ManualClock`] with the freshness bound `max_age`.
fn sampler_on_clock(machine: &Arc<Machine>, max_age: Duration) -> (Opener, Sampler, ManualClock) {
    let opener = Opener::new(machine);
    let clock = ManualClock::new();
    let topology = machine.topology().clone();
    let sampler = Sampler::with_clock(
        topology,
        Box::new(opener.clone()),
        None,
        max_age,
        Arc::new(clock.clone()),
    );
    (opener, sampler, clock)
}

/// Waits until `condition` holds; fails the test after [`GATE`].
fn wait_for(what: &str, condition: impl Fn() -> bool) {
    let end = Instant::now() + GATE;
    while !condition() {
        assert!(Instant::now() < end, "{what}: not within {GATE:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn values<T: Clone + std::fmt::Debug>(readings: &Readings<T>) -> Vec<Result<T, ItemError>> {
    match readings {
        Readings::Values(values) => values.clone(),
        other => panic!("expected values, got {other:?}"),
    }
}

/// The energy every core of `machine` should read now, in topology order.
fn energy_of(machine: &Machine) -> Vec<Result<Energy, ItemError>> {
    let fw = machine.firmware();
    let counter = |c: &amd_hsmp_proto::Core| fw.energy_counter(c.socket, c.core).unwrap();
    machine.topology().cores.iter().map(|c| Ok(Energy { counter: counter(c), esu: 16 })).collect()
}

/// The package energy every socket of `machine` should read now, in topology order.
fn package_energy_of(machine: &Machine) -> Vec<Result<Energy, ItemError>> {
    let fw = machine.firmware();
    let counter = |&s: &u32| fw.package_energy_counter(s).unwrap();
    machine.topology().sockets.iter().map(|s| Ok(Energy { counter: counter(s), esu: 16 })).collect()
}

/// Items of `readings` on socket `socket` (by the topology of `machine`).
fn on_socket<T: Clone + std::fmt::Debug>(
    machine: &Machine,
    readings: &Readings<T>,
    socket: u32,
) -> Vec<Result<T, ItemError>> {
    let cores = &machine.topology().cores;
    let values = values(readings);
    cores.iter().zip(values).filter(|(c, _)| c.socket == socket).map(|(_, v)| v).collect()
}

/// Whether `sample` has every energy counter and boost limit of `socket`, as the machine has
/// them (a device not yet open by the deadline has none).
fn socket_read_in_full(machine: &Machine, sample: &Sample, socket: u32) -> bool {
    let opened = matches!(
        (&sample.of::<Energy>(Family::CoreEnergy), &sample.of::<u32>(Family::BoostLimit)),
        (Readings::Values(_), Readings::Values(_))
    );
    let cores = &machine.topology().cores;
    let energy = energy_of(machine);
    let expected = cores.iter().zip(energy).filter(|(c, _)| c.socket == socket).map(|(_, e)| e);
    opened
        && on_socket(machine, &sample.of::<Energy>(Family::CoreEnergy), socket)
            == expected.collect::<Vec<_>>()
        && all_ok(&on_socket(machine, &sample.of::<u32>(Family::BoostLimit), socket))
}

fn all_deadline<T: std::fmt::Debug>(items: &[Result<T, ItemError>]) -> bool {
    items.iter().all(|v| matches!(v, Err(ItemError::DeadlineExceeded)))
}

fn all_ok<T: std::fmt::Debug>(items: &[Result<T, ItemError>]) -> bool {
    items.iter().all(Result::is_ok)
}

/// Panics of socket worker threads since the test process started (a worker's panic is
/// otherwise invisible to the test).
fn worker_panics() -> usize {
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if thread.name().is_some_and(|n| n.starts_with("hsmp-socket")) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
    PANICS.load(Ordering::SeqCst)
}

/// Runs `f` on a thread and returns its handle.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}

#[test]
fn a_sample_of_every_family_costs_one_message_per_item() {
    let machine = turin(3);
    machine.firmware().set_prochot(1, true).unwrap();
    let ppt = SocketFreqLimit { mhz: 3100, reasons: LimitReasons::PPT };
    machine.firmware().set_freq_limit(1, ppt).unwrap();
    let (opener, sampler) = sampler(&machine);
    // The one-time probes: GET_PROTO_VER, then GET_RAPL_UNITS on each socket.
    assert_eq!(opener.count(), 1 + 2);
    let per_sample = Families::ALL.messages(6, 2);

    for round in 1..=3 {
        let sample = sampler.sample(Families::ALL, soon());
        assert_eq!(opener.count(), 3 + round * per_sample, "round {round}");
        assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 });
        assert_eq!(values(&sample.of::<bool>(Family::Prochot)), [Ok(false), Ok(true)]);
        assert_eq!(sample.energy_source, Some(EnergySource::Hsmp));
        assert_eq!(values(&sample.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
        assert_eq!(values(&sample.of::<u32>(Family::BoostLimit)), vec![Ok(3700); 6]);
        let opn = FrequencyLimit { mhz: 3700, reasons: LimitReasons::OPN_MAX.bits() };
        let limited = FrequencyLimit { mhz: 3100, reasons: LimitReasons::PPT.bits() };
        assert_eq!(
            values(&sample.of::<FrequencyLimit>(Family::FrequencyLimit)),
            [Ok(opn), Ok(limited)]
        );
        let cores = [3700, 3700, 3700, 3100, 3100, 3100].map(Ok);
        assert_eq!(values(&sample.of::<u32>(Family::CoreFrequencyLimit)), cores);
        assert_eq!(
            values(&sample.of::<Energy>(Family::PackageEnergy)),
            package_energy_of(&machine)
        );
    }
    assert_eq!(opener.opens(), 1);
    assert_eq!(machine.counters().mailbox_total(), 3 + 3 * per_sample as u64);
}

/// Each family alone, and every family but one (the exporter's default leaves out the per-core
/// frequency limit): its own message once per item, no other family's message.
#[test]
fn a_sample_sends_one_message_per_item_of_the_families_asked_for_and_none_for_the_others() {
    let machine = turin(3);
    let (opener, sampler) = sampler(&machine);
    let alone = Family::ALL.map(|family| Families::of(&[family]));
    let all_but = Family::ALL.map(|family| {
        let mut what = Families::ALL;
        what.set(family, false);
        what
    });
    for what in alone.into_iter().chain(all_but) {
        let before: Vec<usize> =
            Family::ALL.map(|f| opener.count_of(MachineSpec::message(f))).into();
        let total = opener.count();
        let sample = sampler.sample(what, soon());
        assert_eq!(opener.count() - total, what.messages(6, 2), "{what:?}");
        for (family, before) in Family::ALL.into_iter().zip(before) {
            let sent = opener.count_of(MachineSpec::message(family)) - before;
            let want = if what.contains(family) { family.items(6, 2) } else { 0 };
            assert_eq!(sent, want, "{family} in a sample of {what:?}");
        }
        if !what.contains(Family::CoreFrequencyLimit) {
            assert_eq!(sample.of::<u32>(Family::CoreFrequencyLimit), Readings::NotRequested);
        }
    }
}

#[test]
fn the_frequency_limit_is_read_once_per_socket_and_a_failing_socket_fails_alone() {
    let machine = turin(2);
    machine.update_faults(|f| {
        f.errno.insert((FaultGroup::FrequencyLimit, Target::Socket(0)), libc::EIO);
    });
    let (opener, sampler) = sampler(&machine);
    let what = Families::of(&[Family::FrequencyLimit]);
    for round in 1..=2 {
        let sample = sampler.sample(what, soon());
        let opn = FrequencyLimit { mhz: 3700, reasons: LimitReasons::OPN_MAX.bits() };
        let want = [Err(ItemError::Io { errno: libc::EIO }), Ok(opn)];
        assert_eq!(
            values(&sample.of::<FrequencyLimit>(Family::FrequencyLimit)),
            want,
            "round {round}"
        );
        assert_eq!(opener.count_of(Message::GetSocketFreqLimit), 2 * round, "asked again");
    }
}

#[test]
fn frequency_limits_unsupported_on_every_socket_are_remembered_and_asked_no_more() {
    // Genoa answers the messages; take them away as Milan's firmware does.
    let machine = genoa(2);
    machine.update_faults(|f| {
        f.unsupported.insert(FaultGroup::FrequencyLimit);
        f.unsupported.insert(FaultGroup::CoreFrequencyLimit);
    });
    let (opener, sampler) = sampler(&machine);
    let what = Families::of(&[Family::FrequencyLimit, Family::CoreFrequencyLimit, Family::Prochot]);
    for round in 1..=3 {
        let sample = sampler.sample(what, soon());
        let unsupported = Unavailable::Unsupported;
        assert_eq!(
            sample.of::<FrequencyLimit>(Family::FrequencyLimit),
            Readings::Unavailable(unsupported),
            "round {round}"
        );
        let core = Readings::Unavailable(unsupported);
        assert_eq!(sample.of::<u32>(Family::CoreFrequencyLimit), core, "round {round}");
        assert_eq!(
            values(&sample.of::<bool>(Family::Prochot)),
            [Ok(false), Ok(false)],
            "round {round}"
        );
    }
    assert_eq!(opener.count_of(Message::GetSocketFreqLimit), 2, "asked again");
    assert_eq!(opener.count_of(Message::GetCclkCoreLimit), 4, "asked again");
}

/// Issue 28: the package counter is one message per socket, in the socket's energy unit, with
/// no gate: firmware that answers it `ENOMSG` (Turin's with the core counters only, or Genoa's
/// without RAPL) has the family remembered unsupported and asked no more.
#[test]
fn the_package_energy_is_read_once_per_socket_and_omitted_where_the_firmware_lacks_it() {
    let what = Families::of(&[Family::PackageEnergy]);
    let machine = turin(2);
    let (opener, turin_sampler) = sampler(&machine);
    let sample = turin_sampler.sample(what, soon());
    assert_eq!(values(&sample.of::<Energy>(Family::PackageEnergy)), package_energy_of(&machine));
    assert_eq!(opener.count_of(Message::GetRaplPackageCounter), 2);

    let core_counters_only = turin(2);
    core_counters_only.update_faults(|f| {
        f.unsupported.insert(FaultGroup::PackageEnergy);
    });
    let no_rapl = genoa(2);
    for machine in [core_counters_only, no_rapl] {
        let (opener, sampler) = sampler(&machine);
        for round in 1..=3 {
            let sample = sampler.sample(what.with(Family::CoreEnergy), soon());
            let unsupported = Readings::Unavailable(Unavailable::Unsupported);
            assert_eq!(sample.of::<Energy>(Family::PackageEnergy), unsupported, "round {round}");
        }
        let sent = opener.count_of(Message::GetRaplPackageCounter);
        assert!(sent <= 2, "asked again: {sent}");
    }
}

/// The simulator's `thermal-event` scenario: when the last socket asserts PROCHOT, its
/// frequency limit drops in the same sample, set by PROCHOT and cHTC; the other socket stays
/// at the part's maximum.
#[test]
fn in_the_thermal_event_prochot_and_the_frequency_limit_drop_together_on_the_last_socket() {
    let mut spec = Profile::Turin2p.spec();
    spec.core_ids.truncate(2);
    let clock = amd_hsmp_sim::ManualClock::at(Duration::from_secs(5));
    let config = FirmwareConfig {
        scenario: amd_hsmp_sim::Scenario::ThermalEvent,
        clock: amd_hsmp_sim::Clock::Manual(clock.clone()),
        ..FirmwareConfig::new(Mode::Live)
    };
    let machine = Machine::new(spec, config);
    let (_opener, sampler) = sampler(&machine);
    let what = Families::of(&[Family::Prochot, Family::FrequencyLimit]);
    let limits = |sample: &Sample| -> Vec<FrequencyLimit> {
        values(&sample.of::<FrequencyLimit>(Family::FrequencyLimit))
            .into_iter()
            .map(Result::unwrap)
            .collect()
    };

    let before = sampler.sample(what, soon());
    assert_eq!(values(&before.of::<bool>(Family::Prochot)), [Ok(false), Ok(false)]);
    let calm = limits(&before);
    let opn = LimitReasons::OPN_MAX.bits();
    assert!(calm.iter().all(|l| l.reasons == opn), "{calm:?}");

    clock.set(Duration::from_secs(60));
    let during = sampler.sample(what, soon());
    assert_eq!(values(&during.of::<bool>(Family::Prochot)), [Ok(false), Ok(true)]);
    let hot = limits(&during);
    assert_eq!(hot[0], calm[0], "socket 0 is spared");
    assert!(hot[1].mhz < calm[1].mhz, "{hot:?} after {calm:?}");
    let thermal = (LimitReasons::PROCHOT | LimitReasons::CHTC).bits();
    assert_eq!(hot[1].reasons, thermal, "{hot:?}");
}

#[test]
fn a_family_not_asked_for_costs_nothing() {
    let machine = turin(4);
    let (opener, sampler) = sampler(&machine);
    let before = opener.count();
    let what = Families::of(&[Family::BoostLimit]);
    let sample = sampler.sample(what, soon());
    assert_eq!(opener.count() - before, 8);
    assert_eq!(opener.count_of(Message::GetBoostLimit), 8);
    assert_eq!(sample.of::<Energy>(Family::CoreEnergy), Readings::NotRequested);
    assert_eq!(sample.energy_source, None);
    assert_eq!(sample.of::<bool>(Family::Prochot), Readings::NotRequested);

    sampler.sample(Families::default(), soon());
    assert_eq!(opener.count() - before, 8);
}

#[test]
fn cores_are_addressed_by_apic_id_on_their_socket() {
    let machine = turin(3);
    let topo = machine.topology().clone();
    let (opener, sampler) = sampler(&machine);
    let c = &topo.cores[4];
    machine.firmware().set_boost_limit(c.socket, c.core, 3123).unwrap();
    let what = Families::of(&[Family::BoostLimit]);
    let sample = sampler.sample(what, soon());

    let mut sent: Vec<_> = opener
        .sent()
        .iter()
        .filter(|m| m.msg_id == Message::GetBoostLimit.id())
        .map(|m| (u32::from(m.sock_ind), m.args[0]))
        .collect();
    sent.sort();
    let want: Vec<_> = topo.cores.iter().map(|c| (c.socket, c.apic_id)).collect();
    assert_eq!(sent, want);
    assert!(topo.cores.iter().any(|c| c.apic_id != c.cpu));
    let mut limits = vec![Ok(3700); 6];
    limits[4] = Ok(3123);
    assert_eq!(values(&sample.of::<u32>(Family::BoostLimit)), limits);
}

#[test]
fn a_family_unsupported_on_every_item_is_remembered() {
    let machine = turin(3);
    machine.update_faults(|f| {
        f.unsupported.insert(FaultGroup::BoostLimit);
    });
    let (opener, sampler) = sampler(&machine);
    let first = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(
        first.of::<u32>(Family::BoostLimit),
        Readings::Unavailable(Unavailable::Unsupported)
    );
    assert_eq!(opener.count_of(Message::GetBoostLimit), 6);

    let before = opener.count();
    let second = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(
        second.of::<u32>(Family::BoostLimit),
        Readings::Unavailable(Unavailable::Unsupported)
    );
    assert_eq!(opener.count_of(Message::GetBoostLimit), 6, "asked again");
    assert_eq!(opener.count() - before, 6 + 2);
    assert_eq!(values(&second.of::<bool>(Family::Prochot)), [Ok(false), Ok(false)]);
}

#[test]
fn one_failing_core_fails_only_its_item_and_is_asked_again() {
    let machine = turin(3);
    let topo = machine.topology().clone();
    let bad = topo.cores[4].apic_id;
    machine.update_faults(|f| {
        f.errno.insert((FaultGroup::BoostLimit, Target::Apic(bad)), libc::EIO);
    });
    let (opener, sampler) = sampler(&machine);
    for _ in 0..2 {
        let mut want = vec![Ok(3700); 6];
        want[4] = Err(ItemError::Io { errno: libc::EIO });
        assert_eq!(
            values(&sampler.sample(V2_FAMILIES, soon()).of::<u32>(Family::BoostLimit)),
            want
        );
    }
    assert_eq!(opener.count_of(Message::GetBoostLimit), 12);
}

#[test]
fn past_the_deadline_nothing_is_sent() {
    let machine = turin(3);
    let (opener, sampler) = sampler(&machine);
    let before = opener.count();
    let sample = sampler.sample(V2_FAMILIES, Instant::now());
    assert_eq!(opener.count(), before);
    assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 });
    assert_eq!(
        values(&sample.of::<Energy>(Family::CoreEnergy)),
        vec![Err(ItemError::DeadlineExceeded); 6]
    );
    assert_eq!(
        values(&sample.of::<u32>(Family::BoostLimit)),
        vec![Err(ItemError::DeadlineExceeded); 6]
    );
    assert_eq!(
        values(&sample.of::<bool>(Family::Prochot)),
        vec![Err(ItemError::DeadlineExceeded); 2]
    );
}

/// Regression (D4): a worker delivering an item after its request had been answered indexed
/// the emptied result vectors and panicked.
#[test]
fn a_deadline_passing_mid_sample_stops_the_messages_and_keeps_what_was_read() {
    let panics = worker_panics();
    let machine = turin(4);
    let (opener, sampler, clock) = sampler_on_clock(&machine, Duration::ZERO);
    let sampler = Arc::new(sampler);
    let before = opener.count();
    let entered = [0, 1].map(|socket| machine.mailbox(socket).entered);
    // Each socket: PROCHOT, then 4 energy counters; the 5th message from now is stopped.
    let (reached, resume) = opener.pause_at(5);
    let deadline = clock.after(1000);
    let s = Arc::clone(&sampler);
    let request = spawn(move || s.sample(V2_FAMILIES, deadline));
    reached.recv_timeout(GATE).unwrap();
    let stopped = usize::from(opener.sent()[before + 4].sock_ind);
    let other = 1 - stopped;
    // The other socket reads its 9 items; then the deadline passes while the stopped message
    // is still on its way, and the request is answered.
    machine
        .wait_mailbox(other as u32, GATE, |b| b.entered == entered[other] + 9 && b.pending == 0)
        .unwrap();
    let sent_to = |socket: usize| {
        opener.sent()[before..].iter().filter(|m| usize::from(m.sock_ind) == socket).count()
    };
    let stopped_sent = sent_to(stopped);
    clock.advance(Duration::from_millis(1000));
    let sample = request.join().unwrap();
    resume.send(()).unwrap();
    sampler.wait_idle();
    // The stopped socket sent nothing after its stopped message.
    assert_eq!(sent_to(stopped), stopped_sent, "sent after the deadline");
    let sent = opener.count() - before;
    assert_eq!(sent, stopped_sent + 9);
    let ok = |n: usize, m: usize, k: usize| n + m + k;
    let read = ok(
        values(&sample.of::<Energy>(Family::CoreEnergy)).iter().filter(|v| v.is_ok()).count(),
        values(&sample.of::<u32>(Family::BoostLimit)).iter().filter(|v| v.is_ok()).count(),
        values(&sample.of::<bool>(Family::Prochot)).iter().filter(|v| v.is_ok()).count(),
    );
    assert_eq!(read, sent - 1, "every message answered before the deadline is in the reply");
    assert_eq!(worker_panics(), panics, "a socket worker panicked");
    // A later sample reads everything again.
    let next = sampler.sample(V2_FAMILIES, clock.after(30_000));
    assert_eq!(values(&next.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
}

#[test]
fn a_device_that_appears_later_is_picked_up() {
    let machine = genoa(2);
    let opener = Opener::new(&machine);
    opener.refuse(Some(libc::ENOENT));
    let sampler = Sampler::with_max_age(
        machine.topology().clone(),
        Box::new(opener.clone()),
        None,
        Duration::ZERO,
    );
    for _ in 0..3 {
        let sample = sampler.sample(V2_FAMILIES, soon());
        assert_eq!(sample.hsmp, DeviceStatus::Absent);
        assert_eq!(
            sample.of::<u32>(Family::BoostLimit),
            Readings::Unavailable(Unavailable::NoDevice)
        );
        assert_eq!(
            sample.of::<Energy>(Family::CoreEnergy),
            Readings::Unavailable(Unavailable::NoDevice)
        );
    }
    // Once at start-up, then at most once per sample.
    assert_eq!(opener.opens(), 4);
    assert_eq!(opener.count(), 0);

    opener.refuse(None); // modprobe amd_hsmp
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 5 });
    assert_eq!(values(&sample.of::<u32>(Family::BoostLimit)), vec![Ok(3800); 4]);
    // Genoa has no RAPL: the probes find out once, no counter is asked.
    assert_eq!(
        sample.of::<Energy>(Family::CoreEnergy),
        Readings::Unavailable(Unavailable::Unsupported)
    );
    assert_eq!(opener.count_of(Message::GetProtoVer), 2, "one probe per socket");
    assert_eq!(opener.count_of(Message::GetRaplUnits), 2);
    assert_eq!(opener.count_of(Message::GetRaplCoreCounter), 0);
    let before = opener.count();
    sampler.sample(V2_FAMILIES, soon());
    assert_eq!(opener.count() - before, 4 + 2, "no probe again");
    assert_eq!(opener.opens(), 5);
}

#[test]
fn open_errors_give_the_device_status() {
    let cases = [
        (libc::ENOENT, DeviceStatus::Absent),
        (libc::ENODEV, DeviceStatus::Absent),
        (libc::EACCES, DeviceStatus::PermissionDenied),
        (libc::EPERM, DeviceStatus::PermissionDenied),
        (libc::EIO, DeviceStatus::Failed(ItemError::Io { errno: libc::EIO })),
    ];
    for (errno, want) in cases {
        let machine = genoa(1);
        let opener = Opener::new(&machine);
        opener.refuse(Some(errno));
        let sampler = Sampler::with_max_age(
            machine.topology().clone(),
            Box::new(opener),
            None,
            Duration::ZERO,
        );
        assert_eq!(sampler.sample(V2_FAMILIES, soon()).hsmp, want, "errno {errno}");
    }
}

#[test]
fn a_device_that_does_not_answer_the_version_has_failed() {
    let machine = genoa(2);
    machine.update_faults(|f| {
        for socket in 0..2 {
            f.errno.insert((FaultGroup::ProtoVersion, Target::Socket(socket)), libc::ETIMEDOUT);
        }
    });
    let (opener, sampler) = sampler(&machine);
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.hsmp, DeviceStatus::Failed(ItemError::TimedOut));
    assert_eq!(sample.of::<bool>(Family::Prochot), Readings::Unavailable(Unavailable::NoDevice));
    assert_eq!(sample.of::<u32>(Family::BoostLimit), Readings::Unavailable(Unavailable::NoDevice));
    assert_eq!(opener.count_of(Message::GetProcHot), 0);

    // Once the firmware answers, the device is opened again and served.
    machine.set_faults(Default::default());
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 5 });
    assert_eq!(values(&sample.of::<bool>(Family::Prochot)), [Ok(false), Ok(false)]);
}

#[test]
fn sockets_are_read_in_parallel_and_each_socket_serially() {
    let machine = turin(3);
    let (_opener, sampler) = sampler(&machine);
    let sampler = Arc::new(sampler);
    let before = [machine.mailbox(0).entered, machine.mailbox(1).entered];
    machine.hold_socket(0);
    let s = Arc::clone(&sampler);
    let request = spawn(move || s.sample(V2_FAMILIES, soon()));
    // Socket 1 reads all its items while socket 0's first message is held.
    machine.wait_mailbox(0, GATE, |b| b.entered == before[0] + 1).unwrap();
    machine.wait_mailbox(1, GATE, |b| b.entered == before[1] + 7 && b.pending == 0).unwrap();
    assert_eq!(machine.mailbox(0).entered, before[0] + 1);
    machine.release_socket(0);
    let sample = request.join().unwrap();
    assert!(
        all_ok(&values(&sample.of::<Energy>(Family::CoreEnergy)))
            && all_ok(&values(&sample.of::<u32>(Family::BoostLimit)))
    );
    assert_eq!(machine.mailbox(0).max_pending, 1);
    assert_eq!(machine.mailbox(1).max_pending, 1);
}

/// Regression: the sample used to wait for the messages still in the mailbox at the
/// deadline, so a wedged socket made the whole reply late and the frontend dropped it.
#[test]
fn the_answer_comes_at_the_deadline_even_with_messages_in_flight() {
    let machine = turin(2);
    let (opener, sampler, clock) = sampler_on_clock(&machine, Duration::ZERO);
    let sampler = Arc::new(sampler);
    let before = opener.count();
    machine.hold_socket(0);
    machine.hold_socket(1);
    let s = Arc::clone(&sampler);
    let (tx, rx) = mpsc::channel();
    let deadline = clock.after(250);
    spawn(move || tx.send(s.sample(V2_FAMILIES, deadline)).unwrap());
    // Each socket's first message (PROCHOT) is in its mailbox, held there.
    for socket in [0, 1] {
        machine.wait_mailbox(socket, GATE, |b| b.pending == 1).unwrap();
    }
    assert!(rx.try_recv().is_err(), "answered before the deadline");
    clock.advance(Duration::from_millis(250));
    let sample = rx.recv_timeout(GATE).expect("answered while both messages are held");
    let in_flight = [0, 1].map(|socket| machine.mailbox(socket).pending);
    machine.release_socket(0);
    machine.release_socket(1);
    sampler.wait_idle();
    assert_eq!(in_flight, [1, 1], "both messages were held when the answer came");
    assert_eq!(values(&sample.of::<bool>(Family::Prochot)), [Err(ItemError::DeadlineExceeded); 2]);
    assert!(all_deadline(&values(&sample.of::<Energy>(Family::CoreEnergy))));
    assert!(all_deadline(&values(&sample.of::<u32>(Family::BoostLimit))));
    // Nothing was sent after the deadline.
    assert_eq!(opener.count() - before, 2);
}

/// Regression (D7): every request started a thread per socket, and a thread stuck behind a
/// wedged mailbox still sent its message when the mailbox freed: threads and stale messages
/// piled up, one per request.
#[test]
fn a_wedged_socket_holds_one_message_and_queues_no_work() {
    let machine = turin(3);
    let (opener, sampler, clock) = sampler_on_clock(&machine, Duration::ZERO);
    let sampler = Arc::new(sampler);
    let before = machine.mailbox(1);
    machine.hold_socket(1);
    for round in 0..3 {
        let healthy = machine.mailbox(0).entered;
        let s = Arc::clone(&sampler);
        let deadline = clock.after(250);
        let request = spawn(move || s.sample(V2_FAMILIES, deadline));
        // Socket 0 is read in full (PROCHOT, 3 counters, 3 boost limits) while 1 is wedged;
        // then the deadline passes.
        machine.wait_mailbox(0, GATE, |b| b.entered == healthy + 7 && b.pending == 0).unwrap();
        machine.wait_mailbox(1, GATE, |b| b.pending == 1).unwrap();
        clock.advance(Duration::from_millis(250));
        let sample = request.join().unwrap();
        assert!(socket_read_in_full(&machine, &sample, 0), "{round}");
        let healthy_now = machine.mailbox(0);
        assert_eq!((healthy_now.entered, healthy_now.pending), (healthy + 7, 0), "{round}");
        assert!(
            all_deadline(&on_socket(&machine, &sample.of::<Energy>(Family::CoreEnergy), 1)),
            "{round}"
        );
        let wedged = machine.mailbox(1);
        assert_eq!((wedged.entered, wedged.pending), (before.entered + 1, 1), "{round}");
    }
    let sent_to_1 = || opener.sent().iter().filter(|m| m.sock_ind == 1).count();
    let sent = sent_to_1();
    machine.release_socket(1);
    sampler.wait_idle();
    // The held message finishes; the worker sends nothing for the requests that have passed.
    assert_eq!(sent_to_1(), sent);
    assert_eq!(machine.mailbox(1).max_pending, 1);
    // The socket is read again by the next request.
    let sample = sampler.sample(V2_FAMILIES, clock.after(30_000));
    assert!(all_ok(&values(&sample.of::<Energy>(Family::CoreEnergy))));
}

/// Regression (P4): a request whose peer had hung up waited in the sampler until its deadline,
/// keeping its connection slot, and its wants kept the worker reading for nobody. Now it stops
/// waiting once `gone` says so, and what only it wanted is not read.
#[test]
fn a_request_whose_requester_is_gone_stops_waiting_and_wants_nothing_more() {
    let machine = turin(3);
    let (opener, sampler) = sampler(&machine);
    let sampler = Arc::new(sampler);
    let before = machine.mailbox(1);
    machine.hold_socket(1);
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, g) = (Arc::clone(&sampler), Arc::clone(&gone));
    let (tx, rx) = mpsc::channel();
    let request = spawn(move || {
        tx.send(s.sample_while(V2_FAMILIES, soon(), &|| g.load(Ordering::SeqCst))).unwrap()
    });
    machine.wait_mailbox(1, GATE, |b| b.pending == 1).unwrap();
    let early = rx.recv_timeout(Duration::from_millis(100));
    assert!(early.is_err(), "answered while its requester was there: {early:?}");
    gone.store(true, Ordering::SeqCst);
    // Its deadline is 30 s away; it answers within the next check of `gone`.
    let sample = rx.recv_timeout(GATE).expect("still waiting after its requester left");
    assert!(all_deadline(&on_socket(&machine, &sample.of::<Energy>(Family::CoreEnergy), 1)));
    request.join().unwrap();
    let sent_to_1 = || opener.sent().iter().filter(|m| m.sock_ind == 1).count();
    let sent = sent_to_1();
    machine.release_socket(1);
    sampler.wait_idle();
    // The message in flight finishes; nothing more is sent for the request that left.
    assert_eq!(sent_to_1(), sent);
    assert_eq!(machine.mailbox(1).entered, before.entered + 1);
}

/// Regression (N2): a request that found a socket's worker busy, even for a moment, skipped
/// that socket for its whole deadline. Now it waits for the worker, which reads its items as
/// soon as the message in flight is done.
#[test]
fn a_busy_socket_queues_the_request_and_serves_it_when_free() {
    let machine = turin(2);
    let (_opener, sampler, clock) = sampler_on_clock(&machine, Duration::ZERO);
    let sampler = Arc::new(sampler);
    machine.hold_socket(1);
    let s = Arc::clone(&sampler);
    let deadline = clock.after(10);
    let first = spawn(move || s.sample(V2_FAMILIES, deadline));
    machine.wait_mailbox(1, GATE, |b| b.pending == 1).unwrap();
    clock.advance(Duration::from_millis(10));
    first.join().unwrap();
    // A request with a long deadline while socket 1 is still inside the first one's message.
    let s = Arc::clone(&sampler);
    let (tx, rx) = mpsc::channel();
    let deadline = clock.after(30_000);
    let request = spawn(move || tx.send(s.sample(V2_FAMILIES, deadline)).unwrap());
    // It waits for the socket rather than answering without it.
    wait_for("the request waits on socket 1", || sampler.workers.waiting()[1] == 1);
    let early = rx.recv_timeout(Duration::from_millis(50));
    assert!(early.is_err(), "answered while socket 1 was busy: {early:?}");
    machine.release_socket(1);
    let sample = rx.recv_timeout(GATE).expect("answered once the socket is free");
    assert_eq!(values(&sample.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
    assert!(
        all_ok(&values(&sample.of::<u32>(Family::BoostLimit)))
            && all_ok(&values(&sample.of::<bool>(Family::Prochot)))
    );
    request.join().unwrap();
}

/// Regression (N2): a request for families the running reading did not cover started a reading
/// of its own, which skipped every socket still busy with the first one. In either order, each
/// request gets its families, and what they share is read once.
#[test]
fn a_request_for_other_families_shares_the_socket_and_is_not_starved() {
    let energy_only = Families::of(&[Family::CoreEnergy]);
    for (first_asks, second_asks) in [(energy_only, V2_FAMILIES), (V2_FAMILIES, energy_only)] {
        let machine = turin(3);
        let (opener, sampler) = sampler_with_max_age(&machine, Duration::from_secs(60));
        let sampler = Arc::new(sampler);
        let before = opener.count();
        let socket_1 = machine.mailbox(1).entered;
        machine.hold_socket(0);
        let s = Arc::clone(&sampler);
        let first = spawn(move || s.sample(first_asks, after(5000)));
        machine.wait_mailbox(0, GATE, |b| b.pending == 1).unwrap();
        let s = Arc::clone(&sampler);
        let second = spawn(move || s.sample(second_asks, after(5000)));
        // Socket 1 serves both (3 energy counters, PROCHOT, 3 boost limits) while socket 0 is
        // held.
        machine.wait_mailbox(1, GATE, |b| b.pending == 0 && b.entered == socket_1 + 7).unwrap();
        machine.release_socket(0);
        let (first, second) = (first.join().unwrap(), second.join().unwrap());
        let (all, energy) =
            if first_asks == V2_FAMILIES { (first, second) } else { (second, first) };
        assert_eq!(values(&energy.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
        assert_eq!(values(&all.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
        assert!(
            all_ok(&values(&all.of::<u32>(Family::BoostLimit))),
            "{first_asks:?} first: {:?}",
            all.of::<u32>(Family::BoostLimit)
        );
        assert!(all_ok(&values(&all.of::<bool>(Family::Prochot))));
        // The energy counters were read once for both.
        assert_eq!(opener.count() - before, 2 * 6 + 2, "each item read once");
    }
}

/// Regression (N6): a request that joined a running reading got the values read when that
/// reading began, however long before it arrived, and one long deadline kept the reading (and
/// its old values) alive for every later request.
#[test]
fn a_later_request_never_gets_values_read_before_the_bound_while_a_long_one_waits() {
    let max_age = Duration::from_millis(50);
    let machine = turin(3);
    let (opener, sampler, clock) = sampler_on_clock(&machine, max_age);
    let sampler = Arc::new(sampler);
    let socket_0_before = machine.mailbox(0).entered;
    machine.hold_socket(1);
    // A peer's request with a long deadline: socket 0 is read, socket 1 is wedged.
    let s = Arc::clone(&sampler);
    let deadline = clock.after(30_000);
    let long = spawn(move || s.sample(V2_FAMILIES, deadline));
    machine.wait_mailbox(0, GATE, |b| b.pending == 0 && b.entered == socket_0_before + 7).unwrap();
    let socket_0 = || opener.sent().iter().filter(|m| m.sock_ind == 0).count();
    let read_once = socket_0();
    // Past the bound the energy has moved on; a new request must see it.
    clock.advance(max_age + Duration::from_millis(1));
    machine.firmware().advance_all_energy(5.0).unwrap();
    let s = Arc::clone(&sampler);
    let deadline = clock.after(2000);
    let later = spawn(move || s.sample(V2_FAMILIES, deadline));
    machine.wait_mailbox(0, GATE, |b| b.pending == 0 && b.entered == socket_0_before + 14).unwrap();
    clock.advance(Duration::from_millis(2000));
    let later = later.join().unwrap();
    assert_eq!(
        on_socket(&machine, &later.of::<Energy>(Family::CoreEnergy), 0),
        energy_of(&machine)[..3]
    );
    assert!(all_ok(&on_socket(&machine, &later.of::<u32>(Family::BoostLimit), 0)));
    assert_eq!(socket_0(), read_once + 7, "socket 0 read again for the later request");
    assert_eq!(later.oldest_read_us, 0, "every value was read after the request arrived");
    assert_eq!(later.max_age_ms, 50);
    machine.release_socket(1);
    long.join().unwrap();
}

/// Requests within the freshness bound share reads: the second is answered from the first's
/// values without a message, and says how old they are.
#[test]
fn a_request_within_the_bound_takes_the_reads_before_it_and_says_how_old_they_are() {
    let machine = turin(3);
    let (opener, sampler, clock) = sampler_on_clock(&machine, Duration::from_secs(60));
    let first = sampler.sample(V2_FAMILIES, clock.after(30_000));
    assert_eq!(first.oldest_read_us, 0, "everything was read after the request arrived");
    let before = opener.count();
    clock.advance(Duration::from_millis(1500));
    let second = sampler.sample(V2_FAMILIES, clock.after(30_000));
    assert_eq!(opener.count(), before, "no message");
    assert_eq!(second.of::<Energy>(Family::CoreEnergy), first.of::<Energy>(Family::CoreEnergy));
    assert_eq!(second.oldest_read_us, 1_500_000);
    assert_eq!(second.max_age_ms, 60_000);
    // At the bound the reads are still taken; past it, read again.
    clock.advance(Duration::from_millis(58_500));
    let third = sampler.sample(V2_FAMILIES, clock.after(30_000));
    assert_eq!((opener.count(), third.oldest_read_us), (before, 60_000_000));
    clock.advance(Duration::from_millis(1));
    let fourth = sampler.sample(V2_FAMILIES, clock.after(30_000));
    assert_eq!((opener.count() - before, fourth.oldest_read_us), (2 * 6 + 2, 0));
}

/// Regression (D12): one connection looping requests drove the mailbox as fast as it answered.
/// Now each item is read at most once per freshness bound, whoever asks how often.
#[test]
fn requests_in_a_loop_read_each_item_at_most_once_per_max_age() {
    let max_age = Duration::from_millis(100);
    let machine = turin(3);
    let (opener, sampler, clock) = sampler_on_clock(&machine, max_age);
    let before = opener.count();
    // 50 requests 10 ms apart: the reads begun at 0 ms serve the requests up to 100 ms, then
    // the one at 110 ms reads again, and so on: 5 readings in 500 ms.
    for _ in 0..50 {
        let sample = sampler.sample(V2_FAMILIES, clock.after(1000));
        assert!(all_ok(&values(&sample.of::<Energy>(Family::CoreEnergy))));
        clock.advance(Duration::from_millis(10));
    }
    assert_eq!(opener.count() - before, 5 * (2 * 6 + 2), "one reading per 110 ms");
}

/// Two requests that overlap share one reading: the mailbox sees one sample's messages, the
/// short request is answered at its own deadline with what was read by then, and the long one
/// gets the complete reading as soon as it is complete.
#[test]
fn concurrent_samples_share_one_reading_each_answered_at_its_own_deadline() {
    for short_first in [true, false] {
        let machine = turin(3);
        let (opener, sampler, clock) = sampler_on_clock(&machine, Duration::from_secs(60));
        let sampler = Arc::new(sampler);
        let before = opener.count();
        let socket_1 = machine.mailbox(1).entered;
        machine.hold_socket(0);
        let (short_deadline, long_deadline) = (clock.after(2000), clock.after(30_000));
        let first_deadline = if short_first { short_deadline } else { long_deadline };
        let s = Arc::clone(&sampler);
        let first = spawn(move || s.sample(V2_FAMILIES, first_deadline));
        machine.wait_mailbox(0, GATE, |b| b.pending == 1).unwrap();
        let second_deadline = if short_first { long_deadline } else { short_deadline };
        let s = Arc::clone(&sampler);
        let second = spawn(move || s.sample(V2_FAMILIES, second_deadline));
        // The second joins the first's reading on socket 0, which is still held.
        wait_for("both requests wait on socket 0", || sampler.workers.waiting()[0] == 2);
        let (short, long) = if short_first { (first, second) } else { (second, first) };
        // The short request is answered at its deadline, while socket 0 is held: socket 1
        // read, socket 0 not.
        machine.wait_mailbox(1, GATE, |b| b.pending == 0 && b.entered == socket_1 + 7).unwrap();
        clock.advance(Duration::from_millis(2000));
        let short = short.join().unwrap();
        assert!(
            all_ok(&on_socket(&machine, &short.of::<Energy>(Family::CoreEnergy), 1)),
            "short first: {short_first}"
        );
        assert!(all_deadline(&on_socket(&machine, &short.of::<Energy>(Family::CoreEnergy), 0)));
        assert!(!long.is_finished(), "the long request waits for the rest of the reading");
        machine.release_socket(0);
        let long = long.join().unwrap();
        assert_eq!(
            values(&long.of::<Energy>(Family::CoreEnergy)),
            energy_of(&machine),
            "short first: {short_first}"
        );
        assert!(
            all_ok(&values(&long.of::<u32>(Family::BoostLimit)))
                && all_ok(&values(&long.of::<bool>(Family::Prochot)))
        );
        assert_eq!(opener.count() - before, 2 * 6 + 2, "one reading's messages");
    }
}

/// Regression (D6): a `/dev/hsmp` that appeared after start-up was probed under the device
/// lock, so a wedged socket blocked every request, the healthy socket's included.
#[test]
fn a_late_device_with_a_wedged_socket_serves_the_healthy_socket_in_time() {
    let machine = turin(2);
    let opener = Opener::new(&machine);
    opener.refuse(Some(libc::ENOENT));
    let topology = machine.topology().clone();
    let clock = ManualClock::new();
    let sampler = Sampler::with_clock(
        topology,
        Box::new(opener.clone()),
        None,
        Duration::ZERO,
        Arc::new(clock.clone()),
    );
    let sampler = Arc::new(sampler);
    assert_eq!(sampler.sample(V2_FAMILIES, clock.after(30_000)).hsmp, DeviceStatus::Absent);
    opener.refuse(None);
    machine.hold_socket(0);
    for round in 0..3 {
        let healthy = machine.mailbox(1).entered;
        let s = Arc::clone(&sampler);
        let (tx, rx) = mpsc::channel();
        let deadline = clock.after(250);
        spawn(move || tx.send(s.sample(V2_FAMILIES, deadline)).unwrap());
        // Socket 1 is probed (the first round) and read in full while socket 0 is wedged.
        let probes = if round == 0 { 2 } else { 0 };
        let served = machine.wait_mailbox(1, GATE, |b| b.entered == healthy + probes + 5);
        let served = served.and_then(|_| machine.wait_mailbox(1, GATE, |b| b.pending == 0));
        clock.advance(Duration::from_millis(250));
        // Answered at the deadline, whatever socket 0 holds.
        let answer = rx.recv_timeout(GATE);
        let (Ok(served), Ok(sample)) = (served, answer) else {
            machine.release_socket(0);
            panic!("round {round}: socket 1 not served, or no answer, while socket 0 is wedged");
        };
        assert!(socket_read_in_full(&machine, &sample, 1), "{round}");
        assert_eq!((served.entered, served.pending), (healthy + probes + 5, 0), "{round}");
        assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 }, "{round}");
        assert_eq!(
            values(&sample.of::<bool>(Family::Prochot))[0],
            Err(ItemError::DeadlineExceeded)
        );
    }
    machine.release_socket(0);
}

/// Regression (D11): a device that was replaced (a driver rebind) kept failing with `ENODEV`
/// forever, since only a device that had never opened was opened again.
#[test]
fn a_device_gone_on_every_socket_is_reopened() {
    let machine = turin(2);
    let (opener, sampler) = sampler(&machine);
    assert!(all_ok(&values(&sampler.sample(V2_FAMILIES, soon()).of::<Energy>(Family::CoreEnergy))));
    opener.replace();
    let broken = sampler.sample(V2_FAMILIES, soon());
    assert!(
        values(&broken.of::<u32>(Family::BoostLimit))
            .iter()
            .all(|v| *v == Err(ItemError::NoSuchSocket))
    );
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(opener.opens(), 2);
    assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 });
    assert_eq!(values(&sample.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
    assert!(all_ok(&values(&sample.of::<u32>(Family::BoostLimit))));
}

/// A reopened device keeps the energy units it had: with the MSR fallback on a part with
/// RAPL, energy does not switch sources (a counter reset) while the new descriptor is probed.
#[test]
fn a_reopened_device_keeps_its_energy_source() {
    let machine = turin(2);
    let topo = machine.topology().clone();
    let msr: Arc<dyn CoreCounters> =
        Arc::new(MsrEnergy::open(&topo, &machine.msr_opener()).unwrap());
    let opener = Opener::new(&machine);
    let sampler = Sampler::with_max_age(topo, Box::new(opener.clone()), Some(msr), Duration::ZERO);
    assert_eq!(sampler.sample(V2_FAMILIES, soon()).energy_source, Some(EnergySource::Hsmp));
    opener.replace();
    sampler.sample(V2_FAMILIES, soon());
    let before = opener.count_of(Message::GetRaplUnits);
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(opener.opens(), 2);
    assert_eq!(sample.energy_source, Some(EnergySource::Hsmp));
    assert_eq!(values(&sample.of::<Energy>(Family::CoreEnergy)), energy_of(&machine));
    assert_eq!(opener.count_of(Message::GetRaplUnits), before, "units taken over");
}

#[test]
fn one_socket_failing_as_gone_does_not_reopen_the_device() {
    let machine = turin(2);
    machine.update_faults(|f| {
        for core in machine.topology().cores.iter().filter(|c| c.socket == 1) {
            f.errno.insert((FaultGroup::BoostLimit, Target::Apic(core.apic_id)), libc::ENODEV);
            f.errno.insert((FaultGroup::CoreEnergy, Target::Apic(core.apic_id)), libc::ENODEV);
        }
        f.errno.insert((FaultGroup::Prochot, Target::Socket(1)), libc::ENODEV);
    });
    let (opener, sampler) = sampler(&machine);
    for _ in 0..3 {
        let sample = sampler.sample(V2_FAMILIES, soon());
        assert!(all_ok(&on_socket(&machine, &sample.of::<Energy>(Family::CoreEnergy), 0)));
    }
    assert_eq!(opener.opens(), 1);
}

/// The socket workers are started once and reused: requests do not start threads.
#[test]
fn requests_reuse_one_worker_per_socket() {
    let machine = turin(2);
    let (_opener, sampler) = sampler(&machine);
    for _ in 0..5 {
        sampler.sample(V2_FAMILIES, soon());
    }
    let first = sampler.workers.thread_ids();
    assert!(first.iter().all(Option::is_some), "{first:?}");
    for _ in 0..5 {
        sampler.sample(V2_FAMILIES, soon());
        assert_eq!(sampler.workers.thread_ids(), first);
    }
}

#[test]
fn energy_falls_back_to_the_msrs_when_rapl_is_unsupported() {
    let machine = genoa(3);
    let topo = machine.topology().clone();
    let msr: Arc<dyn CoreCounters> =
        Arc::new(MsrEnergy::open(&topo, &machine.msr_opener()).unwrap());
    let opener = Opener::new(&machine);
    let sampler = Sampler::with_max_age(topo, Box::new(opener.clone()), Some(msr), Duration::ZERO);
    let before = opener.count();

    machine.firmware().advance_all_energy(3.0).unwrap();
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.energy_source, Some(EnergySource::Msr));
    let energy = values(&sample.of::<Energy>(Family::CoreEnergy));
    assert_eq!(energy, vec![Ok(Energy { counter: 3 << 16, esu: 16 }); 6]);
    // Only boost limits and PROCHOT went to the mailbox.
    assert_eq!(opener.count() - before, 6 + 2);
    assert_eq!(opener.count_of(Message::GetRaplCoreCounter), 0);
}

#[test]
fn energy_comes_from_the_msrs_without_an_hsmp_device() {
    let machine = genoa(2);
    let topo = machine.topology().clone();
    let msr: Arc<dyn CoreCounters> =
        Arc::new(MsrEnergy::open(&topo, &machine.msr_opener()).unwrap());
    let opener = Opener::new(&machine);
    opener.refuse(Some(libc::ENOENT));
    let sampler = Sampler::with_max_age(topo, Box::new(opener.clone()), Some(msr), Duration::ZERO);
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.hsmp, DeviceStatus::Absent);
    assert_eq!(sample.energy_source, Some(EnergySource::Msr));
    assert_eq!(sample.of::<bool>(Family::Prochot), Readings::Unavailable(Unavailable::NoDevice));

    // A late device without RAPL: energy stays with the MSRs, before and after the probes.
    opener.refuse(None);
    for _ in 0..2 {
        let sample = sampler.sample(V2_FAMILIES, soon());
        assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 5 });
        assert_eq!(sample.energy_source, Some(EnergySource::Msr));
        assert!(all_ok(&values(&sample.of::<Energy>(Family::CoreEnergy))));
    }
    assert_eq!(opener.count_of(Message::GetRaplCoreCounter), 0);
}

#[test]
fn a_failure_class_is_logged_once_not_per_request() {
    use amd_hsmp_cli::log::{LogFormat, LogLevel, capture};
    let log = capture(LogLevel::Info, LogFormat::Logfmt, || {
        let machine = turin(4);
        machine.update_faults(|f| {
            for core in machine.topology().cores.iter().take(2) {
                let target = Target::Apic(core.apic_id);
                f.errno.insert((FaultGroup::BoostLimit, target), libc::EREMOTEIO);
            }
        });
        let (_opener, sampler) = sampler(&machine);
        for _ in 0..5 {
            sampler.sample(V2_FAMILIES, soon());
        }
    });
    let errno = format!("errno {}", libc::EREMOTEIO);
    assert_eq!(log.iter().filter(|l| l.contains(&errno)).count(), 1, "{log:#?}");
    assert!(log.iter().any(|l| l.contains("boost-limit")), "{log:#?}");
}

// ---- The energy source chosen at start-up ----

/// A sampler whose energy source was chosen among `sources`, as the broker's start-up does.
fn chosen(machine: &Arc<Machine>, sources: &[SourceName]) -> (Opener, Sampler) {
    let (opener, mut sampler) = sampler(machine);
    let (perf, msr) = (machine.perf_locator(), machine.msr_opener());
    let openers = crate::energy::Openers { perf: &perf, msr: &msr };
    sampler.choose_energy(sources, &openers);
    (opener, sampler)
}

use crate::energy::SourceName::{self, Hsmp as HsmpSource, Msr as MsrSource, Perf as PerfSource};

#[test]
fn without_hsmp_rapl_energy_comes_exactly_from_the_perf_counter() {
    let machine = genoa(3);
    let (opener, sampler) = chosen(&machine, &[HsmpSource, PerfSource]);
    machine.firmware().advance_all_energy(3.0).unwrap();
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.energy_source, Some(EnergySource::Perf));
    assert_eq!(
        values(&sample.of::<Energy>(Family::CoreEnergy)),
        vec![Ok(Energy { counter: 3 << 32, esu: 32 }); 6]
    );
    assert_eq!(opener.count_of(Message::GetRaplCoreCounter), 0);
    // One read per core at the open, one per core for the sample; no MSR device touched.
    assert_eq!(machine.counters().perf_reads(), 12);
    assert_eq!(machine.counters().msr_reads(amd_hsmp_device::msr::MSR_CORE_ENERGY_STAT), 0);
}

#[test]
fn where_hsmp_answers_rapl_no_perf_event_is_opened() {
    let machine = turin(2);
    let (_, sampler) = chosen(&machine, &[HsmpSource, PerfSource, MsrSource]);
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.energy_source, Some(EnergySource::Hsmp));
    assert_eq!(machine.counters().perf_reads(), 0);
    assert_eq!(machine.counters().msr_reads(amd_hsmp_device::msr::MSR_RAPL_PWR_UNIT), 0);
}

#[test]
fn hsmp_left_out_of_the_sources_is_never_read_for_energy() {
    let machine = turin(2);
    let (opener, sampler) = chosen(&machine, &[PerfSource]);
    machine.firmware().advance_all_energy(2.0).unwrap();
    let sample = sampler.sample(V2_FAMILIES, soon());
    assert_eq!(sample.energy_source, Some(EnergySource::Perf));
    assert_eq!(
        values(&sample.of::<Energy>(Family::CoreEnergy)),
        vec![Ok(Energy { counter: 2 << 32, esu: 32 }); 4]
    );
    assert_eq!(opener.count_of(Message::GetRaplCoreCounter), 0);
}

#[test]
fn a_perf_counter_refused_falls_to_the_msrs_only_where_enabled() {
    let refused = Faults { perf_open: Some(libc::EACCES), ..Faults::default() };
    let machine = genoa(2);
    machine.set_faults(refused.clone());
    let (_, sampler) = chosen(&machine, &[HsmpSource, PerfSource, MsrSource]);
    assert_eq!(sampler.sample(V2_FAMILIES, soon()).energy_source, Some(EnergySource::Msr));

    let machine = genoa(2);
    machine.set_faults(refused);
    let (_, sampler) = chosen(&machine, &[HsmpSource, PerfSource]);
    let sample = sampler.sample(V2_FAMILIES, soon());
    // Never a wrong value: no energy at all.
    assert_eq!(sample.energy_source, None);
    assert_eq!(
        sample.of::<Energy>(Family::CoreEnergy),
        Readings::Unavailable(Unavailable::Unsupported)
    );
}

#[test]
fn a_perf_counter_that_stops_counting_fails_its_core_alone() {
    let machine = genoa(2);
    let (_, sampler) = chosen(&machine, &[HsmpSource, PerfSource]);
    // The core's CPU goes offline: the kernel freezes its event, which reads standing still.
    let cpu = machine.topology().cores[1].cpu;
    machine.set_faults(Faults { offline: [cpu].into(), ..Faults::default() });
    let energy = values(&sampler.sample(V2_FAMILIES, soon()).of::<Energy>(Family::CoreEnergy));
    assert_eq!(energy[1], Err(ItemError::Io { errno: libc::ENODEV }));
    assert!(energy.iter().enumerate().all(|(i, e)| i == 1 || e.is_ok()), "{energy:?}");
}

#[test]
fn a_perf_counter_the_kernel_refuses_names_the_sysctl_and_one_a_filter_refuses_the_drop_in() {
    let machine = genoa(2);
    let topo = machine.topology().clone();
    let (perf, msr) = (machine.perf_locator(), machine.msr_opener());
    for (errno, sysctl) in [(libc::EACCES, true), (libc::EPERM, false)] {
        machine.set_faults(Faults { perf_open: Some(errno), ..Faults::default() });
        let openers = crate::energy::Openers { perf: &perf, msr: &msr };
        let choice =
            crate::energy::choose(&[HsmpSource, PerfSource], Err("none".into()), &topo, &openers);
        assert!(choice.fallback.is_none());
        let why = choice.perf_passed_over.unwrap();
        assert!(why.contains("perf-energy.conf"), "{errno}: {why}");
        assert_eq!(why.contains("kernel.perf_event_paranoid=2"), sysctl, "{errno}: {why}");
    }
}

/// Since protocol 5 each energy value says when it was read, on `CLOCK_MONOTONIC`: in the order
/// the worker read them, within the request's time, and none for an item without a value.
#[test]
fn each_energy_value_carries_when_it_was_read_and_a_failed_one_none() {
    let machine = turin(3);
    let topo = machine.topology().clone();
    let bad = topo.cores[1].apic_id;
    machine.update_faults(|f| {
        f.errno.insert((FaultGroup::CoreEnergy, Target::Apic(bad)), libc::EIO);
    });
    let (_opener, sampler) = sampler(&machine);
    let before = monotonic_us();
    let sample = sampler.sample(Families::ALL, soon());
    let after = monotonic_us();
    assert_eq!(values(&sample.of::<Energy>(Family::CoreEnergy)).len(), 6);
    let at = &sample.read_at_us[Family::CoreEnergy];
    assert_eq!(at.len(), 6, "{at:?}");
    assert_eq!(at[1], None, "a failed read has no time");
    for (i, t) in at.iter().enumerate().filter(|&(i, _)| i != 1) {
        let t = t.unwrap_or_else(|| panic!("core {i} has no read time: {at:?}"));
        assert!((before..=after).contains(&t), "core {i} at {t}, request {before}..{after}");
    }
    // One socket's cores in the order its worker reads them.
    assert!(at[0] < at[2] && at[3] < at[4] && at[4] < at[5], "{at:?}");
    let package = &sample.read_at_us[Family::PackageEnergy];
    assert!(package.len() == 2 && package.iter().all(|t| t.is_some_and(|t| t >= before)));
    // A later sample's reads are later.
    let next = sampler.sample(Families::ALL, soon());
    assert!(
        next.read_at_us[Family::CoreEnergy][0] > at[0],
        "{:?} then {at:?}",
        next.read_at_us[Family::CoreEnergy]
    );
    // Not asked for: no times.
    let boost_only = Families::of(&[Family::BoostLimit]);
    assert!(sampler.sample(boost_only, soon()).read_at_us[Family::CoreEnergy].is_empty());
}
