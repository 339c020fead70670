//! Installs the broker's seccomp filter in this process, then does what its arguments say, so a
//! test can watch the filter act on real system calls:
//!
//! - `open-rw PATH`, `open-ro PATH`: open PATH, print `open-rw: ok` or `open-rw: errno N`;
//! - `sleep MS`: print `sleeping`, sleep with `std::thread::sleep` (which panics if resuming
//!   after a stop is refused), print `slept`;
//! - `unlink PATH`: remove PATH, print `unlink: ok` or `unlink: errno N`;
//! - `remove-socket`: remove the file named by `--socket-file PATH` (which must come first)
//!   through the broker's one admitted `unlinkat`, print `remove-socket: ok` or `... errno N`;
//! - `socket`: make a UDP socket (the filter kills the process), print `socket: made`;
//! - `perf-open`: open a system-wide perf event (the software PMU's cpu-clock on CPU 0, the
//!   call that opens the `power_core` events; the filter kills the process), print
//!   `perf-open: ok` or `perf-open: errno N`.
//!
//! `cargo run --example seccomp -- open-rw /dev/null sleep 2000 socket`
//! Exit codes: 0 all actions done, 2 bad arguments, 1 the filter could not be installed.

use amd_hsmp_broker::{SocketFile, install_seccomp};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let socket_file = match args.first().map(String::as_str) {
        Some("--socket-file") if args.len() > 1 => {
            let path = args.remove(1);
            args.remove(0);
            match SocketFile::new(std::path::Path::new(&path)) {
                Ok(file) => Some(file),
                Err(e) => {
                    eprintln!("cannot open the directory of {path}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
    };
    if let Err(e) = rustix::thread::set_no_new_privs(true) {
        eprintln!("cannot set no-new-privs: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = install_seccomp(socket_file.as_ref()) {
        eprintln!("cannot install the filter: {e}");
        return ExitCode::FAILURE;
    }
    let mut args = args.into_iter();
    while let Some(action) = args.next() {
        let errno = |e: std::io::Error| format!("errno {}", e.raw_os_error().unwrap_or(0));
        let outcome = match action.as_str() {
            what @ ("open-rw" | "open-ro") => {
                let Some(path) = args.next() else { return ExitCode::from(2) };
                let opened =
                    std::fs::OpenOptions::new().read(true).write(what == "open-rw").open(path);
                opened.map(drop).map_err(errno)
            }
            "sleep" => {
                let Some(Ok(ms)) = args.next().map(|ms| ms.parse()) else {
                    return ExitCode::from(2);
                };
                println!("sleeping");
                std::thread::sleep(Duration::from_millis(ms));
                println!("slept");
                continue;
            }
            "unlink" => {
                let Some(path) = args.next() else { return ExitCode::from(2) };
                std::fs::remove_file(path).map_err(errno)
            }
            "remove-socket" => match &socket_file {
                Some(file) => file.remove().map_err(errno),
                None => Err("no --socket-file".to_string()),
            },
            "perf-open" => {
                use amd_hsmp_device::PerfOpener as _;
                let opener = amd_hsmp_device::perf::DevPerf { kind: 1, config: 0 };
                opener.open(0).map(drop).map_err(|e| format!("errno {e}"))
            }
            "socket" => {
                let made = std::net::UdpSocket::bind("127.0.0.1:0").is_ok();
                println!("socket: {}", if made { "made" } else { "refused" });
                continue;
            }
            _ => {
                eprintln!("unknown action {action:?}");
                return ExitCode::from(2);
            }
        };
        match outcome {
            Ok(()) => println!("{action}: ok"),
            Err(why) => println!("{action}: {why}"),
        }
    }
    ExitCode::SUCCESS
}
