//! The broker's sampler under mailbox faults, end to end: the real broker and exporter against
//! the FUSE fake device, with sockets wedged (held by the simulator until released), a device
//! that appears late or is replaced, and requests whose deadlines pass mid-sample. Events are
//! ordered with the simulator's mailbox gates; wall time is asserted only where it is the claim.

use amd_hsmp_e2e::fake::{Node, NodeState, TimedMessage};
use amd_hsmp_e2e::harness::{self, BrokerClient, Exposition, values};
use amd_hsmp_e2e::scenario::{self, Rig, Scrape};
use amd_hsmp_exporter::collectors::Collectors;
use amd_hsmp_proto::{Core, DeviceStatus, Energy, Families, Family, ItemError, Sample, Topology};
use amd_hsmp_sim::Machine;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long any awaited condition may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// A rig for `machine` with `extra` scenario lines (top-level keys first, then tables).
fn rig(machine: &str, extra: &str) -> Rig {
    let toml = format!("description = \"\"\nmachine = \"{machine}\"\n{extra}\n[[scrapes]]\n");
    Rig::start(&scenario::parse(&toml).unwrap()).unwrap()
}

/// A scrape as Prometheus sends it with a 1 s scrape timeout.
fn one_second() -> Scrape {
    Scrape { timeout_header: Some("1".into()), ..Scrape::default() }
}

fn scrape(rig: &mut Rig, scrape: &Scrape) -> Exposition {
    let response = rig.scrape(scrape).unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    Exposition::parse(&response.body).unwrap()
}

/// A socket's mailbox held by the simulator; released when dropped, so a failing test does not
/// leave a FUSE thread blocked behind it.
struct Held {
    machine: Arc<Machine>,
    socket: u32,
}

impl Held {
    fn new(machine: &Arc<Machine>, socket: u32) -> Held {
        machine.hold_socket(socket);
        Held { machine: Arc::clone(machine), socket }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.machine.release_socket(self.socket);
    }
}

/// A connection to the rig's broker, past the handshake, asking for every family.
struct Client(BrokerClient);

impl Client {
    fn connect(rig: &Rig) -> Client {
        Client(BrokerClient::connect(&rig.broker_socket(), PATIENCE))
    }

    fn sample(&mut self, deadline_ms: u32) -> Sample {
        self.0.sample(Families::ALL, deadline_ms)
    }
}

/// The energy items of `sample` on `socket`.
fn energy_on(topology: &Topology, sample: &Sample, socket: u32) -> Vec<Result<u64, ItemError>> {
    let energy = values(&sample.of::<Energy>(Family::CoreEnergy));
    let on = topology.cores.iter().zip(energy).filter(|(c, _)| c.socket == socket);
    on.map(|(_, e)| e.map(|e| e.counter)).collect()
}

/// The broker's default freshness bound, given explicitly (the scenario rigs turn it off).
const MAX_AGE: &str = r#"broker-flags = ["--sample.max-age", "500ms"]"#;
const MAX_AGE_MS: u64 = 500;

/// Cores of each socket of the Turin 2P fixture.
const TURIN_CORES: usize = 192;

/// Messages a scrape with the default collectors sends to one Turin socket, by the cost rule.
fn turin_socket() -> u64 {
    Collectors::default().families().messages(TURIN_CORES, 1) as u64
}

/// A scrape of the exporter at `addr` with the scrape timeout header `timeout`.
fn scrape_at(addr: SocketAddr, timeout: &str) -> Exposition {
    let headers = [(amd_hsmp_exporter::http::SCRAPE_TIMEOUT_HEADER, timeout)];
    let response = harness::http_get(addr, "/metrics", &headers, PATIENCE).unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    Exposition::parse(&response.body).unwrap()
}

/// The energy series of `core` on `socket`.
fn energy_series(socket: u32, core: u32) -> String {
    format!(r#"amd_hsmp_core_energy_joules_total{{core="{core}",socket="{socket}"}}"#)
}

/// Every series of the Turin 2P contract is in `m`: 384 energy, 384 boost limits, 2 PROCHOT.
fn complete(m: &Exposition) -> bool {
    m.count("amd_hsmp_core_energy_joules_total") == 384
        && m.count("amd_hsmp_core_boost_limit_hertz") == 384
        && m.count("amd_hsmp_prochot_active") == 2
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count()
}

const SOCKET_0: [&str; 3] = [
    r#"amd_hsmp_prochot_active{socket="0"}"#,
    r#"amd_hsmp_core_energy_joules_total{core="0",socket="0"}"#,
    r#"amd_hsmp_core_boost_limit_hertz{core="191",socket="0"}"#,
];
const SOCKET_1: [&str; 3] = [
    r#"amd_hsmp_prochot_active{socket="1"}"#,
    r#"amd_hsmp_core_energy_joules_total{core="0",socket="1"}"#,
    r#"amd_hsmp_core_boost_limit_hertz{core="191",socket="1"}"#,
];

/// Regression (D7): each request started a thread per socket, and one stuck behind a wedged
/// mailbox still sent its message once the mailbox freed, so threads and stale messages piled
/// up, one per request.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_wedged_socket_keeps_the_healthy_socket_served_and_piles_nothing_up() {
    let _alone = harness::one_at_a_time();
    let mut rig = rig("turin-2p", "");
    let pid = rig.broker_pid().unwrap();
    let machine = Arc::clone(rig.machine());
    let topology = machine.topology().clone();
    let mut client = Client::connect(&rig);
    // The first sample starts the socket workers.
    assert!(
        values(&client.sample(5_000).of::<Energy>(Family::CoreEnergy)).iter().all(Result::is_ok),
        "{}",
        rig.logs()
    );
    let threads_before = threads(pid);
    let before = machine.mailbox(1);

    let held = Held::new(&machine, 1);
    let started = Instant::now();
    let mut samples = 0;
    while samples < 6 || started.elapsed() < Duration::from_secs(8) {
        let asked = Instant::now();
        let sample = client.sample(1_000);
        let took = asked.elapsed();
        assert!(took < Duration::from_millis(1_500), "sample {samples} took {took:?}");
        let healthy = energy_on(&topology, &sample, 0);
        assert!(healthy.iter().all(Result::is_ok), "sample {samples}: {healthy:?}");
        assert!(values(&sample.of::<u32>(Family::BoostLimit)).iter().take(192).all(Result::is_ok));
        assert_eq!(
            values(&sample.of::<bool>(Family::Prochot)),
            [Ok(false), Err(ItemError::DeadlineExceeded)]
        );
        let wedged = energy_on(&topology, &sample, 1);
        assert!(wedged.iter().all(|e| *e == Err(ItemError::DeadlineExceeded)));
        let now = threads(pid);
        assert!(now <= threads_before, "sample {samples}: {now} threads, {threads_before} before");
        samples += 1;
    }
    let wedged = machine.mailbox(1);
    eprintln!(
        "{samples} samples in {:?} with socket 1 wedged: broker threads {} (before \
         {threads_before}), messages into the wedged mailbox {}",
        started.elapsed(),
        threads(pid),
        wedged.entered - before.entered
    );
    assert_eq!(wedged.entered - before.entered, 1, "messages that reached the wedged mailbox");
    assert_eq!(wedged.pending, 1);

    // The requests have stopped: the held message finishes, and the next scrape reads socket 1
    // in full, with nothing stale before it.
    drop(client);
    rig.take_traffic();
    drop(held);
    machine.wait_mailbox(1, PATIENCE, |b| b.pending == 0).unwrap();
    let m = scrape(&mut rig, &Scrape::default());
    assert!(SOCKET_0.iter().chain(&SOCKET_1).all(|s| m.value(s).is_some()), "{}", rig.logs());
    let to_socket_1 = rig.take_traffic().messages.iter().filter(|m| m.sock_ind == 1).count();
    // One full scrape of the socket with the default collectors.
    assert_eq!(to_socket_1 as u64, 1 + turin_socket(), "the held message, then one full sample");
    assert_eq!(machine.mailbox(1).max_pending, 1);
}

/// Regression (D4): a worker that delivered an item after its request had been answered
/// indexed an emptied vector and panicked, thousands of times under short deadlines.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn samples_whose_deadline_passes_mid_sample_never_panic() {
    let _alone = harness::one_at_a_time();
    // 1 ms per message: a full sample takes about 0.4 s per socket.
    let rig = rig("turin-2p", "[faults]\nlatency-ms = 1\n");
    let stop = Instant::now() + Duration::from_secs(6);
    // Two connections: as many as one uid may hold (the exporter has not connected yet).
    let (samples, mut clients) = std::thread::scope(|s| {
        let clients: Vec<_> = (0..2)
            .map(|c| {
                let mut client = Client::connect(&rig);
                s.spawn(move || {
                    let mut n = 0;
                    while Instant::now() < stop {
                        let deadline_ms = 1 + (n * 7 + c * 13) % 60;
                        let sample = client.sample(deadline_ms as u32);
                        assert_eq!(values(&sample.of::<bool>(Family::Prochot)).len(), 2);
                        n += 1;
                    }
                    (n, client)
                })
            })
            .collect();
        let done: Vec<(usize, Client)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        let samples: usize = done.iter().map(|(n, _)| n).sum();
        (samples, done.into_iter().map(|(_, client)| client).collect::<Vec<_>>())
    });
    assert!(samples > 100, "only {samples} samples");
    let log = rig.broker_log();
    assert!(!log.contains("panicked"), "{log}");
    // On a connection of the storm: a new one could be refused while the broker still counts the
    // closed ones against the uid's two slots.
    let sample = clients[0].sample(5_000);
    assert!(
        values(&sample.of::<Energy>(Family::CoreEnergy)).iter().all(Result::is_ok),
        "{}",
        rig.logs()
    );
}

/// Regression (D6): a `/dev/hsmp` that appeared after start-up was probed under the device
/// lock, with no deadline, so one wedged socket left every request without data.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_late_device_node_with_a_wedged_socket_serves_the_healthy_socket_through_the_fake() {
    let _alone = harness::one_at_a_time();
    let mut rig = rig("turin-2p", "hsmp = \"absent\"\n");
    let topology = rig.machine().topology().clone();
    let m = scrape(&mut rig, &one_second());
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    // The first socket is the one the start-up probe would have asked.
    let _held = Held::new(rig.machine(), 0);
    rig.device().set_hsmp_state(NodeState::Present);
    let mut client = Client::connect(&rig);
    for round in 0..3 {
        let asked = Instant::now();
        let sample = client.sample(1_000);
        let took = asked.elapsed();
        assert!(took < Duration::from_millis(1_500), "round {round}: took {took:?}");
        assert_eq!(sample.hsmp, DeviceStatus::Ready { protocol_version: 7 }, "round {round}");
        let healthy = energy_on(&topology, &sample, 1);
        assert!(healthy.iter().all(Result::is_ok), "round {round}: {healthy:?}\n{}", rig.logs());
        assert!(values(&sample.of::<u32>(Family::BoostLimit)).iter().skip(192).all(Result::is_ok));
        assert_eq!(
            values(&sample.of::<bool>(Family::Prochot)),
            [Err(ItemError::DeadlineExceeded), Ok(false)]
        );
    }
}

/// Regression (D11): a device replaced under the running broker (a driver rebind) was never
/// opened again: `amd_hsmp_up 1` and no series, forever.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_device_replaced_under_the_running_broker_is_reopened() {
    let mut rig = rig("turin-2p", "");
    let m = scrape(&mut rig, &Scrape::default());
    assert!(m.value(SOCKET_0[1]).is_some());
    rig.device().replace_hsmp();
    let back = (0..4).any(|_| scrape(&mut rig, &Scrape::default()).value(SOCKET_0[1]).is_some());
    assert!(back, "no energy after the replacement\n{}", rig.logs());
    let opens = rig.device().opens();
    let hsmp_opens = opens.iter().filter(|o| o.node == Node::Hsmp && o.result.is_ok()).count();
    assert_eq!(hsmp_opens, 2, "{opens:?}");
    let m = scrape(&mut rig, &Scrape::default());
    assert!(SOCKET_0.iter().chain(&SOCKET_1).all(|s| m.value(s).is_some()));
    assert_eq!(m.value("amd_hsmp_up"), Some(1.0));
}

/// Two peers asking at once cost one reading, and neither one's deadline cuts the other's
/// answer short: the short request is answered at its deadline with what was read by then,
/// the long one with the complete reading. (The second arrives after the first's first message
/// was sent: the default freshness bound lets it share that read too.)
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn concurrent_samples_with_different_deadlines_share_one_reading() {
    let _alone = harness::one_at_a_time();
    let rig = rig("turin-2p", "broker-flags = [\"--sample.max-age\", \"500ms\"]");
    let machine = Arc::clone(rig.machine());
    let topology = machine.topology().clone();
    let (mut short, mut long) = (Client::connect(&rig), Client::connect(&rig));
    let before = machine.counters().mailbox_total();
    let held = Held::new(&machine, 0);
    let short = std::thread::spawn(move || short.sample(1500));
    machine.wait_mailbox(0, PATIENCE, |b| b.pending == 1).unwrap();
    let long = std::thread::spawn(move || long.sample(20_000));

    let short = short.join().unwrap();
    assert!(energy_on(&topology, &short, 1).iter().all(Result::is_ok), "{}", rig.logs());
    let unread = energy_on(&topology, &short, 0);
    assert!(unread.iter().all(|e| *e == Err(ItemError::DeadlineExceeded)));
    assert!(!long.is_finished(), "the long request waits for the rest of the reading");
    drop(held);
    let long = long.join().unwrap();
    assert!(
        values(&long.of::<Energy>(Family::CoreEnergy)).iter().all(Result::is_ok),
        "{}",
        rig.logs()
    );
    assert!(values(&long.of::<u32>(Family::BoostLimit)).iter().all(Result::is_ok));
    assert_eq!(values(&long.of::<bool>(Family::Prochot)), [Ok(false), Ok(false)]);
    let sent = machine.counters().mailbox_total() - before;
    // Every family, each item once.
    let one_reading = machine.spec().messages_per_sample(Families::ALL) as u64;
    assert_eq!(sent, one_reading, "one reading's messages");
}

/// Regression (N6): with one socket slow, a second scraper (a second Prometheus replica) whose
/// request reached the broker while the first one's reading still ran got the healthy socket's
/// values from when that reading began, seconds before it asked, as fresh. The fake's message
/// log says when each value was read.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_scrape_after_another_never_gets_values_read_before_the_freshness_bound() {
    let _alone = harness::one_at_a_time();
    let rig = rig("turin-2p", MAX_AGE);
    let machine = Arc::clone(rig.machine());
    let topology = machine.topology().clone();
    let addr = rig.addr();
    let socket_0 = machine.mailbox(0).entered;
    // Socket 1 answers slowly: not at all until it is let go.
    let held = Held::new(&machine, 1);
    let first = std::thread::spawn(move || scrape_at(addr, "10"));
    let read =
        |n| move |b: &amd_hsmp_sim::MailboxState| b.pending == 0 && b.entered == socket_0 + n;
    machine.wait_mailbox(0, PATIENCE, read(turin_socket())).unwrap();
    // Past the bound the energy has moved on when the second scraper asks.
    std::thread::sleep(Duration::from_millis(2 * MAX_AGE_MS));
    machine.firmware().advance_all_energy(5.0).unwrap();
    let asked = Instant::now();
    let second = std::thread::spawn(move || scrape_at(addr, "10"));
    // Its request has socket 0 read again, while socket 1 is still held.
    let reread = machine.wait_mailbox(0, PATIENCE, read(2 * turin_socket()));
    drop(held);
    reread.unwrap_or_else(|b| panic!("socket 0 not read again for the second scraper: {b:?}"));
    let (first, second) = (first.join().unwrap(), second.join().unwrap());
    assert!(complete(&first) && complete(&second), "{}", rig.logs());

    let log = rig.device().timed_messages();
    for core in topology.cores.iter().filter(|c| c.socket == 0) {
        let read_at = energy_read_at(&log, core, &second);
        let bound = Duration::from_millis(MAX_AGE_MS);
        assert!(
            read_at + bound >= asked,
            "core {}: read {:?} before the second scraper asked",
            core.core,
            asked - read_at
        );
    }
}

/// When the energy `m` exports for `core` was read: the earliest message in `log` that answered
/// that counter (the fake's counters are static unless a test advances them).
fn energy_read_at(log: &[TimedMessage], core: &Core, m: &Exposition) -> Instant {
    let joules = m.value(&energy_series(core.socket, core.core)).unwrap();
    let counter = (joules * 65536.0).round() as u64;
    log.iter()
        .filter(|m| m.message.msg_id == 0x31 && u32::from(m.message.sock_ind) == core.socket)
        .filter(|m| m.message.arg0 == core.apic_id)
        .filter(|m| u64::from(m.reply[1]) << 32 | u64::from(m.reply[0]) == counter)
        .map(|m| m.at)
        .min()
        .unwrap_or_else(|| panic!("no message answered core {} with {counter}", core.core))
}

/// Regression (P5): with a socket that takes about 7 s to read, a second scraper (a second
/// Prometheus replica) 0.7 s after the first, with the same 10 s timeout, joined the first
/// one's broker request (the deadlines were within a tenth of the budget, 0.9 s), waited for
/// all of it, found it older than the 0.5 s bound allows for its own arrival and asked again
/// with the 3 s left: 311 to 322 of 384 energy series, on every scrape of the pair. Now it
/// sends its own request, which shares the broker's reads. The fake's energy moves all the
/// while, so its message log dates each exported value.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn two_scrapers_past_the_bound_apart_on_a_slow_socket_both_get_complete_fresh_answers() {
    let _alone = harness::one_at_a_time();
    // 18 ms a message: each socket's 385 messages take about 7 s.
    let rig = rig("turin-2p", &format!("{MAX_AGE}\n[faults]\nlatency-ms = 18"));
    let machine = Arc::clone(rig.machine());
    let topology = machine.topology().clone();
    let addr = rig.addr();
    let bound = Duration::from_millis(MAX_AGE_MS);
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (machine, stop) = (Arc::clone(&machine), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                machine.firmware().advance_all_energy(0.001).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let entered = machine.mailbox(0).entered;
        let first_asked = Instant::now();
        let first = std::thread::spawn(move || scrape_at(addr, "10"));
        // The first scraper's request reached the broker; past the bound, but within a tenth of
        // the timeout, the second one asks.
        machine.wait_mailbox(0, PATIENCE, |b| b.entered > entered).unwrap();
        std::thread::sleep(Duration::from_millis(700));
        let second_asked = Instant::now();
        let second = std::thread::spawn(move || scrape_at(addr, "10"));
        let answers =
            [(first_asked, first.join().unwrap()), (second_asked, second.join().unwrap())];
        rounds.push(answers);
        // The next round's first request reads afresh.
        std::thread::sleep(bound);
    }
    stop.store(true, Ordering::Relaxed);
    mover.join().unwrap();
    let counts: Vec<_> = rounds
        .iter()
        .map(|r| r.each_ref().map(|(_, m)| m.count("amd_hsmp_core_energy_joules_total")))
        .collect();
    eprintln!("energy series of the two scrapers, by round: {counts:?}");
    assert!(rounds.iter().flatten().all(|(_, m)| complete(m)), "{counts:?}\n{}", rig.logs());
    let log = rig.device().timed_messages();
    for (round, (asked, m)) in
        rounds.iter().enumerate().flat_map(|(i, r)| r.iter().map(move |a| (i, a)))
    {
        for core in &topology.cores {
            let read_at = energy_read_at(&log, core, m);
            assert!(
                read_at + bound >= *asked,
                "round {round}, socket {} core {}: read {:?} before its scraper asked",
                core.socket,
                core.core,
                asked.duration_since(read_at)
            );
        }
    }
}

/// Regression (N6): one allowed peer's request with a long deadline, while a socket is wedged,
/// kept its reading alive, and every scrape joined it: the healthy socket's energy did not move
/// in 39 consecutive scrapes.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_peer_with_a_long_deadline_beside_a_wedged_socket_holds_no_value_for_the_scrapes() {
    let _alone = harness::one_at_a_time();
    let mut rig = rig("turin-2p", MAX_AGE);
    let machine = Arc::clone(rig.machine());
    let topology = machine.topology().clone();
    let socket_0 = machine.mailbox(0).entered;
    let held = Held::new(&machine, 1);
    let mut peer = Client::connect(&rig);
    let peer = std::thread::spawn(move || peer.sample(60_000));
    // The peer's whole reading of socket 0: every family, the per-core frequency limit too.
    let read = |b: &amd_hsmp_sim::MailboxState| {
        b.pending == 0 && b.entered >= socket_0 + Families::ALL.messages(TURIN_CORES, 1) as u64
    };
    machine.wait_mailbox(0, PATIENCE, read).unwrap();
    std::thread::sleep(Duration::from_millis(MAX_AGE_MS + 100));
    let fw = machine.firmware();
    for round in 0..5 {
        fw.advance_all_energy(1.0).unwrap();
        // Each scrape takes its whole second (socket 1 is wedged): the next one comes past the
        // bound.
        let m = scrape(&mut rig, &one_second());
        for core in topology.cores.iter().filter(|c| c.socket == 0) {
            let now = fw.energy_counter(0, core.core).unwrap() as f64 / 65536.0;
            let got = m.value(&energy_series(0, core.core));
            assert_eq!(got, Some(now), "round {round}, core {}\n{}", core.core, rig.logs());
        }
        assert!(m.value(SOCKET_1[1]).is_none(), "socket 1 is wedged");
    }
    drop(held);
    let peer = peer.join().unwrap();
    assert!(
        values(&peer.of::<Energy>(Family::CoreEnergy)).iter().all(Result::is_ok),
        "the peer is served in the end"
    );
}

/// Regression (N2): a request for other families than the running reading's (a second exporter
/// with `--no-collector.prochot`, a peer asking for energy only) started a reading of its own
/// that skipped every socket still busy: the first exporter lost whole sockets.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn requests_for_other_families_beside_a_scraper_cost_it_no_series() {
    let _alone = harness::one_at_a_time();
    // No freshness allowance: every request reads, so the requests really meet on the boards.
    let flags = r#"broker-flags = ["--sample.max-age", "0", "--connections.per-uid", "8"]"#;
    let mut rig = rig("turin-2p", flags);
    let machine = Arc::clone(rig.machine());
    // The representative mailbox: 100 µs a message, 40 ms a full sample of a socket.
    machine.update_faults(|f| f.latency = Duration::from_micros(100));
    let dir = tempfile::tempdir().unwrap();
    let no_prochot = ["--no-collector.prochot".to_string()];
    let (_second, second) =
        harness::start_exporter(&rig.broker_socket(), &no_prochot, None, dir.path()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let beside = Arc::new(AtomicUsize::new(0));
    let (run, count) = (Arc::clone(&stop), Arc::clone(&beside));
    let second = std::thread::spawn(move || {
        while !run.load(Ordering::Relaxed) {
            let m = scrape_at(second, "1");
            assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);
            count.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    for n in 0..40 {
        let m = scrape(&mut rig, &Scrape::default());
        assert!(complete(&m), "scrape {n} beside the second exporter\n{}", rig.logs());
    }
    stop.store(true, Ordering::Relaxed);
    second.join().unwrap();
    assert!(beside.load(Ordering::Relaxed) >= 5, "the second exporter scraped too");

    let stop = Arc::new(AtomicBool::new(false));
    let mut peer = Client::connect(&rig);
    let (run, count) = (Arc::clone(&stop), Arc::new(AtomicUsize::new(0)));
    let peer_count = Arc::clone(&count);
    let peer = std::thread::spawn(move || {
        let energy = Families::of(&[Family::CoreEnergy]);
        while !run.load(Ordering::Relaxed) {
            peer.0.sample(energy, 1000);
            peer_count.fetch_add(1, Ordering::Relaxed);
        }
    });
    for n in 0..40 {
        let m = scrape(&mut rig, &Scrape::default());
        assert!(complete(&m), "scrape {n} beside an energy-only peer\n{}", rig.logs());
    }
    stop.store(true, Ordering::Relaxed);
    peer.join().unwrap();
    assert!(count.load(Ordering::Relaxed) >= 40, "the peer looped");
}

/// Regression (D12): one connection looping requests drove 62,640 mailbox messages a second.
/// Now each item is read at most once per freshness bound, however many requests come.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_peer_looping_on_two_connections_costs_at_most_one_read_per_item_per_bound() {
    let _alone = harness::one_at_a_time();
    // Root's two peer connections beside the exporter's two.
    let flags = r#"broker-flags = ["--sample.max-age", "500ms", "--connections.per-uid", "4"]"#;
    let mut rig = rig("turin-2p", flags);
    let machine = Arc::clone(rig.machine());
    let before = machine.counters().mailbox_total();
    let started = Instant::now();
    let run_for = Duration::from_secs(5);
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let mut peer = Client::connect(&rig);
            std::thread::spawn(move || {
                let mut samples = 0;
                while started.elapsed() < run_for {
                    peer.sample(1000);
                    samples += 1;
                }
                samples
            })
        })
        .collect();
    let mut scrapes = 0;
    while started.elapsed() < run_for {
        let m = scrape(&mut rig, &one_second());
        assert!(complete(&m), "scrape {scrapes} beside the looping peer\n{}", rig.logs());
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    let samples: u64 = loops.into_iter().map(|l| l.join().unwrap()).sum();
    let elapsed = started.elapsed();
    let sent = machine.counters().mailbox_total() - before;
    // A sample of every family: one message per item, all of which a Turin 2P answers.
    let items = machine.spec().messages_per_sample(Families::ALL) as u64;
    let bound = items * (elapsed.as_millis() as u64 / MAX_AGE_MS + 1);
    println!(
        "{samples} peer samples and {scrapes} scrapes in {elapsed:.1?}: {sent} messages, {:.0}/s \
         (at most {bound})",
        sent as f64 / elapsed.as_secs_f64()
    );
    assert!(sent <= bound, "{sent} messages for {samples} samples in {elapsed:?}");
    assert!(samples > 100, "the peer looped ({samples} samples)");
}

/// Regression (N8): with a full sample slower than a 0.1 s flood's deadlines, the flood's
/// readings were made while a worker was busy, and a normal scrape that joined one lost the
/// sockets it had skipped.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_flood_of_short_deadlines_costs_a_slower_normal_scrape_no_socket() {
    let _alone = harness::one_at_a_time();
    // No freshness allowance: the flood's requests and the scrapes all read.
    let mut rig = rig("turin-2p", r#"broker-flags = ["--sample.max-age", "0"]"#);
    let machine = Arc::clone(rig.machine());
    // 600 µs a message: a full sample of a socket takes 0.23 s, longer than the flood's 0.1 s.
    machine.update_faults(|f| f.latency = Duration::from_micros(600));
    let stop = Arc::new(AtomicBool::new(false));
    let addr = rig.addr();
    let flood: Vec<_> = (0..2)
        .map(|_| {
            let run = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut n = 0;
                while !run.load(Ordering::Relaxed) {
                    scrape_at(addr, "0.1");
                    n += 1;
                }
                n
            })
        })
        .collect();
    for n in 0..10 {
        let m = scrape(&mut rig, &Scrape { timeout_header: Some("5".into()), ..Scrape::default() });
        assert!(complete(&m), "scrape {n} during the flood\n{}", rig.logs());
    }
    stop.store(true, Ordering::Relaxed);
    let answered: u32 = flood.into_iter().map(|f| f.join().unwrap()).sum();
    assert!(answered >= 10, "the flood ran ({answered} answers)");
}

/// The broker's connection threads (named `conn`) that wait in the sampler for a request: a
/// futex wait, where an idle connection waits in a socket read.
fn requests_waiting(broker: u32) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{broker}/task")).unwrap();
    let read = |task: &std::path::Path, file| std::fs::read_to_string(task.join(file));
    tasks
        .filter_map(Result::ok)
        .filter(|t| read(&t.path(), "comm").is_ok_and(|c| c.trim() == "conn"))
        .filter(|t| read(&t.path(), "wchan").is_ok_and(|w| w.contains("futex")))
        .count()
}

/// Whether process `pid` has exited (a zombie not reaped yet, or gone): its descriptors, the
/// broker connections among them, are closed.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'))
    })
}

/// Sends a scrape to `addr` and leaves it waiting for its answer.
fn scrape_in_flight(addr: SocketAddr, timeout: &str) -> std::net::TcpStream {
    use std::io::Write as _;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Prometheus-Scrape-Timeout-Seconds: {timeout}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// Regression (P4): an exporter killed with two requests in flight and restarted at once was
/// refused by its own per-uid limit (2) until the old requests' deadlines passed, since the
/// broker freed a slot only when its request ended; its scrapes read `amd_hsmp_broker_up 0`
/// with no data. Now the broker frees the slot when the peer hangs up, and the exporter tries
/// a refused connection once more.
fn an_exporter_restarted_with_requests_in_flight(signal: i32) {
    let _alone = harness::one_at_a_time();
    let mut rig = rig("turin-2p", "");
    let broker = rig.broker_pid().unwrap();
    let machine = Arc::clone(rig.machine());
    let first = scrape(&mut rig, &one_second());
    let cores = first.count("amd_hsmp_core_energy_joules_total");
    assert!(cores > 0 && first.value("amd_hsmp_broker_up") == Some(1.0), "{}", rig.logs());

    // Two scrapes whose broker requests wait on the held socket: different deadlines, so
    // neither joins the other's flight and each has a connection of its own.
    let held = Held::new(&machine, 1);
    let in_flight = [scrape_in_flight(rig.addr(), "10"), scrape_in_flight(rig.addr(), "5")];
    let until = Instant::now() + PATIENCE;
    while requests_waiting(broker) < 2 {
        assert!(Instant::now() < until, "two requests never waited\n{}", rig.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    let exporter = rig.exporter_pid();
    let pid = rustix::process::Pid::from_raw(exporter as i32).unwrap();
    let sig = rustix::process::Signal::from_named_raw(signal).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
    // Prometheus gives up on the scrapes of an exporter that is going away.
    drop(in_flight);
    let until = Instant::now() + PATIENCE;
    while !exited(exporter) {
        assert!(Instant::now() < until, "the exporter did not exit\n{}", rig.logs());
        std::thread::sleep(Duration::from_millis(10));
    }

    let dir = tempfile::tempdir().unwrap();
    let (mut restarted, addr) =
        harness::start_exporter(&rig.broker_socket(), &[], None, dir.path()).unwrap();
    let scrape = std::thread::spawn(move || scrape_at(addr, "10"));
    // The socket stays held until the new exporter is through the handshake (or its scrape
    // has come back without it), so the old requests cannot end on their own first.
    let until = Instant::now() + PATIENCE;
    while !scrape.is_finished() && !restarted.log().contains("connected to the broker") {
        assert!(Instant::now() < until, "the new exporter never connected\n{}", rig.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(held);
    let m = scrape.join().unwrap();
    let log = format!("{}\n--- restarted exporter ---\n{}", rig.logs(), restarted.log());
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{log}");
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), cores, "{log}");
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), cores, "{log}");
    assert_eq!(m.count("amd_hsmp_prochot_active"), first.count("amd_hsmp_prochot_active"));
    restarted.kill();
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn an_exporter_killed_with_requests_in_flight_and_restarted_at_once_scrapes_in_full() {
    an_exporter_restarted_with_requests_in_flight(libc::SIGKILL);
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn an_exporter_stopped_with_requests_in_flight_and_restarted_at_once_scrapes_in_full() {
    an_exporter_restarted_with_requests_in_flight(libc::SIGTERM);
}
