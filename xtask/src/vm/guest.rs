//! The guest: QEMU under TCG with the SSDT, the `memmap=` reservation and RAM backed by a file
//! in `/dev/shm`, and the command channel to the agent the guest runs on its second serial port.
//!
//! The channel: the host sends `<id> <base64 of a bash script>`; the agent (`tests/vm/vm-agent`)
//! runs it and answers `BEGIN <id> <exit code> <line count>`, the output lines, `END <id>`.

use super::mailbox::{MSG_ARG_OFFSET, MSG_ID_OFFSET, MSG_RSP_OFFSET, WINDOW_BASE, WINDOW_SIZE};
use super::prepare::run_logged;
use anyhow::{Context, Result, bail, ensure};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Guest RAM. The initramfs (the whole root, about 200 MiB) is unpacked into it.
pub const RAM_MIB: u64 = 1536;

/// What to boot.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// The kernel image.
    pub kernel: PathBuf,
    /// The initramfs (root and overlay).
    pub initrd: PathBuf,
    /// The compiled SSDTs, one per socket.
    pub ssdts: Vec<PathBuf>,
    /// Sockets.
    pub sockets: u32,
    /// Cores present per socket (one thread each).
    pub cores: u32,
    /// Cores per socket the topology has room for: `cores`, or more, and then only `cores` of
    /// each socket are placed (see [`smp`]).
    pub apic_cores: u32,
    /// QEMU's `-cpu`: the model and the family and model its CPUID reports.
    pub cpu: String,
    /// The guest RAM file (created by [`RamFile::create`]).
    pub ram: PathBuf,
    /// The run directory (console log, control socket).
    pub run: PathBuf,
}

/// The sparse file QEMU maps as guest RAM, removed when dropped.
#[derive(Debug)]
pub struct RamFile(pub PathBuf);

impl RamFile {
    /// Creates it at its full size, so the responder can open it before QEMU starts.
    pub fn create(&self) -> Result<()> {
        let file = fs::File::create(&self.0)
            .with_context(|| format!("cannot create {}", self.0.display()))?;
        file.set_len(RAM_MIB << 20)?;
        Ok(())
    }
}

impl Drop for RamFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// QEMU, killed and reaped when dropped.
#[derive(Debug)]
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Writes and compiles one SSDT per socket from `tests/vm/hsmp-socket.asl`.
pub fn ssdts(run: &Path, sockets: u32, log: &Path) -> Result<Vec<PathBuf>> {
    let template = super::repo_file("tests/vm/hsmp-socket.asl")?;
    let mut out = Vec::new();
    for socket in 0..sockets {
        let asl = template
            .replace("@SOCKET@", &socket.to_string())
            .replace("@UID@", &format!("ID{socket:02}"))
            .replace("@BASE@", &format!("{:#010X}", WINDOW_BASE + u64::from(socket) * WINDOW_SIZE))
            .replace("@SIZE@", &format!("{WINDOW_SIZE:#X}"))
            .replace("@MSG_ID@", &format!("{MSG_ID_OFFSET:#X}"))
            .replace("@MSG_RSP@", &format!("{MSG_RSP_OFFSET:#X}"))
            .replace("@MSG_ARG@", &format!("{MSG_ARG_OFFSET:#X}"));
        ensure!(!asl.contains('@'), "tests/vm/hsmp-socket.asl has an unknown @placeholder@");
        let src = run.join(format!("hsmp-socket{socket}.asl"));
        fs::write(&src, asl)?;
        let aml = run.join(format!("hsmp-socket{socket}"));
        run_logged(Command::new("iasl").arg("-p").arg(&aml).arg(&src), log)?;
        out.push(aml.with_extension("aml"));
    }
    Ok(out)
}

/// The kernel command line: serial console, the mailbox windows reserved, /init (which loads
/// the SELinux policy, then becomes systemd), SELinux as the major LSM (Debian's kernels default
/// to AppArmor), and audit records kept whole: no printk rate limit, a backlog and a log buffer
/// large enough for the run, since without auditd they reach only the kernel log.
pub fn cmdline(sockets: u32) -> String {
    let size_mib = (u64::from(sockets) * WINDOW_SIZE) >> 20;
    format!(
        "console=ttyS0,115200 memmap={size_mib}M${WINDOW_BASE:#x} rdinit=/init panic=-1 \
         loglevel=4 systemd.show_status=false security=selinux \
         sysctl.kernel.printk_ratelimit=0 audit_backlog_limit=8192 log_buf_len=8M"
    )
}

/// QEMU's `-smp` and CPU placement for `spec`: when the package has room for more cores than
/// are present (`apic_cores` above `cores`), `-smp` places socket 0's and one `-device` per core
/// each further socket's, whose APIC ids then start at socket << (bits for `apic_cores`), above
/// 255 from 256 cores up. Linux keeps x2APIC, without which it refuses such a CPU ("invalid
/// APIC ID"), only with interrupt remapping: hence the emulated IOMMU with `eim=on`.
pub fn smp(spec: &BootSpec) -> Vec<String> {
    let (sockets, cores, apic_cores) = (spec.sockets, spec.cores, spec.apic_cores);
    if apic_cores == cores {
        let smp = format!("{},sockets={sockets},cores={cores},threads=1", sockets * cores);
        return vec!["-smp".into(), smp];
    }
    let (model, features) = spec.cpu.split_once(',').unwrap_or((&spec.cpu, ""));
    let mut args = vec![
        "-smp".into(),
        format!(
            "{cores},sockets={sockets},cores={apic_cores},threads=1,maxcpus={}",
            sockets * apic_cores
        ),
    ];
    for socket in 1..sockets {
        for core in 0..cores {
            args.push("-device".into());
            args.push(format!(
                "{model}-x86_64-cpu,{features},socket-id={socket},core-id={core},thread-id=0"
            ));
        }
    }
    args.extend(["-device".into(), "intel-iommu,intremap=on,eim=on".into()]);
    args
}

/// One command's result.
#[derive(Debug, Clone)]
pub struct Output {
    /// The exit code.
    pub rc: i32,
    /// Standard output and error, interleaved.
    pub text: String,
}

impl Output {
    /// Whether it exited 0.
    pub fn ok(&self) -> bool {
        self.rc == 0
    }
}

/// A booted guest with its agent connected.
#[derive(Debug)]
pub struct Vm {
    child: Qemu,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    console: PathBuf,
}

impl Vm {
    /// Starts QEMU and waits until the agent says `READY` (at most `timeout`).
    pub fn boot(spec: &BootSpec, timeout: Duration) -> Result<Vm> {
        let ctl = spec.run.join("ctl.sock");
        let _ = fs::remove_file(&ctl);
        let listener = UnixListener::bind(&ctl)
            .with_context(|| format!("cannot listen on {}", ctl.display()))?;
        let console = spec.run.join("console.log");
        // setpriv: QEMU dies with this process even if it is killed before cleaning up.
        let mut qemu = Command::new("setpriv");
        qemu.args(["--pdeathsig", "KILL", "--", "qemu-system-x86_64"]);
        qemu.args(["-nodefaults", "-display", "none", "-no-reboot"])
            .args(["-machine", "q35,accel=tcg,memory-backend=ram"])
            .args(["-cpu", &spec.cpu])
            .args(["-m", &format!("{RAM_MIB}M")])
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=ram,size={RAM_MIB}M,mem-path={},share=on",
                spec.ram.display()
            ))
            .args(smp(spec))
            .arg("-kernel")
            .arg(&spec.kernel)
            .arg("-initrd")
            .arg(&spec.initrd)
            .args(["-append", &cmdline(spec.sockets)])
            .arg("-chardev")
            .arg(format!("file,id=con,path={}", console.display()))
            .args(["-serial", "chardev:con"])
            .arg("-chardev")
            .arg(format!("socket,id=ctl,path={}", ctl.display()))
            .args(["-serial", "chardev:ctl"]);
        for ssdt in &spec.ssdts {
            qemu.arg("-acpitable").arg(format!("file={}", ssdt.display()));
        }
        let log = fs::File::create(spec.run.join("qemu.log"))?;
        let mut child = Qemu(
            qemu.stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("cannot start qemu-system-x86_64 (through setpriv)")?,
        );

        let started = Instant::now();
        listener.set_nonblocking(true)?;
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e).context("cannot accept QEMU's control connection"),
            }
            if let Some(status) = child.0.try_wait()? {
                let log = fs::read_to_string(spec.run.join("qemu.log")).unwrap_or_default();
                bail!("QEMU exited ({status}) before connecting: {}", log.trim());
            }
            ensure!(started.elapsed() < timeout, "QEMU did not connect its control port");
            std::thread::sleep(Duration::from_millis(20));
        };
        stream.set_nonblocking(false)?;
        let writer = stream.try_clone()?;
        let mut vm = Vm { child, reader: BufReader::new(stream), writer, next_id: 1, console };
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let line = vm.read_line(left).with_context(|| {
                format!("the guest agent did not start; the console says:\n{}", vm.console_tail(40))
            })?;
            if line.trim_end() == "READY" {
                break;
            }
        }
        Ok(vm)
    }

    /// The last `n` lines of the guest's console.
    pub fn console_tail(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.console).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn read_line(&mut self, timeout: Duration) -> Result<String> {
        ensure!(!timeout.is_zero(), "timed out");
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).context("no answer from the guest")?;
        ensure!(n > 0, "the guest closed its control port");
        Ok(line)
    }

    /// Runs `script` with bash in the guest, as root, and waits at most `timeout`.
    pub fn run(&mut self, script: &str, timeout: Duration) -> Result<Output> {
        let id = self.next_id;
        self.next_id += 1;
        let encoded = base64(script.as_bytes());
        writeln!(self.writer, "{id} {encoded}").context("cannot write to the guest")?;
        let started = Instant::now();
        let left = |s: &Instant| timeout.saturating_sub(s.elapsed());
        let header = loop {
            let line = self
                .read_line(left(&started))
                .with_context(|| format!("guest command timed out after {timeout:?}: {script}"))?;
            if line.starts_with(&format!("BEGIN {id} ")) {
                break line;
            }
        };
        let fields: Vec<&str> = header.split_whitespace().collect();
        let [_, _, rc, count] = fields[..] else { bail!("bad agent header {header:?}") };
        let rc: i32 = rc.parse().context("bad exit code from the agent")?;
        let count: usize = count.parse().context("bad line count from the agent")?;
        let mut text = String::new();
        for _ in 0..count {
            text.push_str(&self.read_line(left(&started))?);
        }
        let end = self.read_line(left(&started))?;
        ensure!(end.trim_end() == format!("END {id}"), "bad agent trailer {end:?}");
        Ok(Output { rc, text })
    }

    /// Asks the guest to power off and waits for QEMU to exit (killing it after `timeout`).
    pub fn power_off(mut self, timeout: Duration) -> Result<()> {
        let _ = writeln!(self.writer, "0 {}", base64(b"systemctl --no-block poweroff"));
        let started = Instant::now();
        while started.elapsed() < timeout {
            if self.child.0.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the guest did not power off within {timeout:?}")
    }
}

/// Standard base64 with padding (what `base64 -d` reads).
fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_coreutils_encoding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"ls -l /dev/hsmp\n"), "bHMgLWwgL2Rldi9oc21wCg==");
    }

    #[test]
    fn cores_beyond_the_present_ones_place_the_second_socket_above_apic_id_255() {
        let mut spec = BootSpec {
            kernel: PathBuf::new(),
            initrd: PathBuf::new(),
            ssdts: Vec::new(),
            sockets: 2,
            cores: 2,
            apic_cores: 2,
            cpu: "EPYC-Milan,family=26,model=80,x2apic=on".into(),
            ram: PathBuf::new(),
            run: PathBuf::new(),
        };
        assert_eq!(smp(&spec), ["-smp", "4,sockets=2,cores=2,threads=1"]);
        spec.apic_cores = 384;
        assert_eq!(
            smp(&spec),
            [
                "-smp",
                "2,sockets=2,cores=384,threads=1,maxcpus=768",
                "-device",
                "EPYC-Milan-x86_64-cpu,family=26,model=80,x2apic=on,socket-id=1,core-id=0,thread-id=0",
                "-device",
                "EPYC-Milan-x86_64-cpu,family=26,model=80,x2apic=on,socket-id=1,core-id=1,thread-id=0",
                "-device",
                "intel-iommu,intremap=on,eim=on",
            ]
        );
    }

    #[test]
    fn the_command_line_reserves_every_socket_window_and_selects_selinux() {
        assert!(cmdline(2).contains("memmap=2M$0x1f000000"));
        assert!(cmdline(2).contains(" security=selinux "));
        assert!(cmdline(1).contains("memmap=1M$0x1f000000"));
    }
}
