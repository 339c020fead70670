//! The simulated kernel drivers in front of the firmware: `amd_hsmp`'s validation, per-socket
//! serialization, timeout and errno mapping (`drivers/platform/x86/amd/hsmp/hsmp.c`), and the
//! `msr` driver's per-CPU register reads, with per-message counters for tests.
//!
//! A message is answered with the values of the instant it enters the mailbox, and its latency
//! is spent after that, as the kernel's driver polls for the answer: a reading's time is when
//! its read began, as the broker stamps it.

use super::Machine;
use super::faults::{FaultGroup, Target};
use amd_hsmp_device::msr::{MSR_CORE_ENERGY_STAT, MSR_RAPL_PWR_UNIT};
use amd_hsmp_device::table::{HSMP_MSG_ID_MAX, MsgDesc, MsgKind, id, msg_desc};
use amd_hsmp_device::{Errno, HsmpMessage, HsmpTransport, Message, MsrTransport};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How the device was opened (`f_mode & (FMODE_READ | FMODE_WRITE)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// `O_RDONLY`: GET messages only.
    ReadOnly,
    /// `O_WRONLY`: SET messages only.
    WriteOnly,
    /// `O_RDWR`: both.
    ReadWrite,
}

/// When the same message both sets and gets, bit 31 of argument 0 selects GET.
const CHECK_GET_BIT: u32 = 1 << 31;

/// `is_get_msg()`.
fn is_get(desc: MsgDesc, msg: &HsmpMessage) -> bool {
    match desc.kind {
        MsgKind::Get => true,
        MsgKind::SetGet => msg.args[0] & CHECK_GET_BIT != 0,
        MsgKind::Set | MsgKind::Reserved => false,
    }
}

/// The checks `hsmp_ioctl()` and `validate_message()` make before anything reaches the
/// firmware, in the kernel's order: id range (`ENOMSG`), access mode (`EPERM`), reserved id
/// (`ENOMSG`), argument count (`EINVAL`), response size (`EINVAL`). The socket index is checked
/// afterwards, against the machine.
pub fn validate(msg: &HsmpMessage, access: AccessMode) -> Result<(), Errno> {
    let desc = match msg_desc(msg.msg_id) {
        Some(desc) if msg.msg_id >= id::TEST => desc,
        _ => return Err(libc::ENOMSG),
    };
    let get = is_get(desc, msg);
    match access {
        AccessMode::ReadOnly if !get => return Err(libc::EPERM),
        AccessMode::WriteOnly if get => return Err(libc::EPERM),
        _ => {}
    }
    if desc.kind == MsgKind::Reserved {
        return Err(libc::ENOMSG);
    }
    if msg.num_args != desc.num_args {
        return Err(libc::EINVAL);
    }
    let size_ok = match desc.kind {
        MsgKind::SetGet => msg.response_sz <= desc.response_sz,
        _ => msg.response_sz == desc.response_sz,
    };
    if !size_ok {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// Index of an MSR in [`Counters`]' MSR slots.
fn msr_slot(msr: u32) -> usize {
    match msr {
        MSR_RAPL_PWR_UNIT => 0,
        MSR_CORE_ENERGY_STAT => 1,
        _ => 2,
    }
}

/// What the simulated drivers have been asked, for tests to assert on mailbox traffic.
#[derive(Debug)]
pub struct Counters {
    ioctls: [AtomicU64; HSMP_MSG_ID_MAX as usize],
    mailbox: [AtomicU64; HSMP_MSG_ID_MAX as usize],
    msr_reads: [AtomicU64; 3],
    pub(crate) perf_reads: AtomicU64,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            ioctls: std::array::from_fn(|_| AtomicU64::new(0)),
            mailbox: std::array::from_fn(|_| AtomicU64::new(0)),
            msr_reads: std::array::from_fn(|_| AtomicU64::new(0)),
            perf_reads: AtomicU64::new(0),
        }
    }
}

impl Counters {
    /// `ioctl` calls that carried message id `msg_id`, whatever their outcome (0 for ids outside
    /// the driver's table).
    pub fn ioctls(&self, msg_id: u32) -> u64 {
        Self::get(&self.ioctls, msg_id)
    }

    /// Messages with id `msg_id` that passed the driver's checks and were written to a
    /// mailbox.
    pub fn mailbox(&self, msg_id: u32) -> u64 {
        Self::get(&self.mailbox, msg_id)
    }

    /// Messages written to any mailbox.
    pub fn mailbox_total(&self) -> u64 {
        self.mailbox.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// `pread` calls on MSR devices for register `msr` (registers other than the two RAPL ones
    /// are counted together under any other number).
    pub fn msr_reads(&self, msr: u32) -> u64 {
        self.msr_reads[msr_slot(msr)].load(Ordering::Relaxed)
    }

    /// `read` calls on simulated `power_core` events.
    pub fn perf_reads(&self) -> u64 {
        self.perf_reads.load(Ordering::Relaxed)
    }

    /// Sets every counter to zero.
    pub fn reset(&self) {
        let perf = std::iter::once(&self.perf_reads);
        for c in self.ioctls.iter().chain(&self.mailbox).chain(&self.msr_reads).chain(perf) {
            c.store(0, Ordering::Relaxed);
        }
    }

    fn get(counters: &[AtomicU64], msg_id: u32) -> u64 {
        usize::try_from(msg_id)
            .ok()
            .and_then(|i| counters.get(i))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn bump(counters: &[AtomicU64], msg_id: u32) {
        if let Some(c) = usize::try_from(msg_id).ok().and_then(|i| counters.get(i)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What one socket's mailbox is doing, as [`Machine::mailbox`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MailboxState {
    /// Held by [`Machine::hold_socket`]: a message in the mailbox waits until it is released.
    pub held: bool,
    /// Messages to this socket that passed the driver's checks and have not returned yet:
    /// the one in the mailbox and those waiting for the socket's lock.
    pub pending: u32,
    /// The most messages that were ever pending at once.
    pub max_pending: u32,
    /// Messages that entered the mailbox (took the socket's lock), in total.
    pub entered: u64,
}

/// The state of every socket's mailbox, with a condition variable so tests can wait for a
/// state instead of sleeping.
#[derive(Debug, Default)]
pub(crate) struct Mailboxes {
    state: Mutex<BTreeMap<u32, MailboxState>>,
    changed: Condvar,
}

impl Mailboxes {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, MailboxState>> {
        // Plain counters, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn change(&self, socket: u32, f: impl FnOnce(&mut MailboxState)) {
        f(self.lock().entry(socket).or_default());
        self.changed.notify_all();
    }

    pub(crate) fn get(&self, socket: u32) -> MailboxState {
        self.lock().get(&socket).copied().unwrap_or_default()
    }

    pub(crate) fn set_held(&self, socket: u32, held: bool) {
        self.change(socket, |m| m.held = held);
    }

    /// Waits until `until` holds for `socket`'s state or `timeout` passes; returns the last
    /// state seen and whether `until` held.
    pub(crate) fn wait(
        &self,
        socket: u32,
        timeout: Duration,
        until: impl Fn(&MailboxState) -> bool,
    ) -> (MailboxState, bool) {
        let end = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            let now = state.get(&socket).copied().unwrap_or_default();
            let left = end.saturating_duration_since(Instant::now());
            if until(&now) || left.is_zero() {
                return (now, until(&now));
            }
            state =
                self.changed.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Blocks while `socket` is held.
    fn wait_released(&self, socket: u32) {
        let mut state = self.lock();
        while state.get(&socket).is_some_and(|m| m.held) {
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Counts a message as pending on its socket for as long as it lives.
struct Pending<'a> {
    mailboxes: &'a Mailboxes,
    socket: u32,
}

impl<'a> Pending<'a> {
    fn new(mailboxes: &'a Mailboxes, socket: u32) -> Pending<'a> {
        mailboxes.change(socket, |m| {
            m.pending += 1;
            m.max_pending = m.max_pending.max(m.pending);
        });
        Pending { mailboxes, socket }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.mailboxes.change(self.socket, |m| m.pending = m.pending.saturating_sub(1));
    }
}

/// One open descriptor of the simulated `/dev/hsmp`.
#[derive(Debug, Clone)]
pub struct Driver {
    machine: Arc<Machine>,
    access: AccessMode,
}

impl Driver {
    /// A descriptor opened with `access` on `machine`'s device. Use [`Machine::open_hsmp`] to
    /// get the open-time errors too.
    pub fn new(machine: Arc<Machine>, access: AccessMode) -> Driver {
        Driver { machine, access }
    }

    /// How the descriptor was opened.
    pub fn access(&self) -> AccessMode {
        self.access
    }

    /// Whether the descriptor was opened read-only (SET messages get `EPERM`).
    pub fn opened_read_only(&self) -> bool {
        self.access == AccessMode::ReadOnly
    }

    /// `ioctl(fd, HSMP_IOCTL_CMD, buf)` on the 44 bytes the kernel copies in and out.
    pub fn ioctl_bytes(&self, buf: &mut [u8; HsmpMessage::SIZE]) -> Result<(), Errno> {
        let mut msg = HsmpMessage::from_bytes(buf);
        self.send(&mut msg)?;
        *buf = msg.to_bytes();
        Ok(())
    }
}

impl HsmpTransport for Driver {
    /// `hsmp_ioctl()` → `hsmp_send_message()`: validate, take the socket's lock, let the
    /// firmware answer (or time out), copy `response_sz` words back.
    fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
        let machine = &self.machine;
        Counters::bump(&machine.counters.ioctls, msg.msg_id);
        validate(msg, self.access)?;
        let socket = u32::from(msg.sock_ind);
        let Some(lock) = machine.socket_locks.get(usize::from(msg.sock_ind)) else {
            return Err(libc::ENODEV);
        };

        let group = FaultGroup::of_message(msg.msg_id);
        let target = match Message::from_id(msg.msg_id) {
            Some(Message::GetBoostLimit | Message::GetCclkCoreLimit) => Target::Apic(msg.args[0]),
            Some(Message::GetRaplCoreCounter) => Target::Apic(msg.args[0] & 0xFFFF),
            _ => Target::Socket(socket),
        };
        let (timeout, latency, wedged, injected, unsupported) = machine.with_faults(|f| {
            (
                f.driver_timeout,
                f.socket_latency.get(&socket).copied().unwrap_or(f.latency),
                f.wedged_sockets.contains(&socket),
                group.and_then(|g| f.errno.get(&(g, target)).copied()),
                group.is_some_and(|g| f.unsupported.contains(&g)),
            )
        });

        let _pending = Pending::new(&machine.mailboxes, socket);
        // One message at a time per socket, as the driver's per-socket semaphore enforces.
        let _guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        Counters::bump(&machine.counters.mailbox, msg.msg_id);
        machine.mailboxes.change(socket, |m| m.entered += 1);
        machine.mailboxes.wait_released(socket);
        if wedged || latency >= timeout {
            std::thread::sleep(timeout);
            return Err(libc::ETIMEDOUT);
        }
        // The SMU answers as the message reaches it; what a message costs is the driver's
        // polling for that answer: `__hsmp_send_message` (drivers/platform/x86/amd/hsmp/hsmp.c)
        // writes the arguments and the message id, then reads the response register between
        // `usleep_range` sleeps until it is no longer NOT_READY. So the values are those of the
        // instant the message entered, and the latency comes after them: a reading's time is
        // when its read began, as the broker stamps it.
        let answered = if let Some(errno) = injected {
            Err(errno)
        } else if unsupported {
            Err(libc::ENOMSG)
        } else {
            machine
                .firmware
                .answer(msg.sock_ind, msg.msg_id, &msg.args)
                .map_err(|status| status.errno())
        };
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        let words = answered?;
        let n = usize::from(msg.response_sz).min(words.len());
        msg.args[..n].copy_from_slice(&words[..n]);
        Ok(())
    }
}

/// One open `/dev/cpu/<cpu>/msr` of the simulated machine.
#[derive(Debug, Clone)]
pub struct SimMsr {
    machine: Arc<Machine>,
    cpu: u32,
}

impl SimMsr {
    /// The device of `cpu`, without the open-time checks of [`Machine::open_msr`].
    pub fn new(machine: Arc<Machine>, cpu: u32) -> SimMsr {
        SimMsr { machine, cpu }
    }

    /// The Linux CPU number.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }
}

impl MsrTransport for SimMsr {
    /// `pread(fd, buf, 8, msr)`: `EIO` for a register the machine does not have; `ENXIO` while
    /// the CPU is offline ([`Faults::offline`](crate::Faults::offline)), as the kernel's
    /// cross-CPU call refuses an offline CPU (`arch/x86/kernel/msr.c`, `msr_read()`), and a
    /// value again once it is back, through the same transport (pinned by
    /// `device/tests/hotplug.rs`).
    fn read(&self, msr: u32) -> Result<u64, Errno> {
        let machine = &self.machine;
        machine.counters.msr_reads[msr_slot(msr)].fetch_add(1, Ordering::Relaxed);
        let energy_msr = matches!(msr, MSR_RAPL_PWR_UNIT | MSR_CORE_ENERGY_STAT);
        let fault = machine.with_faults(|f| {
            if f.offline.contains(&self.cpu) {
                return Some(libc::ENXIO);
            }
            f.errno
                .get(&(FaultGroup::Msr, Target::Cpu(self.cpu)))
                .copied()
                .or((energy_msr && f.unsupported.contains(&FaultGroup::Msr)).then_some(libc::EIO))
        });
        if let Some(errno) = fault {
            return Err(errno);
        }
        machine.firmware.read_msr(self.cpu, msr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Faults;
    use crate::firmware::Mode;
    use crate::profile::{MachineSpec, Profile};
    use crate::{Clock, FirmwareConfig, Machine, ManualClock};
    use amd_hsmp_device::{HsmpOpener, MsrOpener};
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    fn machine(profile: Profile, mode: Mode) -> Arc<Machine> {
        Machine::new(profile.spec(), FirmwareConfig::new(mode))
    }

    fn message(msg_id: u32, num_args: u16, response_sz: u16, arg: u32, sock: u16) -> HsmpMessage {
        let mut args = [0; 8];
        args[0] = arg;
        HsmpMessage { msg_id, num_args, response_sz, args, sock_ind: sock }
    }

    fn send(
        driver: &Driver,
        msg_id: u32,
        num_args: u16,
        response_sz: u16,
        arg: u32,
        sock: u16,
    ) -> Result<[u32; 8], Errno> {
        let mut m = message(msg_id, num_args, response_sz, arg, sock);
        driver.send(&mut m).map(|()| m.args)
    }

    #[test]
    fn driver_validation_errnos() {
        let m = machine(Profile::Turin2p, Mode::Static);
        let ro = Driver::new(m.clone(), AccessMode::ReadOnly);
        let rw = Driver::new(m.clone(), AccessMode::ReadWrite);
        let wo = Driver::new(m.clone(), AccessMode::WriteOnly);
        let apic = m.topology().cores[0].apic_id;

        // Unknown ids.
        assert_eq!(send(&ro, 0x00, 0, 1, 0, 0), Err(libc::ENOMSG));
        assert_eq!(send(&ro, 0x33, 0, 1, 0, 0), Err(libc::ENOMSG));
        assert_eq!(send(&ro, 0xFFFF_FFFF, 0, 1, 0, 0), Err(libc::ENOMSG));
        // A reserved id is "not a GET", so a read-only descriptor refuses it first.
        assert_eq!(send(&rw, 0x29, 0, 0, 0, 0), Err(libc::ENOMSG));
        assert_eq!(send(&ro, 0x29, 0, 0, 0, 0), Err(libc::EPERM));
        // Word counts must match the table exactly for GET messages.
        assert_eq!(send(&ro, 0x31, 1, 1, apic, 0), Err(libc::EINVAL));
        assert_eq!(send(&ro, 0x31, 0, 2, apic, 0), Err(libc::EINVAL));
        assert_eq!(send(&ro, 0x03, 0, 2, 0, 0), Err(libc::EINVAL));
        assert!(send(&ro, 0x31, 1, 2, apic, 0).is_ok());
        // Socket index.
        assert!(send(&ro, 0x03, 0, 1, 0, 1).is_ok());
        assert_eq!(send(&ro, 0x03, 0, 1, 0, 2), Err(libc::ENODEV));
        // SET on a read-only descriptor, GET on a write-only one.
        assert_eq!(send(&ro, 0x05, 1, 0, 200_000, 0), Err(libc::EPERM));
        assert_eq!(send(&wo, 0x03, 0, 1, 0, 0), Err(libc::EPERM));
        // The driver lets a SET through a writable descriptor; this firmware does not
        // implement it.
        assert_eq!(send(&rw, 0x05, 1, 0, 200_000, 0), Err(libc::ENOMSG));
        // SET_GET: bit 31 makes it a GET; response_sz is a maximum.
        assert_eq!(send(&ro, 0x21, 1, 1, 0, 0), Err(libc::EPERM));
        assert_eq!(send(&ro, 0x21, 1, 1, 1 << 31, 0), Err(libc::ENOMSG));
        assert_eq!(send(&ro, 0x21, 1, 0, 1 << 31, 0), Err(libc::ENOMSG));
        assert_eq!(send(&ro, 0x21, 1, 2, 1 << 31, 0), Err(libc::EINVAL));
        // Firmware "invalid input" for an unknown APIC id.
        assert_eq!(send(&ro, 0x0A, 1, 1, 0xFFFF, 0), Err(libc::EINVAL));
        assert_eq!(send(&ro, 0x0A, 1, 1, apic, 0), Ok(message(0x0A, 1, 1, 3700, 0).args));
    }

    #[test]
    fn only_response_sz_words_are_written_back() {
        let m = machine(Profile::Milan1p, Mode::Static);
        let ro = Driver::new(m, AccessMode::ReadOnly);
        let mut msg = message(id::TEST, 1, 1, 41, 0);
        msg.args[1] = 0xDEAD;
        ro.send(&mut msg).unwrap();
        assert_eq!(&msg.args[..2], &[42, 0xDEAD]);
        let mut bytes = message(id::GET_PROTO_VER, 0, 1, 0, 0).to_bytes();
        ro.ioctl_bytes(&mut bytes).unwrap();
        assert_eq!(HsmpMessage::from_bytes(&bytes).args[0], 4);
    }

    #[test]
    fn rapl_messages_answer_only_where_the_firmware_has_them() {
        for profile in Profile::ALL {
            let m = machine(profile, Mode::Static);
            let Ok(transport) = m.hsmp_opener().open() else {
                assert_eq!(profile, Profile::Rome1p);
                continue;
            };
            let apic = m.topology().cores[0].apic_id;
            let mut units = message(id::GET_RAPL_UNITS, 0, 1, 0, 0);
            let mut counter = message(id::GET_RAPL_CORE_COUNTER, 1, 2, apic, 0);
            let results = (transport.send(&mut units), transport.send(&mut counter));
            if profile.spec().rapl_messages {
                assert_eq!(results, (Ok(()), Ok(())), "{profile}");
                assert_eq!((units.args[0] >> 8) & 0x1f, 16);
                assert_eq!(
                    u64::from(counter.args[0]) | u64::from(counter.args[1]) << 32,
                    1000 << 16
                );
            } else {
                assert_eq!(results, (Err(libc::ENOMSG), Err(libc::ENOMSG)), "{profile}");
            }
        }
    }

    #[test]
    fn rome_has_no_hsmp_device_but_has_the_energy_msrs() {
        let m = machine(Profile::Rome1p, Mode::Static);
        assert_eq!(m.hsmp_opener().open().map(|_| ()), Err(libc::ENOENT));
        assert_eq!(m.open_hsmp(AccessMode::ReadWrite).map(|_| ()), Err(libc::ENOENT));
        let msr = m.msr_opener().open(5).unwrap();
        assert_eq!(msr.read(MSR_CORE_ENERGY_STAT), Ok(6000 << 16));
        assert_eq!(msr.read(MSR_RAPL_PWR_UNIT).map(|u| (u >> 8) & 0x1f), Ok(16));
        assert_eq!(msr.read(0x10), Err(libc::EIO));
    }

    #[test]
    fn msr_opener_knows_only_the_machine_s_online_cpus() {
        let mut spec = Profile::Milan1p.spec();
        spec.offline_cpus = vec![3];
        let m = Machine::new(spec, FirmwareConfig::new(Mode::Static));
        let opener = m.msr_opener();
        assert!(opener.open(127).is_ok());
        assert_eq!(opener.open(128).map(|_| ()), Err(libc::ENOENT));
        assert_eq!(opener.open(3).map(|_| ()), Err(libc::ENXIO));
        m.set_faults(Faults { msr_open: Some(libc::EPERM), ..Faults::default() });
        assert_eq!(opener.open(0).map(|_| ()), Err(libc::EPERM));
    }

    #[test]
    fn an_msr_read_of_a_cpu_taken_offline_is_enxio_and_the_same_transport_reads_once_it_is_back() {
        let m = machine(Profile::Milan1p, Mode::Static);
        let opener = m.msr_opener();
        let (msr, other) = (opener.open(7).unwrap(), opener.open(8).unwrap());
        let value = msr.read(MSR_CORE_ENERGY_STAT).unwrap();
        m.update_faults(|f| {
            f.offline.insert(7);
        });
        assert_eq!(msr.read(MSR_CORE_ENERGY_STAT), Err(libc::ENXIO));
        assert_eq!(msr.read(MSR_RAPL_PWR_UNIT), Err(libc::ENXIO));
        assert_eq!(opener.open(7).map(|_| ()), Err(libc::ENXIO));
        assert!(other.read(MSR_CORE_ENERGY_STAT).is_ok(), "CPU 8 went offline too");
        m.update_faults(|f| {
            f.offline.remove(&7);
        });
        assert_eq!(msr.read(MSR_CORE_ENERGY_STAT), Ok(value));
        assert!(opener.open(7).is_ok());
    }

    #[test]
    fn live_energy_is_monotonic_and_grows_through_both_transports() {
        let clock = ManualClock::at(Duration::from_secs(1));
        let config = FirmwareConfig {
            clock: Clock::Manual(clock.clone()),
            ..FirmwareConfig::new(Mode::Live)
        };
        let m = Machine::new(Profile::Turin2p.spec(), config);
        let hsmp = m.hsmp_opener().open().unwrap();
        let core = m.topology().cores[200].clone();
        let msr = m.msr_opener().open(core.cpu).unwrap();
        let read = || {
            let mut msg =
                message(id::GET_RAPL_CORE_COUNTER, 1, 2, core.apic_id, core.socket as u16);
            hsmp.send(&mut msg).unwrap();
            (
                u64::from(msg.args[0]) | u64::from(msg.args[1]) << 32,
                msr.read(MSR_CORE_ENERGY_STAT).unwrap(),
            )
        };
        let mut last = read();
        for _ in 0..5 {
            clock.advance(Duration::from_millis(10));
            let now = read();
            assert!(now.0 > last.0, "{last:?} -> {now:?}");
            // The MSR is the low half of the same count, read at the same instant.
            assert_eq!(now.1, now.0 & 0xFFFF_FFFF, "{now:?}");
            last = now;
        }
    }

    #[test]
    fn msr_counter_wraps_at_2_pow_32_while_hsmp_counter_keeps_counting() {
        let mut spec = Profile::Turin2p.spec();
        spec.sockets = 1;
        let m = Machine::new(spec, FirmwareConfig::new(Mode::Static));
        let core = m.topology().cores[7].clone();
        let msr = m.msr_opener().open(core.cpu).unwrap();
        let hsmp = m.hsmp_opener().open().unwrap();
        m.firmware().set_energy_counter(0, core.core, u64::from(u32::MAX) - 99).unwrap();
        assert_eq!(msr.read(MSR_CORE_ENERGY_STAT), Ok(u64::from(u32::MAX) - 99));
        m.firmware().advance_energy(0, core.core, 200.0 / 65536.0).unwrap();
        assert_eq!(msr.read(MSR_CORE_ENERGY_STAT), Ok(100));
        let mut msg = message(id::GET_RAPL_CORE_COUNTER, 1, 2, core.apic_id, 0);
        hsmp.send(&mut msg).unwrap();
        assert_eq!((msg.args[0], msg.args[1]), (100, 1));
    }

    #[test]
    fn static_mode_answers_the_same_on_two_machines() {
        // Two machines at different instants of their day: static values do not follow time.
        let at = |s| FirmwareConfig {
            clock: Clock::Manual(ManualClock::at(Duration::from_secs(s))),
            ..FirmwareConfig::new(Mode::Static)
        };
        let a = Machine::new(Profile::Genoa2p.spec(), at(5));
        let b = Machine::new(Profile::Genoa2p.spec(), at(1300));
        let (da, db) = (a.hsmp_opener().open().unwrap(), b.hsmp_opener().open().unwrap());
        for core in &a.topology().cores {
            let mut ma = message(id::GET_BOOST_LIMIT, 1, 1, core.apic_id, core.socket as u16);
            let mut mb = ma;
            da.send(&mut ma).unwrap();
            db.send(&mut mb).unwrap();
            assert_eq!(ma, mb);
            let (ra, rb) = (
                a.msr_opener().open(core.cpu).unwrap().read(MSR_CORE_ENERGY_STAT),
                b.msr_opener().open(core.cpu).unwrap().read(MSR_CORE_ENERGY_STAT),
            );
            assert_eq!(ra, rb);
        }
    }

    #[test]
    fn counters_count_per_message_id() {
        let m = machine(Profile::Genoa2p, Mode::Static);
        let ro = m.open_hsmp(AccessMode::ReadOnly).unwrap();
        assert!(ro.opened_read_only());
        let apic = m.topology().cores[0].apic_id;
        for _ in 0..3 {
            send(&ro, id::GET_BOOST_LIMIT, 1, 1, apic, 0).unwrap();
        }
        send(&ro, id::GET_PROTO_VER, 0, 1, 0, 1).unwrap();
        // Refused by the driver: counted as an ioctl, never reaches a mailbox.
        assert_eq!(send(&ro, id::GET_BOOST_LIMIT, 0, 1, apic, 0), Err(libc::EINVAL));
        // Reaches the mailbox, refused by the firmware.
        assert_eq!(send(&ro, id::GET_RAPL_UNITS, 0, 1, 0, 0), Err(libc::ENOMSG));
        let c = m.counters();
        assert_eq!((c.ioctls(0x0A), c.mailbox(0x0A)), (4, 3));
        assert_eq!((c.ioctls(0x03), c.mailbox(0x03)), (1, 1));
        assert_eq!((c.ioctls(0x30), c.mailbox(0x30)), (1, 1));
        assert_eq!(c.mailbox(0x31), 0);
        assert_eq!(c.mailbox_total(), 5);
        let msr = m.msr_opener().open(0).unwrap();
        msr.read(MSR_CORE_ENERGY_STAT).unwrap();
        msr.read(MSR_CORE_ENERGY_STAT).unwrap();
        assert_eq!(c.msr_reads(MSR_CORE_ENERGY_STAT), 2);
        assert_eq!(c.msr_reads(MSR_RAPL_PWR_UNIT), 0);
        c.reset();
        assert_eq!((c.ioctls(0x0A), c.mailbox_total()), (0, 0));
    }

    #[test]
    fn injected_faults() {
        let m = machine(Profile::Genoa2p, Mode::Static);
        let ro = m.open_hsmp(AccessMode::ReadOnly).unwrap();
        let cores = m.topology().cores.clone();
        let mut faults = Faults::default();
        faults.unsupported.insert(FaultGroup::Prochot);
        faults.errno.insert((FaultGroup::BoostLimit, Target::Apic(cores[1].apic_id)), libc::EIO);
        faults.errno.insert((FaultGroup::Msr, Target::Cpu(cores[2].cpu)), libc::EIO);
        m.set_faults(faults);
        assert_eq!(send(&ro, id::GET_PROC_HOT, 0, 1, 0, 0), Err(libc::ENOMSG));
        assert_eq!(send(&ro, id::GET_PROC_HOT, 0, 1, 0, 1), Err(libc::ENOMSG));
        assert!(send(&ro, id::GET_BOOST_LIMIT, 1, 1, cores[0].apic_id, 0).is_ok());
        assert_eq!(send(&ro, id::GET_BOOST_LIMIT, 1, 1, cores[1].apic_id, 0), Err(libc::EIO));
        let msr = |cpu| m.msr_opener().open(cpu).unwrap().read(MSR_CORE_ENERGY_STAT);
        assert!(msr(cores[1].cpu).is_ok());
        assert_eq!(msr(cores[2].cpu), Err(libc::EIO));

        m.update_faults(|f| {
            f.unsupported.insert(FaultGroup::Msr);
            f.hsmp_open = Some(libc::EACCES);
        });
        assert_eq!(msr(cores[1].cpu), Err(libc::EIO));
        assert_eq!(m.hsmp_opener().open().map(|_| ()), Err(libc::EACCES));
        // An already open descriptor keeps working.
        assert!(send(&ro, id::GET_PROTO_VER, 0, 1, 0, 0).is_ok());
    }

    #[test]
    fn frequency_limit_faults_target_the_socket_and_the_core_s_apic_id() {
        let m = machine(Profile::Genoa2p, Mode::Static);
        let ro = m.open_hsmp(AccessMode::ReadOnly).unwrap();
        let cores = m.topology().cores.clone();
        let mut faults = Faults::default();
        faults.errno.insert((FaultGroup::FrequencyLimit, Target::Socket(1)), libc::EIO);
        let core = (FaultGroup::CoreFrequencyLimit, Target::Apic(cores[1].apic_id));
        faults.errno.insert(core, libc::EBUSY);
        m.set_faults(faults);
        assert!(send(&ro, id::GET_SOCKET_FREQ_LIMIT, 0, 1, 0, 0).is_ok());
        assert_eq!(send(&ro, id::GET_SOCKET_FREQ_LIMIT, 0, 1, 0, 1), Err(libc::EIO));
        assert!(send(&ro, id::GET_CCLK_CORE_LIMIT, 1, 1, cores[0].apic_id, 0).is_ok());
        assert_eq!(send(&ro, id::GET_CCLK_CORE_LIMIT, 1, 1, cores[1].apic_id, 0), Err(libc::EBUSY));
        m.update_faults(|f| {
            f.unsupported.insert(FaultGroup::FrequencyLimit);
        });
        assert_eq!(send(&ro, id::GET_SOCKET_FREQ_LIMIT, 0, 1, 0, 0), Err(libc::ENOMSG));
    }

    #[test]
    fn wedged_socket_times_out_after_the_driver_limit_while_the_other_answers() {
        let m = machine(Profile::Genoa2p, Mode::Static);
        let ro = m.open_hsmp(AccessMode::ReadOnly).unwrap();
        m.update_faults(|f| {
            f.wedged_sockets = BTreeSet::from([1]);
            f.driver_timeout = Duration::from_millis(30);
        });
        let start = Instant::now();
        assert_eq!(send(&ro, id::GET_PROTO_VER, 0, 1, 0, 1), Err(libc::ETIMEDOUT));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(send(&ro, id::GET_PROTO_VER, 0, 1, 0, 0).is_ok());
        // A latency beyond the timeout is a timeout too.
        m.update_faults(|f| {
            f.wedged_sockets.clear();
            f.latency = Duration::from_millis(40);
        });
        assert_eq!(send(&ro, id::GET_PROTO_VER, 0, 1, 0, 0), Err(libc::ETIMEDOUT));
        m.set_faults(Faults::default());
        assert!(send(&ro, id::GET_PROTO_VER, 0, 1, 0, 0).is_ok());
    }

    #[test]
    fn a_held_socket_serializes_its_messages_while_the_other_socket_answers() {
        let m = machine(Profile::Genoa2p, Mode::Static);
        let ro = m.open_hsmp(AccessMode::ReadOnly).unwrap();
        let gate = Duration::from_secs(10);
        m.hold_socket(1);
        std::thread::scope(|s| {
            let first = s.spawn(|| send(&ro, id::GET_PROTO_VER, 0, 1, 0, 1));
            m.wait_mailbox(1, gate, |b| b.entered == 1).unwrap();
            let second = s.spawn(|| send(&ro, id::GET_PROTO_VER, 0, 1, 0, 1));
            m.wait_mailbox(1, gate, |b| b.pending == 2).unwrap();
            // Socket 0 is not behind socket 1's lock.
            assert_eq!(send(&ro, id::GET_PROTO_VER, 0, 1, 0, 0).map(|w| w[0]), Ok(5));
            assert_eq!(m.mailbox(1).entered, 1, "the second message waits for the lock");
            m.release_socket(1);
            assert!(first.join().unwrap().is_ok());
            assert!(second.join().unwrap().is_ok());
        });
        let after = MailboxState { held: false, pending: 0, max_pending: 2, entered: 2 };
        assert_eq!(m.mailbox(1), after);
        assert_eq!(m.mailbox(0).max_pending, 1);
    }

    #[test]
    fn machine_gives_its_topology() {
        let mut spec: MachineSpec = Profile::Genoa2p.spec();
        spec.smt = false;
        let m = Machine::new(spec.clone(), FirmwareConfig::new(Mode::Live));
        assert_eq!(m.topology(), &spec.topology());
        assert_eq!(m.spec(), &spec);
    }
}
