//! Installs the broker's seccomp filter in this process, then does what its arguments say, so a
//! test can watch the filter act on real system calls:
//!
//! - `open-rw PATH`, `open-ro PATH`: open PATH, print `open-rw: ok` or `open-rw: errno N`;
//! - `sleep MS`: print `sleeping`, sleep with `std::thread::sleep` (which panics if resuming
//!   after a stop is refused), print `slept`;
//! - `socket`: make a UDP socket (the filter kills the process), print `socket: made`.
//!
//! `cargo run --example seccomp -- open-rw /dev/null sleep 2000 socket`
//! Exit codes: 0 all actions done, 2 bad arguments, 1 the filter could not be installed.

use amd_hsmp_broker::lockdown;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = rustix::thread::set_no_new_privs(true) {
        eprintln!("cannot set no-new-privs: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = lockdown::install_seccomp(None) {
        eprintln!("cannot install the filter: {e}");
        return ExitCode::FAILURE;
    }
    let mut args = args.iter();
    while let Some(action) = args.next() {
        match (action.as_str(), args.next()) {
            (what @ ("open-rw" | "open-ro"), Some(path)) => {
                let opened =
                    std::fs::OpenOptions::new().read(true).write(what == "open-rw").open(path);
                match opened {
                    Ok(_) => println!("{what}: ok"),
                    Err(e) => println!("{what}: errno {}", e.raw_os_error().unwrap_or(0)),
                }
            }
            ("sleep", Some(ms)) => {
                let Ok(ms) = ms.parse() else { return ExitCode::from(2) };
                println!("sleeping");
                std::thread::sleep(Duration::from_millis(ms));
                println!("slept");
            }
            ("socket", _) => {
                let made = std::net::UdpSocket::bind("127.0.0.1:0").is_ok();
                println!("socket: {}", if made { "made" } else { "refused" });
                break;
            }
            _ => {
                eprintln!("unknown action {action:?}");
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}
