//! The socket workers: one thread per socket for the life of the sampler, each reading its
//! socket's wanted items from the socket's [`Board`] one message at a time, back to back,
//! and checking that the item is still wanted (its requests' deadlines not passed) before
//! every message.

use super::board::{Board, Item, Read, Source, Task, Waiter};
use super::family::{self, Reading};
use super::{Clock, OpenDevice, Reader, lock};
use amd_hsmp_device::messages;
use amd_hsmp_proto::{ItemError, Scope, Topology, Value};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// One socket's place in the topology: its position and id, and its cores as (index into the
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
    board: Arc<Board>,
    /// The worker's thread; `None` until the first request starts it.
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The workers of every socket, aligned with [`Topology::sockets`].
#[derive(Debug)]
pub(super) struct Workers {
    slots: Vec<Slot>,
}

impl Workers {
    /// The workers of `topology`'s sockets; their threads start with their first request.
    pub(super) fn new(topology: &Topology, clock: Arc<dyn Clock>) -> Workers {
        let slots = topology
            .sockets
            .iter()
            .enumerate()
            .map(|(index, &socket)| {
                let cores = topology.cores.iter().enumerate();
                let cores = cores.filter(|(_, c)| c.socket == socket).map(|(i, c)| (i, c.apic_id));
                let cores: Vec<_> = cores.collect();
                Slot {
                    board: Arc::new(Board::new(cores.len(), Arc::clone(&clock))),
                    job: Arc::new(SocketJob { index, socket, cores }),
                    thread: Mutex::new(None),
                }
            })
            .collect();
        Workers { slots }
    }

    /// Puts `waiter` on every socket's board, starting a socket's worker when it has
    /// something to read and no thread yet (or its thread has ended).
    pub(super) fn register(&self, waiter: &Arc<Waiter>) {
        for slot in &self.slots {
            if slot.board.register(waiter) {
                slot.ensure_running();
            }
        }
    }

    /// Takes `waiter` off every board.
    pub(super) fn deregister(&self, waiter: &Arc<Waiter>) {
        for slot in &self.slots {
            slot.board.deregister(waiter);
        }
    }

    /// Waits until no socket has anything wanted or a read in progress; panics after
    /// `timeout`.
    #[cfg(test)]
    pub(super) fn wait_idle(&self, timeout: std::time::Duration) {
        let end = std::time::Instant::now() + timeout;
        while self.slots.iter().any(|s| !s.board.is_idle()) {
            assert!(std::time::Instant::now() < end, "a socket worker stayed busy");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// How many requests wait on each socket's board.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.board.waiting()).collect()
    }

    /// Each socket's worker thread, if started.
    #[cfg(test)]
    pub(super) fn thread_ids(&self) -> Vec<Option<std::thread::ThreadId>> {
        self.slots.iter().map(|s| lock(&s.thread).as_ref().map(|t| t.thread().id())).collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for slot in &self.slots {
            slot.board.stop();
        }
    }
}

impl Slot {
    fn ensure_running(&self) {
        let mut thread = lock(&self.thread);
        // A worker does not panic, but if one did, another takes its place.
        if thread.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (job, board) = (Arc::clone(&self.job), Arc::clone(&self.board));
        let spawned = std::thread::Builder::new()
            .name(format!("hsmp-socket-{}", job.socket))
            .spawn(move || work(&job, &board));
        match spawned {
            Ok(handle) => *thread = Some(handle),
            // The socket's items stay unread until a later request starts a worker.
            Err(error) => {
                tracing::warn!(socket = self.job.socket, %error, "cannot start a socket worker")
            }
        }
    }
}

/// What a worker learnt about its socket in the current round (from idle, or since it last
/// went round its items): the probes are sent at most once a round.
#[derive(Debug, Default)]
struct Round {
    /// The device this round talks to ([`OpenDevice::id`]).
    device: Option<u64>,
    /// Whether the socket answered its version probe (`Ok` also when confirmed before).
    usable: Option<Result<(), ItemError>>,
    /// `GET_RAPL_UNITS` was asked in this round.
    esu_asked: bool,
}

/// What one step of the worker did.
enum Step {
    /// Sent a probe the item needs first; the item is taken again.
    Probed,
    Read(Item, Source),
    /// The plan does not read the item (the board hands out only items it does).
    Skip,
}

/// The worker's life: one wanted item after another until the sampler is dropped.
fn work(job: &SocketJob, board: &Board) {
    let mut round = Round::default();
    while let Some(task) = board.next() {
        if task.new_round {
            round = Round::default();
        }
        let at = board.now();
        match step(job, &task, &mut round) {
            Step::Probed => {}
            Step::Read(item, source) => board.store(task.position, Read { item, at, source }),
            Step::Skip => board.skip(task.position),
        }
    }
}

/// Reads the item of `task`: first the probes a just-opened device still needs (one message
/// each, then the item is taken again, so its deadline is checked before every message).
fn step(job: &SocketJob, task: &Task, round: &mut Round) -> Step {
    let plan = &task.plan;
    let (s, socket) = (job.index, job.socket);
    if let Ok(device) = &plan.device {
        if round.device != Some(device.id) {
            *round = Round { device: Some(device.id), ..Round::default() };
        }
        let t = device.transport.as_ref();
        match round.usable {
            None if device.is_confirmed(s) => round.usable = Some(Ok(())),
            None => {
                let version = heard(device, s, messages::proto_version(t, socket));
                round.usable = Some(match version {
                    Ok(version) => {
                        device.confirm(s, version);
                        Ok(())
                    }
                    Err(error) => {
                        device.version_failed(s, error);
                        Err(error)
                    }
                });
                return Step::Probed;
            }
            Some(_) => {}
        }
        let usable = round.usable.is_some_and(|u| u.is_ok());
        if plan.probe_esu && usable && device.esu(s).is_none() && !round.esu_asked {
            return ask_esu(device, job, round);
        }
    }
    let usable = round.usable.unwrap_or(Ok(()));
    let family = task.kind.family;
    // The item's index into the topology, and the APIC id of its core.
    let (index, apic_id) = match family.scope() {
        Scope::Socket => (s, 0),
        Scope::Core => match job.cores.get(task.kind.position) {
            Some(&core) => core,
            None => return Step::Skip,
        },
    };
    let read = |value| Item { family, index, value };
    let reading = match (family::reading(family), &plan.reads[family]) {
        (Reading::Energy, Ok(Reader::Hsmp(_))) => Reading::Counter(family::CORE_COUNTER),
        (reading, _) => reading,
    };
    match (reading, &plan.reads[family]) {
        (_, Err(_)) => Step::Skip,
        (Reading::Message(read_item), Ok(Reader::Hsmp(device))) => {
            let t = device.transport.as_ref();
            let r = usable.and_then(|()| heard(device, s, read_item(t, socket, apic_id)));
            Step::Read(read(r), Source::Hsmp(device.id))
        }
        (Reading::Counter(read_counter), Ok(Reader::Hsmp(device))) => {
            let esu = match device.esu(s) {
                Some(Ok(esu)) => Ok(esu),
                Some(Err(ItemError::Unsupported)) => Err(ItemError::Unsupported),
                _ if usable.is_ok() && !round.esu_asked => return ask_esu(device, job, round),
                esu => esu.unwrap_or(Err(ItemError::DeadlineExceeded)),
            };
            let t = device.transport.as_ref();
            let r = usable
                .and(esu)
                .and_then(|esu| heard(device, s, read_counter(t, socket, apic_id, esu)));
            Step::Read(read(r), Source::Hsmp(device.id))
        }
        (Reading::Energy, Ok(Reader::Counters(counters))) => {
            Step::Read(read(counters.read(index).map(Value::Energy)), Source::Counters)
        }
        // The fallback counters read core energy only.
        (Reading::Message(_) | Reading::Counter(_), Ok(Reader::Counters(_))) => Step::Skip,
        // Energy through HSMP became a counter above.
        (Reading::Energy, Ok(Reader::Hsmp(_))) => Step::Skip,
    }
}

/// Asks the socket's energy status unit (`GET_RAPL_UNITS`), once a round, and keeps the answer
/// on the device.
fn ask_esu(device: &OpenDevice, job: &SocketJob, round: &mut Round) -> Step {
    round.esu_asked = true;
    let esu = messages::rapl_esu(device.transport.as_ref(), job.socket);
    device.set_esu(job.index, heard(device, job.index, esu));
    Step::Probed
}

/// Notes how a message to socket `s` ended, for the device's health, and passes it on.
fn heard<T>(device: &OpenDevice, s: usize, result: Result<T, ItemError>) -> Result<T, ItemError> {
    device.heard(s, &result);
    result
}
