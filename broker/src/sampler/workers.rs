//! The socket workers: one thread per socket for the life of the sampler, each fed through a
//! bounded channel and taking a reading only while idle, each sending its socket's messages
//! back to back and checking the reading's end before every one.

use super::reading::{Item, Reading};
use super::{EnergyReader, OpenDevice, lock};
use amd_hsmp_device::messages;
use amd_hsmp_proto::{Energy, ItemError, Topology};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// One socket's share of a reading: its position and id, and its cores as (index into the
/// topology, APIC id).
#[derive(Debug)]
struct SocketJob {
    index: usize,
    socket: u32,
    cores: Vec<(usize, u32)>,
}

/// One socket's worker.
#[derive(Debug)]
struct Slot {
    job: Arc<SocketJob>,
    /// Set from the hand-over of a reading until the worker has finished it: a busy worker
    /// (still inside a mailbox message, say) takes no new reading.
    busy: Arc<AtomicBool>,
    /// The worker's channel and thread; `None` until the first reading starts the thread.
    tx: Mutex<Option<(SyncSender<Arc<Reading>>, ThreadId)>>,
}

/// The workers of every socket, aligned with [`Topology::sockets`].
#[derive(Debug)]
pub(super) struct Workers {
    slots: Vec<Slot>,
}

impl Workers {
    /// The workers of `topology`'s sockets; their threads start with their first reading.
    pub(super) fn new(topology: &Topology) -> Workers {
        let slots = topology
            .sockets
            .iter()
            .enumerate()
            .map(|(index, &socket)| {
                let cores = topology.cores.iter().enumerate();
                let cores = cores.filter(|(_, c)| c.socket == socket).map(|(i, c)| (i, c.apic_id));
                Slot {
                    job: Arc::new(SocketJob { index, socket, cores: cores.collect() }),
                    busy: Arc::default(),
                    tx: Mutex::new(None),
                }
            })
            .collect();
        Workers { slots }
    }

    /// Waits until no worker is busy; panics after `timeout`.
    #[cfg(test)]
    pub(super) fn wait_idle(&self, timeout: std::time::Duration) {
        let end = std::time::Instant::now() + timeout;
        while self.slots.iter().any(|s| s.busy.load(Ordering::Acquire)) {
            assert!(std::time::Instant::now() < end, "a socket worker stayed busy");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Each socket's worker thread, if started.
    #[cfg(test)]
    pub(super) fn thread_ids(&self) -> Vec<Option<ThreadId>> {
        self.slots.iter().map(|s| lock(&s.tx).as_ref().map(|(_, id)| *id)).collect()
    }

    /// Hands `reading` to the worker of socket `index` if it is idle. `false` if it is still
    /// busy with an earlier reading, or its thread cannot be started: the socket's items then
    /// stay unread.
    pub(super) fn dispatch(&self, index: usize, reading: &Arc<Reading>) -> bool {
        let Some(slot) = self.slots.get(index) else { return false };
        if slot.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        reading.start_worker();
        let mut tx = lock(&slot.tx);
        // A second attempt only if the thread had ended.
        for _ in 0..2 {
            if tx.is_none() {
                match spawn(slot) {
                    Ok(sender) => *tx = Some(sender),
                    Err(error) => {
                        tracing::warn!(socket = slot.job.socket, %error, "cannot start a socket worker");
                        break;
                    }
                }
            }
            let Some((sender, _)) = tx.as_ref() else { break };
            match sender.try_send(Arc::clone(reading)) {
                Ok(()) => return true,
                // The thread has ended (a worker does not panic, but if one did): start another.
                Err(TrySendError::Disconnected(_)) => *tx = None,
                // Cannot happen while `busy` is ours: a worker clears it only after taking its
                // reading out of the channel and finishing it.
                Err(TrySendError::Full(_)) => break,
            }
        }
        slot.busy.store(false, Ordering::Release);
        reading.worker_done();
        false
    }
}

fn spawn(slot: &Slot) -> std::io::Result<(SyncSender<Arc<Reading>>, ThreadId)> {
    // Capacity 1: the reading handed over while the worker is idle, never a queue.
    let (tx, rx) = sync_channel(1);
    let (job, busy) = (Arc::clone(&slot.job), Arc::clone(&slot.busy));
    let thread = std::thread::Builder::new()
        .name(format!("hsmp-socket-{}", job.socket))
        .spawn(move || work(&job, &busy, rx))?;
    Ok((tx, thread.thread().id()))
}

/// The worker's life: one reading after another until the sampler is dropped.
fn work(job: &SocketJob, busy: &AtomicBool, readings: Receiver<Arc<Reading>>) {
    for reading in readings {
        let _turn = Turn { busy, reading: &reading };
        read_socket(job, &reading);
    }
}

/// The end of a worker's turn on a reading, even by unwinding: the worker is idle again before
/// the requesters learn that it has finished, so a request that follows can hand it the next
/// reading.
struct Turn<'a> {
    busy: &'a AtomicBool,
    reading: &'a Reading,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.busy.store(false, Ordering::Release);
        self.reading.worker_done();
    }
}

/// One socket's messages, back to back: the probes a just-opened device still needs, then
/// PROCHOT, energy and boost limits. Each item is delivered as soon as it is read.
fn read_socket(job: &SocketJob, reading: &Reading) {
    let plan = &reading.plan;
    let (s, socket) = (job.index, job.socket);
    let mut usable = Ok(());
    if let Ok(device) = &plan.device {
        let t = device.transport.as_ref();
        if !device.is_confirmed(s) {
            match send(reading, s, Ok(()), || messages::proto_version(t, socket)) {
                Ok(version) => device.confirm(s, version),
                Err(ItemError::DeadlineExceeded) => return,
                Err(error) => {
                    reading.version_failed(s, error);
                    usable = Err(error);
                }
            }
        }
        if plan.probe_esu && usable.is_ok() && device.esu(s).is_none() {
            match send(reading, s, usable, || messages::rapl_esu(t, socket)) {
                Err(ItemError::DeadlineExceeded) => return,
                esu => device.set_esu(s, esu),
            }
        }
    }
    if let Ok(device) = &plan.prochot {
        let r = send(reading, s, usable, || messages::prochot(device.transport.as_ref(), socket));
        reading.put(Item::Prochot(s, r));
    }
    match &plan.energy {
        Ok(EnergyReader::Hsmp(device)) => {
            let t = device.transport.as_ref();
            let esu = socket_esu(reading, device, s, socket, usable);
            for &(i, apic_id) in &job.cores {
                let r = send(reading, s, usable, || {
                    let esu = esu?;
                    let counter = messages::rapl_core_counter(t, socket, apic_id)?;
                    Ok(Energy { counter, esu })
                });
                reading.put(Item::Energy(i, r));
            }
        }
        Ok(EnergyReader::Msr(msr)) => {
            for &(i, _) in &job.cores {
                let r =
                    if reading.in_time() { msr.read(i) } else { Err(ItemError::DeadlineExceeded) };
                reading.put(Item::Energy(i, r));
            }
        }
        Err(_) => {}
    }
    if let Ok(device) = &plan.boost_limit {
        let t = device.transport.as_ref();
        for &(i, apic_id) in &job.cores {
            let r = send(reading, s, usable, || messages::boost_limit_mhz(t, socket, apic_id));
            reading.put(Item::BoostLimit(i, r));
        }
    }
}

/// Sends one HSMP message for socket `s` unless the reading's end has passed
/// ([`ItemError::DeadlineExceeded`]) or the socket is not usable (its probe's error), and
/// notes how it ended.
fn send<T>(
    reading: &Reading,
    s: usize,
    usable: Result<(), ItemError>,
    message: impl FnOnce() -> Result<T, ItemError>,
) -> Result<T, ItemError> {
    if !reading.in_time() {
        return Err(ItemError::DeadlineExceeded);
    }
    usable?;
    let result = message();
    reading.heard(s, &result);
    result
}

/// The energy unit of socket `s`, asking the firmware again if it failed other than with
/// `Unsupported`.
fn socket_esu(
    reading: &Reading,
    device: &OpenDevice,
    s: usize,
    socket: u32,
    usable: Result<(), ItemError>,
) -> Result<u8, ItemError> {
    match device.esu(s) {
        Some(Ok(esu)) => Ok(esu),
        Some(Err(ItemError::Unsupported)) => Err(ItemError::Unsupported),
        _ => {
            let t = device.transport.as_ref();
            let esu = send(reading, s, usable, || messages::rapl_esu(t, socket));
            if esu != Err(ItemError::DeadlineExceeded) {
                device.set_esu(s, esu);
            }
            esu
        }
    }
}
