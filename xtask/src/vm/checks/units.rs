//! Checks 5 and W: the units under real systemd (their sandbox and exposure, freeze and thaw),
//! and a web configuration with TLS and basic auth passed through the packaged variables file
//! and reloaded on `SIGHUP`.

use super::exporter::{exact_values, expected, scrape, wait_for_exporter};
use super::{COMMAND_TIMEOUT, Ctx, Evidence, Verdict, sh};
use crate::vm::guest::Vm;
use anyhow::{Context, Result, bail};

/// The highest `systemd-analyze security` exposure either unit may have.
const MAX_EXPOSURE: f64 = 1.5;

/// Check 5: the sandbox under real systemd; freeze and thaw.
pub(super) fn sandbox(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let responder = ctx.responder;
    let guest_cost = ctx.guest_cost.context("check 5 runs after check 4")?;
    let mut ev = Evidence::default();
    let pid = sh(vm, "systemctl show -p MainPID --value amd-hsmp-broker.service")?
        .text
        .trim()
        .to_string();
    let status = sh(
        vm,
        &format!("grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/{pid}/status"),
    )?;
    for line in status.text.lines() {
        let (key, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.trim();
        let ok = match key {
            "NoNewPrivs" => value == "1",
            "Seccomp" => value == "2",
            _ => value.chars().all(|c| c == '0'),
        };
        ev.check(ok, format!("broker (pid {pid}) {key}: {value}"));
    }
    ev.check(status.text.lines().count() == 7, "all seven status fields read");
    let epid = sh(vm, "systemctl show -p MainPID --value amd-hsmp-exporter.service")?
        .text
        .trim()
        .to_string();
    let open = sh(vm, &format!("nsenter -t {epid} -m -- head -c 0 /dev/hsmp"))?;
    ev.check(
        !open.ok(),
        format!("/dev/hsmp from the exporter's mount namespace: {}", open.text.trim()),
    );
    let as_user = sh(
        vm,
        "setpriv --reuid=amd-hsmp-exporter --regid=amd-hsmp-exporter --init-groups head -c 0 /dev/hsmp",
    )?;
    ev.check(!as_user.ok(), format!("/dev/hsmp as the exporter's user: {}", as_user.text.trim()));
    for unit in ["amd-hsmp-broker.service", "amd-hsmp-exporter.service"] {
        let report = sh(vm, &format!("systemd-analyze security --no-pager {unit}"))?;
        match crate::packaging::units::parse_exposure(&report.text, unit) {
            Ok(level) => ev.check(
                level <= MAX_EXPOSURE,
                format!("{unit} exposure {level} (at most {MAX_EXPOSURE})"),
            ),
            Err(e) => ev.check(false, format!("{unit}: {e:#}")),
        };
    }
    let freeze = sh(
        vm,
        "systemctl freeze amd-hsmp-broker.service && systemctl show -p FreezerState --value amd-hsmp-broker.service",
    )?;
    ev.check(
        freeze.ok() && freeze.text.trim() == "frozen",
        format!("freeze: {}", freeze.text.trim()),
    );
    let frozen = scrape(vm, 1.0)?;
    ev.check(
        frozen.seconds <= 1.0 + guest_cost,
        format!(
            "a scrape while frozen (timeout header 1 s) returns in {:.3} s (bound: header + {:.3} s, \
             as in check 4)",
            frozen.seconds, guest_cost
        ),
    );
    let thaw = sh(
        vm,
        "systemctl thaw amd-hsmp-broker.service && systemctl show -p FreezerState --value amd-hsmp-broker.service",
    )?;
    ev.check(thaw.ok() && thaw.text.trim() == "running", format!("thaw: {}", thaw.text.trim()));
    let thawed = scrape(vm, 10.0)?;
    let exp = expected(responder, true)?;
    let n = exact_values(&mut ev, &thawed, &exp, |_| false);
    let pid_after = sh(vm, "systemctl show -p MainPID --value amd-hsmp-broker.service")?
        .text
        .trim()
        .to_string();
    ev.check(
        pid_after == pid,
        format!("same broker after the thaw (pid {pid_after}), {n} series exact"),
    );
    Ok(ev.verdict("sandbox under systemd; exporter cannot open /dev/hsmp; freeze/thaw"))
}

/// The bcrypt hash (`htpasswd -nbBC 10 "" vm-test-password`) of check W's basic-auth user.
const WEB_USER_HASH: &str = "$2y$10$G/Cbv8kBCFnjZXpVYTxxxu19f5EkQHsWXGOEcw8B/ynwoVev6XU7W";

/// Check W: a self-signed certificate and key made on the host (openssl) and a web
/// configuration with TLS and basic auth, in `/etc/amd-hsmp-exporter/` with its label, passed
/// through `OPTIONS=` of the packaged variables file (`/etc/default`, the .deb's); HTTPS without credentials is 401, with
/// them 200 with `amd_hsmp_up 1`; `SIGHUP` reloads and the same process still serves. The
/// packaged configuration is restored afterwards.
pub(super) fn web_config(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let vm = &mut *ctx.vm;
    let mut ev = Evidence::default();
    let dir = std::env::temp_dir().join(format!("amd-hsmp-vm-tls-{}", std::process::id()));
    fs_err(std::fs::create_dir_all(&dir))?;
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .context("cannot run openssl")?;
    if !made.status.success() {
        bail!("openssl req failed: {}", String::from_utf8_lossy(&made.stderr));
    }
    let cert_pem = fs_err(std::fs::read_to_string(&cert))?;
    let key_pem = fs_err(std::fs::read_to_string(&key))?;
    let _ = std::fs::remove_dir_all(&dir);
    let setup = vm.run(
        &format!(
            "set -e; d=/etc/amd-hsmp-exporter; mkdir -p $d\n\
             cat > $d/tls.crt <<'EOF'\n{cert_pem}EOF\n\
             cat > $d/tls.key <<'EOF'\n{key_pem}EOF\n\
             cat > $d/web-config.yml <<'EOF'\n\
             tls_server_config:\n  cert_file: /etc/amd-hsmp-exporter/tls.crt\n\
             \x20 key_file: /etc/amd-hsmp-exporter/tls.key\n\
             basic_auth_users:\n  prometheus: {WEB_USER_HASH}\nEOF\n\
             chgrp amd-hsmp-exporter $d/tls.key $d/web-config.yml; chmod 0640 $d/tls.key $d/web-config.yml\n\
             restorecon -R $d; ls -Z $d | tr '\\n' ' '; echo\n\
             cp /etc/default/amd-hsmp-exporter /root/vm/exporter.sysconfig\n\
             echo 'OPTIONS=\"--web.config.file=/etc/amd-hsmp-exporter/web-config.yml\"' \
             >> /etc/default/amd-hsmp-exporter\n\
             systemctl restart amd-hsmp-exporter.service\n\
             for i in $(seq 100); do curl -sk -m 5 -o /dev/null https://127.0.0.1:10054/ && exit 0; sleep 0.1; done; exit 1"
        ),
        COMMAND_TIMEOUT,
    )?;
    ev.check(setup.ok(), format!("configured and restarted: {}", setup.text.trim()));
    let https = "https://127.0.0.1:10054/metrics";
    let status = |vm: &mut Vm, auth: &str| -> Result<String> {
        let out = vm.run(
            &format!("curl -sk -m 20 {auth} -o /tmp/w.out -w '%{{http_code}}' {https}; echo; grep -c '^amd_hsmp_up 1$' /tmp/w.out"),
            COMMAND_TIMEOUT,
        )?;
        Ok(out.text.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    let anonymous = status(vm, "")?;
    ev.check(anonymous.starts_with("401"), format!("HTTPS without credentials: {anonymous}"));
    let user = "-u prometheus:vm-test-password";
    let authed = status(vm, user)?;
    ev.check(
        authed == "200 1",
        format!("HTTPS as prometheus: {authed} (status, amd_hsmp_up 1 lines)"),
    );
    let hup = vm.run(
        "pid=$(systemctl show -p MainPID --value amd-hsmp-exporter.service); \
         [ \"$pid\" -gt 0 ] && kill -HUP $pid; sleep 2; journalctl -u amd-hsmp-exporter.service -o cat -n 20 | grep 'SIGHUP' | tail -n 1; \
         echo \"pid $pid $(systemctl show -p MainPID --value amd-hsmp-exporter.service)\"",
        COMMAND_TIMEOUT,
    )?;
    let pids: Vec<&str> = hup
        .text
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    ev.check(
        hup.text.contains("web configuration reloaded") && pids.len() == 2 && pids[0] == pids[1],
        format!("SIGHUP: {}", hup.text.trim().replace('\n', "; ")),
    );
    let after = status(vm, user)?;
    ev.check(after == "200 1", format!("HTTPS as prometheus after the reload: {after}"));
    if ev.failed() {
        ev.journal(vm)?;
    }
    let restore = vm.run(
        "cp /root/vm/exporter.sysconfig /etc/default/amd-hsmp-exporter && \
         systemctl restart amd-hsmp-exporter.service",
        COMMAND_TIMEOUT,
    )?;
    ev.check(restore.ok(), "the packaged configuration restored");
    wait_for_exporter(vm)?;
    Ok(ev.verdict("TLS and basic auth from --web.config.file; SIGHUP reload"))
}

/// An I/O error as an `anyhow` one.
fn fs_err<T>(r: std::io::Result<T>) -> Result<T> {
    Ok(r?)
}
