//! Checks 1, 2 and K: the driver probing from the SSDT and the udev rule, the package installed
//! (users, socket, system state), and `amd-hsmp-check` as an operator runs it.

use super::{COMMAND_TIMEOUT, Ctx, Evidence, Verdict, sh};
use crate::vm::guest::{Output, Vm};
use crate::vm::responder::Responder;
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Check 1: the driver probes from our SSDT, /dev/hsmp, the udev rule.
pub(super) fn driver(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let mut ev = Evidence::default();
    bound_through_acpi(&mut ev, vm, &ctx.load, ctx.responder.topology().sockets)?;
    let dmesg = sh(vm, "dmesg | grep -i hsmp | tail -n 8")?;
    ev.check(true, format!("kernel log: {}", dmesg.text.trim().replace('\n', " | ")));
    let node = sh(vm, "stat -c '%F %U:%G %a' /dev/hsmp")?;
    let rule = udev_rule(&crate::vm::repo_file("packaging/udev/60-amd-hsmp.rules")?)?;
    ev.check(
        node.text.trim() == format!("character special file {rule}"),
        format!("/dev/hsmp is {} (the packaged rule: {rule})", node.text.trim()),
    );
    Ok(ev.verdict("driver probes from the SSDT; /dev/hsmp; udev rule"))
}

/// Adds to `ev` that udev loaded the driver (`load`, the set-up's) and that one `AMDI0097`
/// device per socket is bound to `hsmp_acpi`.
pub(super) fn bound_through_acpi(
    ev: &mut Evidence,
    vm: &mut Vm,
    load: &Output,
    sockets: u32,
) -> Result<()> {
    ev.check(
        load.ok(),
        format!("udev loaded the driver: {}", load.text.trim().replace('\n', "; ")),
    );
    let bound = sh(vm, "ls /sys/bus/platform/drivers/hsmp_acpi/ | grep -c AMDI0097")?;
    ev.check(
        bound.text.trim() == sockets.to_string(),
        format!("{} AMDI0097 devices bound to hsmp_acpi, {sockets} sockets", bound.text.trim()),
    );
    Ok(())
}

/// Check 2: package, users, socket, system state.
pub(super) fn package(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let (install, settled) = (&ctx.install, &ctx.settled);
    let mut ev = Evidence::default();
    let status = sh(vm, "dpkg-query -W -f='${Status} ${Version}' amd-hsmp-exporter")?;
    ev.check(
        install.ok() && status.text.starts_with("install ok installed"),
        format!("apt-get install exit {}; dpkg: {}", install.rc, status.text.trim()),
    );
    let sysusers = crate::vm::repo_file("packaging/sysusers.d/amd-hsmp-exporter.conf")?;
    let users = sysusers.lines().filter(|l| l.starts_with("u ")).count();
    ev.check(users == 2, format!("{users} users in the sysusers file"));
    let owner = sh(vm, "dpkg-query -S /usr/lib/sysusers.d/amd-hsmp-exporter.conf")?;
    ev.check(
        owner.ok() && owner.text.starts_with("amd-hsmp-exporter:"),
        format!("sysusers file installed by {}", owner.text.trim()),
    );
    for line in sysusers.lines().filter(|l| l.starts_with("u ")) {
        let fields: Vec<&str> = line.splitn(4, ' ').collect();
        let (Some(user), Some(gecos)) = (fields.get(1), fields.get(3)) else { continue };
        let gecos = gecos.trim().trim_matches('"');
        let entry = sh(vm, &format!("getent passwd {user}"))?;
        let cols: Vec<&str> = entry.text.trim().split(':').collect();
        let uid: u32 = cols.get(2).and_then(|u| u.parse().ok()).unwrap_or(u32::MAX);
        ev.check(
            entry.ok() && cols.get(4) == Some(&gecos) && uid < 1000,
            format!("user {user} from sysusers: {}", entry.text.trim()),
        );
    }
    let socket_unit = crate::vm::repo_file("packaging/systemd/amd-hsmp-broker.socket")?;
    let setting = |key: &str| {
        crate::packaging::units::parse_unit(&socket_unit)
            .into_iter()
            .find(|(_, k, _)| k == key)
            .map(|(_, _, v)| v)
            .unwrap_or_default()
    };
    let (path, mode) = (setting("ListenStream"), setting("SocketMode"));
    let want = format!(
        "active socket {}:{} {}",
        setting("SocketUser"),
        setting("SocketGroup"),
        mode.trim_start_matches('0')
    );
    let sock = sh(
        vm,
        &format!(
            "echo $(systemctl is-active amd-hsmp-broker.socket) $(stat -c '%F %U:%G %a' {path})"
        ),
    )?;
    ev.check(
        sock.text.trim() == want,
        format!("{path}: {} (documented: {want})", sock.text.trim()),
    );
    // The package's modules-load.d file is read at every boot: load it now as a boot would.
    let modules_load = sh(
        vm,
        "systemctl restart systemd-modules-load.service; r=$?; \
         journalctl -b -u systemd-modules-load.service -o cat | tail -n 3; exit $r",
    )?;
    ev.check(
        modules_load.ok(),
        format!(
            "systemd-modules-load with the packaged modules-load.d: exit {} ({})",
            modules_load.rc,
            modules_load.text.trim().replace('\n', " | ")
        ),
    );
    let state = sh(vm, "systemctl is-system-running; systemctl --failed --plain --no-legend")?;
    let ours_failed =
        state.text.lines().any(|l| l.contains("amd-hsmp") || l.contains("modules-load"));
    ev.check(
        !ours_failed,
        format!(
            "system state {} (before the package: {})",
            state.text.trim().replace('\n', " | "),
            settled.text.trim().replace('\n', " | ")
        ),
    );
    Ok(ev.verdict("package installs cleanly; sysusers; socket; system state"))
}

/// `OWNER:GROUP MODE` (mode without its leading zero, as `stat %a` prints it) of the udev rule
/// for the HSMP misc device in the packaged rules file.
fn udev_rule(rules: &str) -> Result<String> {
    let line = rules
        .lines()
        .find(|l| !l.starts_with('#') && l.contains("KERNEL==\"hsmp_cdev\""))
        .context("no active hsmp_cdev rule in packaging/udev/60-amd-hsmp.rules")?;
    let value = |key: &str| {
        line.split(',')
            .map(str::trim)
            .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
            .and_then(|v| v.strip_suffix('"'))
            .with_context(|| format!("the hsmp_cdev rule sets no {key}"))
    };
    let mode = value("MODE")?.trim_start_matches('0');
    Ok(format!("{}:{} {mode}", value("OWNER")?, value("GROUP")?))
}

/// Runs `f` while every core of the responder's simulator draws 2 W (0.1 J every 50 ms, as an
/// idle core): `--check` waits for energy to advance.
pub(super) fn while_energy_advances<T>(responder: &Responder, f: impl FnOnce() -> T) -> T {
    let machine = responder.machine();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = machine.firmware().advance_all_energy(0.1);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        out
    })
}

/// Check K: `amd-hsmp-check` as an operator runs it (root, unconfined): every check passes on
/// the healthy guest (the responder's energy advancing meanwhile), the driver unloaded names
/// modprobe, the socket's permissions broken name the group; the last through
/// `amd-hsmp-broker --check`, kept for one release, which runs the installed amd-hsmp-check.
pub(super) fn operator_check(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let (vm, responder) = (&mut *ctx.vm, ctx.responder);
    let mut ev = Evidence::default();
    let run_check =
        |vm: &mut Vm| vm.run("runcon -t unconfined_t -- bash -c 'amd-hsmp-check'", COMMAND_TIMEOUT);
    let healthy = while_energy_advances(responder, || run_check(vm))?;
    let failed: Vec<&str> = healthy.text.lines().filter(|l| l.starts_with("FAIL")).collect();
    ev.check(
        healthy.ok() && failed.is_empty(),
        format!("healthy guest: exit {}, {} FAIL lines", healthy.rc, failed.len()),
    );
    for line in healthy.text.lines() {
        ev.check(true, format!("  {line}"));
    }
    let unloaded = vm.run(
        "systemctl stop amd-hsmp-broker.service && modprobe -r hsmp_acpi hsmp_common && runcon -t unconfined_t -- bash -c \
         'amd-hsmp-check'; rc=$?; modprobe hsmp_acpi && udevadm settle; exit $rc",
        COMMAND_TIMEOUT,
    )?;
    let driver = unloaded.text.lines().find(|l| l.starts_with("FAIL  driver")).unwrap_or("");
    ev.check(
        unloaded.rc == 1
            && driver.contains("ACPI device AMDI0097")
            && driver.contains("fix: modprobe hsmp_acpi"),
        format!("driver unloaded: exit {}; {driver}", unloaded.rc),
    );
    let broken = vm.run(
        "chmod 0600 /run/amd-hsmp/broker.sock && runcon -t unconfined_t -- bash -c \
         'amd-hsmp-broker --check'; rc=$?; chmod 0660 /run/amd-hsmp/broker.sock; exit $rc",
        COMMAND_TIMEOUT,
    )?;
    let socket = broken.text.lines().find(|l| l.starts_with("FAIL  socket")).unwrap_or("");
    ev.check(
        broken.rc == 1 && socket.contains("through group amd-hsmp-exporter"),
        format!("socket mode 0600: exit {}; {socket}", broken.rc),
    );
    ev.check(
        broken.text.contains("--check has moved to amd-hsmp-check")
            && broken.text.contains("amd-hsmp-check: a scrape cannot work as it should"),
        "amd-hsmp-broker --check said where the checks moved and ran amd-hsmp-check".to_owned(),
    );
    Ok(ev.verdict("amd-hsmp-check: healthy, driver unloaded, socket broken (and the old form)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_udev_rule_gives_owner_group_and_mode() {
        let rules = crate::vm::repo_file("packaging/udev/60-amd-hsmp.rules").unwrap();
        assert_eq!(udev_rule(&rules).unwrap(), "root:amd-hsmp-broker 640");
        assert!(udev_rule("# KERNEL==\"hsmp_cdev\", MODE=\"0640\"").is_err());
    }
}
