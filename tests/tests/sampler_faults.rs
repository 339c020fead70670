//! The broker's sampler under mailbox faults, end to end: the real broker and exporter against
//! the FUSE fake device, with sockets wedged (held by the simulator until released), a device
//! that appears late or is replaced, and requests whose deadlines pass mid-sample. Events are
//! ordered with the simulator's mailbox gates; wall time is asserted only where it is the claim.

use amd_hsmp_e2e::fake::{Node, NodeState};
use amd_hsmp_e2e::harness::{self, BrokerClient, Exposition, values};
use amd_hsmp_e2e::scenario::{self, Rig, Scrape};
use amd_hsmp_proto::{DeviceStatus, Families, ItemError, Sample, Topology};
use amd_hsmp_sim::Machine;
use std::sync::Arc;
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
    let energy = values(&sample.energy);
    let on = topology.cores.iter().zip(energy).filter(|(c, _)| c.socket == socket);
    on.map(|(_, e)| e.map(|e| e.counter)).collect()
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
fn a_wedged_socket_keeps_the_healthy_socket_served_and_piles_nothing_up() {
    let _alone = harness::one_at_a_time();
    let mut rig = rig("turin-2p", "");
    let pid = rig.broker_pid().unwrap();
    let machine = Arc::clone(rig.machine());
    let topology = machine.topology().clone();
    let mut client = Client::connect(&rig);
    // The first sample starts the socket workers.
    assert!(values(&client.sample(5_000).energy).iter().all(Result::is_ok), "{}", rig.logs());
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
        assert!(values(&sample.boost_limit).iter().take(192).all(Result::is_ok));
        assert_eq!(values(&sample.prochot), [Ok(false), Err(ItemError::DeadlineExceeded)]);
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
    assert_eq!(to_socket_1, 1 + (2 * 192 + 1), "the held message, then one full sample");
    assert_eq!(machine.mailbox(1).max_pending, 1);
}

/// Regression (D4): a worker that delivered an item after its request had been answered
/// indexed an emptied vector and panicked, thousands of times under short deadlines.
#[test]
fn samples_whose_deadline_passes_mid_sample_never_panic() {
    let _alone = harness::one_at_a_time();
    // 1 ms per message: a full sample takes about 0.4 s per socket.
    let rig = rig("turin-2p", "[faults]\nlatency-ms = 1\n");
    let stop = Instant::now() + Duration::from_secs(6);
    // Two connections: as many as one uid may hold (the exporter has not connected yet).
    let samples: usize = std::thread::scope(|s| {
        let clients: Vec<_> = (0..2)
            .map(|c| {
                let mut client = Client::connect(&rig);
                s.spawn(move || {
                    let mut n = 0;
                    while Instant::now() < stop {
                        let deadline_ms = 1 + (n * 7 + c * 13) % 60;
                        let sample = client.sample(deadline_ms as u32);
                        assert_eq!(values(&sample.prochot).len(), 2);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    assert!(samples > 100, "only {samples} samples");
    let log = rig.broker_log();
    assert!(!log.contains("panicked"), "{log}");
    let sample = Client::connect(&rig).sample(5_000);
    assert!(values(&sample.energy).iter().all(Result::is_ok), "{}", rig.logs());
}

/// Regression (D6): a `/dev/hsmp` that appeared after start-up was probed under the device
/// lock, with no deadline, so one wedged socket left every request without data.
#[test]
fn a_late_device_with_a_wedged_socket_serves_the_healthy_socket_in_time() {
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
        assert!(values(&sample.boost_limit).iter().skip(192).all(Result::is_ok));
        assert_eq!(values(&sample.prochot), [Err(ItemError::DeadlineExceeded), Ok(false)]);
    }
}

/// Regression (D11): a device replaced under the running broker (a driver rebind) was never
/// opened again: `amd_hsmp_up 1` and no series, forever.
#[test]
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
    assert!(values(&long.energy).iter().all(Result::is_ok), "{}", rig.logs());
    assert!(values(&long.boost_limit).iter().all(Result::is_ok));
    assert_eq!(values(&long.prochot), [Ok(false), Ok(false)]);
    let sent = machine.counters().mailbox_total() - before;
    assert_eq!(sent, 2 * 384 + 2, "one reading's messages");
}
