//! A debugging client: connects to a broker socket, shakes hands and prints one full sample.
//!
//! `cargo run --example probe -- /run/amd-hsmp/broker.sock`
//! Exit codes: 0 served, 1 refused or failed (the reason is printed).

use amd_hsmp_proto::{Families, Message, PROTOCOL_VERSION, Readings, Reply, Request};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

fn call(s: &mut UnixStream, req: &Request) -> Result<Reply, String> {
    let chain = |e: &dyn std::error::Error| match e.source() {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    };
    req.write(s).map_err(|e| format!("send: {}", chain(&e)))?;
    Reply::read(s).map_err(|e| format!("receive: {}", chain(&e)))
}

fn count<T>(r: &Readings<T>) -> String {
    match r {
        Readings::Values(values) => {
            let ok = values.iter().filter(|v| v.is_ok()).count();
            format!("{ok}/{} read", values.len())
        }
        Readings::NotRequested => "not requested".into(),
        Readings::Unavailable(why) => format!("unavailable ({why:?})"),
    }
}

fn run(path: &str) -> Result<(), String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("connect {path}: {e}"))?;
    println!("{:?}", call(&mut s, &Request::Hello { protocol_version: PROTOCOL_VERSION })?);
    match call(&mut s, &Request::Topology)? {
        Reply::Topology(t) => println!(
            "topology: family {:#x} model {:#x}, {} sockets, {} cores",
            t.cpu_family,
            t.cpu_model,
            t.sockets.len(),
            t.cores.len()
        ),
        other => return Err(format!("unexpected reply {other:?}")),
    }
    match call(&mut s, &Request::Sample { what: Families::ALL, deadline_ms: 5000 })? {
        Reply::Sample(x) => {
            println!("hsmp: {:?}", x.hsmp);
            let source = x.energy_source.map_or("none".to_owned(), |s| s.to_string());
            println!("energy source: {source}");
            for (family, readings) in x.readings.iter() {
                println!("{family}: {}", count(readings));
            }
            Ok(())
        }
        other => Err(format!("unexpected reply {other:?}")),
    }
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: probe SOCKET");
        return ExitCode::from(2);
    };
    match run(&path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
