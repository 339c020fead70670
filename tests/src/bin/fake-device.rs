//! `fake-device FIXTURE`: mounts the end-to-end suite's FUSE fake device for fixture machine
//! `FIXTURE` (static firmware values), prints the path of its `hsmp` node and of the fixture's
//! procfs/sysfs tree, one per line, and serves until its standard input closes; then prints how
//! many messages of each id it answered and unmounts. `cargo xtask kube-test` passes the node's
//! directory into a podman pod as the hostPath of the host's `/dev`. Needs root, `/dev/fuse` and `fusermount3`.

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name] = args.as_slice() else { bail!("usage: fake-device FIXTURE") };
    let spec = amd_hsmp_e2e::fixtures::machine(name)
        .with_context(|| format!("unknown fixture {name:?}"))?;
    let (_machine, device) = amd_hsmp_e2e::fake::mount_static(spec).context(
        "cannot mount the fake device (needs root, /dev/fuse and fusermount3 from fuse3)",
    )?;
    let tree = amd_hsmp_e2e::fixtures::tree(&amd_hsmp_e2e::fixtures::fixtures_dir(), name);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", device.hsmp_path().display())?;
    writeln!(out, "{}", tree.display())?;
    out.flush()?;
    // Until whoever started us closes our standard input (or dies).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    for (id, count) in device.message_counts() {
        writeln!(out, "message {id:#04x}: {count}")?;
    }
    Ok(())
}
