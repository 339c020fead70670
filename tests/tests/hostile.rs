//! The network side under abuse, against the real binaries on loopback: a slowloris from one
//! address while Prometheus scrapes from another, a flood of 1 ms timeout headers, absurd
//! timeout headers, SIGHUP, and 64 concurrent scrapers. Each test is bounded in connections and
//! time; `127.0.0.2` and up act as distinct client hosts. The figures each test measures are
//! printed (`cargo test -p amd-hsmp-e2e --test hostile -- --nocapture`).

use amd_hsmp_device::Message;
use amd_hsmp_e2e::harness::{self, Exposition, Proc, Response};
use amd_hsmp_e2e::scenario::{self, Rig};
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Cores of the turin-2p machine (and of `--simulate turin-2p`).
const CORES: usize = 384;

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// One scrape as Prometheus sends it, from `from`, with `timeout` in the timeout header.
fn scrape_from(from: IpAddr, addr: SocketAddr, timeout: &str) -> anyhow::Result<Response> {
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         X-Prometheus-Scrape-Timeout-Seconds: {timeout}\r\n\r\n"
    );
    harness::http_exchange(Some(from), addr, request.as_bytes(), Duration::from_secs(20))
}

/// True when a scrape has every family of the turin-2p machine.
fn complete(m: &Exposition) -> bool {
    m.count("amd_hsmp_core_energy_joules_total") == CORES
        && m.count("amd_hsmp_core_boost_limit_hertz") == CORES
        && m.count("amd_hsmp_prochot_active") == 2
        && m.value("amd_hsmp_broker_up") == Some(1.0)
}

fn simulated(dir: &Path, nofile: Option<u64>, flags: &[&str]) -> (Proc, Proc, SocketAddr) {
    let socket = dir.join("broker.sock");
    let broker =
        harness::start_simulated_broker("turin-2p", &socket, &[], dir.join("broker.log")).unwrap();
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let (exporter, addr) = harness::start_exporter(&socket, &flags, nofile, dir).unwrap();
    (broker, exporter, addr)
}

/// Peak fds and RSS of a process, sampled while a closure runs in other threads.
#[derive(Debug, Default, Clone, Copy)]
struct Peak {
    fds: usize,
    rss_kib: u64,
}

impl Peak {
    fn sample(&mut self, proc: &Proc) {
        self.fds = self.fds.max(proc.open_fds().unwrap_or(0));
        self.rss_kib = self.rss_kib.max(proc.rss_kib().unwrap_or(0));
    }
}

/// Keeps up to `target` half-sent requests open from `from` until `stop`, re-opening those the
/// server closes and trickling one more header byte on each every second. Returns the most
/// connections the server let it hold at once (open, after a second of trickling).
fn slowloris(from: IpAddr, addr: SocketAddr, target: usize, stop: &AtomicBool) -> usize {
    let mut open: Vec<TcpStream> = Vec::new();
    let mut most_held = 0;
    let mut opened = 0usize;
    while !stop.load(Ordering::SeqCst) {
        while open.len() < target && !stop.load(Ordering::SeqCst) {
            let Ok(mut s) = harness::connect_from(Some(from), addr, Duration::from_secs(1)) else {
                break;
            };
            opened += 1;
            if s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ").is_ok() {
                let _ = s.set_nonblocking(true);
                open.push(s);
            }
        }
        std::thread::sleep(Duration::from_millis(1000));
        // Drop what the server closed (EOF, a 503, a reset); trickle a byte on the rest.
        open.retain_mut(|s| {
            let mut buf = [0u8; 512];
            match s.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => s.write_all(b"a").is_ok(),
                _ => false,
            }
        });
        most_held = most_held.max(open.len());
    }
    eprintln!("slowloris from {from}: {opened} connections opened, at most {most_held} held");
    most_held
}

#[test]
fn slowloris_beyond_the_fd_limit_from_one_address_leaves_another_scraper_answered() {
    let _alone = harness::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // 256 descriptors: 192 connections, 32 per client address.
    let (_broker, exporter, addr) = simulated(dir.path(), Some(256), &[]);
    let first = scrape_from(loopback(3), addr, "2").unwrap();
    assert!(complete(&Exposition::parse(&first.body).unwrap()), "{}", first.body);
    let mut baseline = Peak::default();
    baseline.sample(&exporter);

    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        // More connections than the exporter has descriptors.
        std::thread::spawn(move || slowloris(loopback(2), addr, 300, &stop))
    };
    let scraper = std::thread::spawn(move || {
        let mut in_time = 0;
        let mut durations = Vec::new();
        for _ in 0..10 {
            let started = Instant::now();
            let ok = scrape_from(loopback(3), addr, "2")
                .ok()
                .and_then(|r| Exposition::parse(&r.body).ok())
                .is_some_and(|m| complete(&m));
            let took = started.elapsed();
            durations.push(took);
            if ok && took <= Duration::from_millis(2500) {
                in_time += 1;
            }
            std::thread::sleep(Duration::from_secs(1).saturating_sub(took));
        }
        (in_time, durations)
    });
    let mut peak = baseline;
    while !scraper.is_finished() {
        peak.sample(&exporter);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (in_time, durations) = scraper.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let held = attacker.join().unwrap();

    // Recovery: the attacker's sockets are closed; the exporter's descriptors come back.
    let until = Instant::now() + Duration::from_secs(15);
    let mut after = exporter.open_fds().unwrap();
    while after > baseline.fds + 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        after = exporter.open_fds().unwrap();
    }
    let last = scrape_from(loopback(3), addr, "2").unwrap();
    eprintln!(
        "slowloris: {in_time}/10 scrapes complete within 2.5 s ({durations:?}); exporter fds \
         {} before, {} at peak, {after} after; RSS {} KiB before, {} KiB at peak",
        baseline.fds, peak.fds, baseline.rss_kib, peak.rss_kib
    );
    assert!(in_time >= 9, "only {in_time}/10 scrapes answered in time: {durations:?}");
    assert!(held <= 32, "one client held {held} connections, above its share of 32");
    assert!(peak.fds <= baseline.fds + 40, "fds {} → {}", baseline.fds, peak.fds);
    assert!(peak.rss_kib <= baseline.rss_kib + 32 * 1024, "RSS grew to {} KiB", peak.rss_kib);
    assert!(after <= baseline.fds + 2, "fds not recovered: {} → {after}", baseline.fds);
    assert!(complete(&Exposition::parse(&last.body).unwrap()), "{}", last.body);
    assert!(exporter.log().contains("HTTP connection refused"), "refusals not logged");
    let refusal_lines = exporter.log().matches("HTTP connection refused").count();
    assert!(refusal_lines <= 3, "{refusal_lines} refusal lines in ~12 s: not rate-limited");
}

/// Turin 2P through the FUSE fake with 1 ms per mailbox message: a full sample takes about
/// 385 ms (each socket's 385 messages in series, the sockets in parallel), so a 90 ms deadline
/// can only ever come back partial.
fn slow_turin(exporter_flags: &str) -> Rig {
    let toml = format!(
        "description = \"turin-2p with 1 ms per message\"\nmachine = \"turin-2p\"\n\
         wire-golden = false\nexporter-flags = [{exporter_flags}]\n\
         [faults]\nlatency-ms = 1\n[[scrapes]]\n"
    );
    Rig::start(&scenario::parse(&toml).unwrap()).unwrap()
}

#[test]
fn a_flood_of_1ms_timeout_headers_costs_a_normal_scraper_no_data() {
    let _alone = harness::one_at_a_time();
    let mut rig = slow_turin("");
    let addr = rig.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let flood_answers = Arc::new(AtomicUsize::new(0));
    let flooders: Vec<_> = (4..8)
        .map(|last| {
            let (stop, answers) = (stop.clone(), flood_answers.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if scrape_from(loopback(last), addr, "0.001").is_ok_and(|r| r.status == 200) {
                        answers.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    let mut incomplete = Vec::new();
    let mut durations = Vec::new();
    for i in 0..8 {
        let response = scrape_from(loopback(3), addr, "10").unwrap();
        durations.push(response.elapsed);
        let m = Exposition::parse(&response.body).unwrap();
        if !complete(&m) {
            incomplete.push((i, m.count("amd_hsmp_core_energy_joules_total")));
        }
    }
    stop.store(true, Ordering::SeqCst);
    for f in flooders {
        f.join().unwrap();
    }
    eprintln!(
        "1 ms flood: {} flood answers from 4 clients; 8 normal scrapes in {durations:?}",
        flood_answers.load(Ordering::SeqCst)
    );
    assert!(incomplete.is_empty(), "normal scrapes lost data: {incomplete:?}\n{}", rig.logs());
    assert!(flood_answers.load(Ordering::SeqCst) > 0, "the flood never got an answer");
    rig.scrape(&Default::default()).unwrap();
}

#[test]
fn absurd_timeout_headers_get_an_answer_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, mut exporter, addr) = simulated(dir.path(), None, &[]);
    let huge = "9".repeat(400);
    let values: Vec<&[u8]> = vec![
        b"1e300",
        b"-1e300",
        b"18446744073709551616",
        huge.as_bytes(),
        b"inf",
        b"-inf",
        b"NaN",
        b"-0",
        b"0",
        b"-1",
        b"0x10",
        b"10s",
        b"",
        b"\xff\xfe\xfd",
        b"1\xc3\x28",
    ];
    for value in &values {
        let mut request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
            X-Prometheus-Scrape-Timeout-Seconds: "
            .to_vec();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n\r\n");
        let shown = String::from_utf8_lossy(value);
        let response = harness::http_exchange(None, addr, &request, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{shown:?}: no answer: {e:#}\n{}", exporter.log()));
        assert_eq!(response.status, 200, "{shown:?}");
        let m = Exposition::parse(&response.body).unwrap();
        assert!(complete(&m), "{shown:?}: {}", m.text);
    }
    // Below the 0.1 s minimum: answered (what 90 ms could read), never refused.
    for value in ["1e-300", "0.001", "5e-324"] {
        let response = scrape_from(loopback(3), addr, value).unwrap();
        assert_eq!(response.status, 200, "{value}");
        let m = Exposition::parse(&response.body).unwrap();
        assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{value}: {}", m.text);
    }
    exporter.check_running().unwrap();
    let log = exporter.log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn sighup_to_both_processes_keeps_both_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, mut exporter, addr) = simulated(dir.path(), None, &[]);
    for _ in 0..3 {
        exporter.signal(libc::SIGHUP).unwrap();
        broker.signal(libc::SIGHUP).unwrap();
        // A complete scrape needs both processes alive after the signal.
        let response = scrape_from(loopback(3), addr, "10").unwrap();
        let m = Exposition::parse(&response.body).unwrap();
        assert!(complete(&m), "{}\n{}", m.text, broker.log());
        assert_eq!(m.errors("broker"), 0.0, "the broker connection broke");
    }
    exporter.check_running().unwrap();
    broker.check_running().unwrap();
}

#[test]
fn sixty_four_concurrent_scrapers_get_complete_answers_from_few_broker_samples() {
    let _alone = harness::one_at_a_time();
    let mut rig = slow_turin("\"--web.max-requests\", \"100\"");
    rig.take_traffic();
    let addr = rig.addr();
    let start = Arc::new(Barrier::new(64));
    let scrapers: Vec<_> = (0..64u8)
        .map(|i| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                // Eight scrapers per client address, well within the per-client share.
                (0..10)
                    .map(|_| {
                        scrape_from(loopback(10 + i % 8), addr, "10")
                            .ok()
                            .and_then(|r| Exposition::parse(&r.body).ok())
                            .is_some_and(|m| complete(&m))
                    })
                    .filter(|ok| *ok)
                    .count()
            })
        })
        .collect();
    let complete_answers: usize = scrapers.into_iter().map(|s| s.join().unwrap()).sum();
    let traffic = rig.take_traffic();
    // Every full sample asks each socket's PROCHOT once.
    let samples = traffic.count(Message::GetProcHot.id()) / 2;
    eprintln!("64 scrapers × 10: {complete_answers}/640 complete, {samples} broker samples");
    assert_eq!(complete_answers, 640, "{}", rig.logs());
    assert!(samples * 8 <= 640, "{samples} samples for 640 scrapes");
}
