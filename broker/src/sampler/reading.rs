//! One reading shared by the requests that come while it runs: its plan, the items read so far,
//! the latest deadline of its requesters, and what the socket workers learnt about the device.

use super::{Plan, lock};
use amd_hsmp_device::errno::means_device_gone;
use amd_hsmp_proto::{Energy, Families, ItemError, Topology};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// One item as a socket worker delivers it; the index is into [`Topology::cores`] (energy,
/// boost limit) or [`Topology::sockets`] (PROCHOT).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Item {
    Prochot(usize, Result<bool, ItemError>),
    Energy(usize, Result<Energy, ItemError>),
    BoostLimit(usize, Result<u32, ItemError>),
}

/// Every item of a reading, aligned with the topology; an item not read (yet) is
/// [`ItemError::DeadlineExceeded`].
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Items {
    pub(super) energy: Vec<Result<Energy, ItemError>>,
    pub(super) boost_limit: Vec<Result<u32, ItemError>>,
    pub(super) prochot: Vec<Result<bool, ItemError>>,
}

impl Items {
    fn unread(topology: &Topology) -> Items {
        const UNREAD: ItemError = ItemError::DeadlineExceeded;
        Items {
            energy: vec![Err(UNREAD); topology.cores.len()],
            boost_limit: vec![Err(UNREAD); topology.cores.len()],
            prochot: vec![Err(UNREAD); topology.sockets.len()],
        }
    }

    fn put(&mut self, item: Item) {
        fn set<T>(items: &mut [T], index: usize, value: T) {
            if let Some(slot) = items.get_mut(index) {
                *slot = value;
            }
        }
        match item {
            Item::Prochot(i, r) => set(&mut self.prochot, i, r),
            Item::Energy(i, r) => set(&mut self.energy, i, r),
            Item::BoostLimit(i, r) => set(&mut self.boost_limit, i, r),
        }
    }
}

/// What one socket's messages in this reading said about the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Heard {
    /// No message was answered or failed yet.
    #[default]
    Nothing,
    /// Some message was answered, or failed in a way a working device fails.
    Alive,
    /// Every message failed as if the device were gone.
    Gone(ItemError),
}

#[derive(Debug, Clone, Copy, Default)]
struct SocketOutcome {
    heard: Heard,
    /// The socket's `GET_PROTO_VER` probe failed with this error.
    version_failed: Option<ItemError>,
}

#[derive(Debug)]
struct State {
    items: Items,
    /// The latest deadline of the requests sharing the reading: no message after it.
    end: Instant,
    /// Workers still reading for it.
    running: usize,
    /// Aligned with [`Topology::sockets`].
    sockets: Vec<SocketOutcome>,
}

/// A reading: planned once, read by the socket workers, answered to each requester at its
/// own deadline.
#[derive(Debug)]
pub(super) struct Reading {
    what: Families,
    pub(super) plan: Plan,
    state: Mutex<State>,
    /// Signalled when a worker finishes.
    finished: Condvar,
}

impl Reading {
    pub(super) fn new(what: Families, plan: Plan, deadline: Instant, topology: &Topology) -> Self {
        Reading {
            what,
            plan,
            state: Mutex::new(State {
                items: Items::unread(topology),
                end: deadline,
                running: 0,
                sockets: vec![SocketOutcome::default(); topology.sockets.len()],
            }),
            finished: Condvar::new(),
        }
    }

    /// Joins a request for `what` until `deadline` to this reading if it still runs and reads
    /// at least `what`; the reading then runs until the later of its end and `deadline`.
    pub(super) fn join(&self, what: Families, deadline: Instant) -> bool {
        let mut state = lock(&self.state);
        let joined = state.running > 0 && Instant::now() < state.end && covers(self.what, what);
        if joined {
            state.end = state.end.max(deadline);
        }
        joined
    }

    /// Waits until every worker has finished or `deadline` has passed, and returns the items
    /// read by then.
    pub(super) fn wait(&self, deadline: Instant) -> Items {
        let mut state = lock(&self.state);
        while state.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .finished
                .wait_timeout(state, left)
                .map_or_else(|e| e.into_inner().0, |(guard, _)| guard);
        }
        state.items.clone()
    }

    /// A worker takes the reading; call before handing it over.
    pub(super) fn start_worker(&self) {
        lock(&self.state).running += 1;
    }

    /// A worker is done with the reading (or never got it).
    pub(super) fn worker_done(&self) {
        let mut state = lock(&self.state);
        state.running = state.running.saturating_sub(1);
        self.finished.notify_all();
    }

    /// Whether a message may still be sent for this reading.
    pub(super) fn in_time(&self) -> bool {
        Instant::now() < lock(&self.state).end
    }

    pub(super) fn put(&self, item: Item) {
        lock(&self.state).items.put(item);
    }

    /// Notes how a message sent to socket `index` ended.
    pub(super) fn heard<T>(&self, index: usize, result: &Result<T, ItemError>) {
        let mut state = lock(&self.state);
        let Some(socket) = state.sockets.get_mut(index) else { return };
        socket.heard = match (socket.heard, result) {
            (Heard::Alive, _) => Heard::Alive,
            (_, Err(e)) if means_device_gone(*e) => Heard::Gone(*e),
            (_, _) => Heard::Alive,
        };
    }

    /// Socket `index` failed its version probe with `error`.
    pub(super) fn version_failed(&self, index: usize, error: ItemError) {
        if let Some(socket) = lock(&self.state).sockets.get_mut(index) {
            socket.version_failed = Some(error);
        }
    }

    /// The error of the version probe if it failed on every socket.
    pub(super) fn version_failure(&self) -> Option<ItemError> {
        let state = lock(&self.state);
        let mut errors = state.sockets.iter().map(|s| s.version_failed);
        let first = errors.next().flatten()?;
        errors.all(|e| e.is_some()).then_some(first)
    }

    /// If the reading is complete and every socket answered every message as a device that is
    /// gone, one of those errors.
    pub(super) fn device_gone(&self) -> Option<ItemError> {
        let state = lock(&self.state);
        if state.running > 0 {
            return None;
        }
        let mut gone = state.sockets.iter().map(|s| match s.heard {
            Heard::Gone(e) => Some(e),
            Heard::Nothing | Heard::Alive => None,
        });
        let first = gone.next().flatten()?;
        gone.all(|e| e.is_some()).then_some(first)
    }
}

/// Whether a reading of `reading` answers a request for `request`.
fn covers(reading: Families, request: Families) -> bool {
    (reading.core_energy || !request.core_energy)
        && (reading.boost_limit || !request.boost_limit)
        && (reading.prochot || !request.prochot)
}
