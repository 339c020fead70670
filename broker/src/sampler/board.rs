//! One socket's board: for every item of the socket the latest read (its value, when it was
//! read and through which source) and whether a request still wants it read, the requests
//! waiting on the socket, and the plan its worker reads with.
//!
//! The board is where requests meet: a request takes every item whose latest read is recent
//! enough for it and marks the others wanted; the socket's worker reads wanted items one
//! message at a time and hands each read to every waiting request it is recent enough for.
//! So requests that overlap share messages, a busy socket queues its requests (the wanted
//! marks are the one pending reading, merged), and no item is read more often than the
//! freshness bound lets a request reuse it.

use super::{Clock, Plan, lock};
use amd_hsmp_proto::{Families, Family, ItemError, PerFamily, Scope, Topology, Value};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One item as a socket worker delivers it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Item {
    pub(super) family: Family,
    /// The index into [`Topology::cores`] or [`Topology::sockets`] ([`Family::scope`]).
    pub(super) index: usize,
    pub(super) value: Result<Value, ItemError>,
}

/// Every item of a request, per family aligned with the topology; an item not read (yet) is
/// [`ItemError::DeadlineExceeded`].
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Items {
    pub(super) values: PerFamily<Vec<Result<Value, ItemError>>>,
    /// When each item's read began, aligned with `values`; `None` until it is read.
    pub(super) at: PerFamily<Vec<Option<Instant>>>,
}

impl Items {
    fn unread(topology: &Topology) -> Items {
        const UNREAD: ItemError = ItemError::DeadlineExceeded;
        let len = |family: Family| match family.scope() {
            Scope::Core => topology.cores.len(),
            Scope::Socket => topology.sockets.len(),
        };
        Items {
            values: PerFamily::from_fn(|family| vec![Err(UNREAD); len(family)]),
            at: PerFamily::from_fn(|family| vec![None; len(family)]),
        }
    }

    fn put(&mut self, item: Item, at: Instant) {
        if let Some(slot) = self.values[item.family].get_mut(item.index) {
            *slot = item.value;
        }
        if let Some(slot) = self.at[item.family].get_mut(item.index) {
            *slot = Some(at);
        }
    }
}

/// Where a value was read from: a request takes only values of the source its plan chose, so
/// a device reopened or an energy source switched never mixes two counters in one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The HSMP device with this id ([`super::OpenDevice::id`]).
    Hsmp(u64),
    /// The fallback counters the broker keeps (perf or MSR; only one is chosen at start-up).
    Counters,
}

/// What an item of a socket is, by its position on the board: the families read per socket
/// first, then for each family read per core every core's item, in [`Family::ALL`] order (the
/// order the worker reads them in: PROCHOT, the frequency limit, every core's energy, every
/// core's boost limit, every core's frequency limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Kind {
    pub(super) family: Family,
    /// The position of the core among the socket's cores; 0 for a family read per socket.
    pub(super) position: usize,
}

/// The position of every item of a socket with `cores` cores.
fn kinds(cores: usize) -> impl Iterator<Item = Kind> {
    let of = |scope: Scope| Family::ALL.into_iter().filter(move |f| f.scope() == scope);
    let socket = of(Scope::Socket).map(|family| Kind { family, position: 0 });
    let core = of(Scope::Core)
        .flat_map(move |family| (0..cores).map(move |position| Kind { family, position }));
    socket.chain(core)
}

/// A read of one item.
#[derive(Debug, Clone, Copy)]
pub(super) struct Read {
    pub(super) item: Item,
    /// When the read began (before its message was sent): the value is no older.
    pub(super) at: Instant,
    pub(super) source: Source,
}

/// Requests want an item read.
#[derive(Debug, Clone, Copy)]
struct Want {
    /// The latest deadline of the requests that want it: nothing is sent for it after this.
    until: Instant,
    /// The latest [`Waiter::not_before`] of them: a read begun no earlier serves them all.
    not_before: Instant,
}

#[derive(Debug)]
struct Cell {
    kind: Kind,
    last: Option<Read>,
    want: Option<Want>,
}

/// A request waiting on this socket, and which of the socket's items it still needs.
#[derive(Debug)]
struct Entry {
    waiter: Arc<Waiter>,
    needs: Vec<bool>,
}

#[derive(Debug)]
struct State {
    cells: Vec<Cell>,
    waiters: Vec<Entry>,
    /// Per family, the plan of the latest request that wanted it read: what the worker reads
    /// that family's items with.
    plans: PerFamily<Option<Arc<Plan>>>,
    /// Where the worker looks for the next wanted item: it goes round the items in order, so
    /// a socket slower than the requests still reads every item in turn.
    cursor: usize,
    /// The position of the worker's last task; `None` after it was idle.
    last: Option<usize>,
    /// The worker is between taking an item and storing its read.
    reading: bool,
    /// The sampler is gone: the worker ends.
    stopped: bool,
}

impl State {
    fn take_next(&mut self, now: Instant) -> Option<Task> {
        let len = self.cells.len();
        for step in 0..len {
            let position = (self.cursor + step) % len;
            let Some(cell) = self.cells.get_mut(position) else { continue };
            let Some(want) = cell.want else { continue };
            let family = cell.kind.family;
            let plan = self.plans[family].clone();
            let Some(plan) = plan.filter(|p| p.source(family).is_some()) else {
                cell.want = None;
                continue;
            };
            if want.until <= now {
                cell.want = None;
                continue;
            }
            let kind = cell.kind;
            let new_round = self.last.is_none_or(|last| position < last);
            self.last = Some(position);
            self.cursor = position;
            self.reading = true;
            return Some(Task { position, kind, plan, new_round });
        }
        None
    }
}

/// One socket's board, shared by the requests and the socket's worker.
#[derive(Debug)]
pub(super) struct Board {
    state: Mutex<State>,
    /// Wakes the worker when an item is wanted (or the sampler is dropped).
    work: Condvar,
    clock: Arc<dyn Clock>,
}

/// What the worker is to read next.
#[derive(Debug)]
pub(super) struct Task {
    pub(super) position: usize,
    pub(super) kind: Kind,
    pub(super) plan: Arc<Plan>,
    /// The worker was idle or went round the items since its last task.
    pub(super) new_round: bool,
}

impl Board {
    pub(super) fn new(cores: usize, clock: Arc<dyn Clock>) -> Board {
        let cells = kinds(cores).map(|kind| Cell { kind, last: None, want: None }).collect();
        Board {
            state: Mutex::new(State {
                cells,
                waiters: Vec::new(),
                plans: PerFamily::default(),
                cursor: 0,
                last: None,
                reading: false,
                stopped: false,
            }),
            work: Condvar::new(),
            clock,
        }
    }

    /// Now, on the sampler's clock.
    pub(super) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Gives `waiter` every item of this socket it asks for whose latest read is recent
    /// enough, and marks the others wanted until its deadline. `true` if something is wanted
    /// (the worker must run).
    pub(super) fn register(&self, waiter: &Arc<Waiter>) -> bool {
        let mut state = lock(&self.state);
        let mut needs = Vec::with_capacity(state.cells.len());
        let mut needed = 0;
        let wants = waiter.deadline > self.now();
        for cell in &mut state.cells {
            let Some(source) = waiter.source(cell.kind.family) else {
                needs.push(false);
                continue;
            };
            match cell.last {
                Some(read) if waiter.accepts(&read, source) => {
                    waiter.deliver(&read, false);
                    needs.push(false);
                }
                _ if !wants => needs.push(false),
                _ => {
                    let (until, not_before) = (waiter.deadline, waiter.not_before);
                    let want = cell.want.get_or_insert(Want { until, not_before });
                    want.until = want.until.max(until);
                    want.not_before = want.not_before.max(not_before);
                    needs.push(true);
                    needed += 1;
                }
            }
        }
        if needed == 0 {
            return false;
        }
        waiter.expect(needed);
        for family in Family::ALL {
            if waiter.source(family).is_some() {
                state.plans[family] = Some(Arc::clone(&waiter.plan));
            }
        }
        state.waiters.push(Entry { waiter: Arc::clone(waiter), needs });
        self.work.notify_one();
        true
    }

    /// Takes `waiter` off the board; what it still wanted is read only if another request
    /// still waiting wants it too: each such item's want is made again from the requests left,
    /// so a request that ends early (its peer hung up) holds no read after it.
    pub(super) fn deregister(&self, waiter: &Arc<Waiter>) {
        let mut state = lock(&self.state);
        let state = &mut *state;
        let Some(at) = state.waiters.iter().position(|e| Arc::ptr_eq(&e.waiter, waiter)) else {
            return;
        };
        let gone = state.waiters.remove(at);
        for (position, _) in gone.needs.iter().enumerate().filter(|(_, need)| **need) {
            let Some(cell) = state.cells.get_mut(position) else { continue };
            let left = state.waiters.iter().filter(|e| e.needs.get(position) == Some(&true));
            cell.want = left.fold(None, |want: Option<Want>, e| {
                let (until, not_before) = (e.waiter.deadline, e.waiter.not_before);
                Some(want.map_or(Want { until, not_before }, |w| Want {
                    until: w.until.max(until),
                    not_before: w.not_before.max(not_before),
                }))
            });
        }
    }

    /// Waits for the next wanted item whose deadline has not passed, in order from where the
    /// worker left off; `None` when the sampler is gone. Wants whose deadlines have passed,
    /// or that the current plan does not read, are dropped on the way.
    pub(super) fn next(&self) -> Option<Task> {
        let mut state = lock(&self.state);
        state.reading = false;
        loop {
            if state.stopped {
                return None;
            }
            if let Some(task) = state.take_next(self.now()) {
                return Some(task);
            }
            state.last = None;
            state.cursor = 0;
            state = self.work.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Stores the read of the item at `position` and hands it to every waiting request it is
    /// recent enough for; the item stays wanted only for requests that arrived too late for
    /// it (after the read began by more than the freshness bound).
    pub(super) fn store(&self, position: usize, read: Read) {
        let mut state = lock(&self.state);
        let state = &mut *state;
        let Some(cell) = state.cells.get_mut(position) else { return };
        cell.last = Some(read);
        if cell.want.is_some_and(|w| w.not_before <= read.at) {
            cell.want = None;
        }
        state.cursor = position + 1;
        for entry in &mut state.waiters {
            let Some(need) = entry.needs.get_mut(position) else { continue };
            if *need && entry.waiter.accepts(&read, read.source) {
                *need = false;
                entry.waiter.deliver(&read, true);
            }
        }
    }

    /// Drops the want of the item at `position`, which the worker cannot read.
    pub(super) fn skip(&self, position: usize) {
        let mut state = lock(&self.state);
        if let Some(cell) = state.cells.get_mut(position) {
            cell.want = None;
        }
        state.cursor = position + 1;
    }

    /// Ends the worker.
    pub(super) fn stop(&self) {
        lock(&self.state).stopped = true;
        self.work.notify_all();
    }

    /// How many requests wait on this board.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        lock(&self.state).waiters.len()
    }

    /// Nothing is wanted and the worker is not reading.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        let now = self.now();
        let state = lock(&self.state);
        !state.reading && state.cells.iter().all(|c| c.want.is_none_or(|w| w.until <= now))
    }
}

/// How often a waiting request asks whether its requester is still there: the longest a
/// request whose peer hung up keeps its connection slot and its wants.
pub(super) const GONE_CHECK: Duration = Duration::from_millis(50);

/// One request: what it asks for, from when its values must be, and what it has been given.
#[derive(Debug)]
pub(super) struct Waiter {
    /// When the request arrived.
    arrived: Instant,
    /// The oldest read it takes: `max_age` before it arrived.
    not_before: Instant,
    deadline: Instant,
    what: Families,
    pub(super) plan: Arc<Plan>,
    state: Mutex<WaiterState>,
    /// Signalled when the request has every item it waits for.
    complete: std::sync::Condvar,
}

#[derive(Debug)]
struct WaiterState {
    items: Items,
    /// Items still expected from the socket workers.
    remaining: usize,
    /// When the oldest value it was given was read.
    oldest: Option<Instant>,
}

impl Waiter {
    pub(super) fn new(
        what: Families,
        plan: Arc<Plan>,
        arrived: Instant,
        max_age: Duration,
        deadline: Instant,
        topology: &Topology,
    ) -> Waiter {
        Waiter {
            arrived,
            // Only in the first moments after boot can this not be represented; then nothing
            // read before the request arrived is taken.
            not_before: arrived.checked_sub(max_age).unwrap_or(arrived),
            deadline,
            what,
            plan,
            state: Mutex::new(WaiterState {
                items: Items::unread(topology),
                remaining: 0,
                oldest: None,
            }),
            complete: std::sync::Condvar::new(),
        }
    }

    /// The source the request takes `family` from; `None` when it does not have it read (not
    /// asked for, or answered without a read).
    fn source(&self, family: Family) -> Option<Source> {
        if self.what.contains(family) { self.plan.source(family) } else { None }
    }

    fn accepts(&self, read: &Read, source: Source) -> bool {
        read.source == source && read.at >= self.not_before
    }

    fn expect(&self, items: usize) {
        lock(&self.state).remaining += items;
    }

    fn deliver(&self, read: &Read, expected: bool) {
        let mut state = lock(&self.state);
        state.items.put(read.item, read.at);
        state.oldest = Some(state.oldest.map_or(read.at, |o| o.min(read.at)));
        if expected {
            state.remaining = state.remaining.saturating_sub(1);
            if state.remaining == 0 {
                self.complete.notify_all();
            }
        }
    }

    /// Waits until the request has every item it waits for, its deadline has passed or
    /// `gone` says nobody waits for the answer any more (asked every [`GONE_CHECK`] while
    /// waiting), and returns its items with how long before its arrival the oldest of them was
    /// read.
    pub(super) fn wait(&self, clock: &dyn Clock, gone: &dyn Fn() -> bool) -> (Items, Duration) {
        let mut state = lock(&self.state);
        while state.remaining > 0 {
            let left = self.deadline.saturating_duration_since(clock.now());
            if left.is_zero() {
                break;
            }
            let (guard, waited) = self
                .complete
                .wait_timeout(state, left.min(GONE_CHECK))
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state = guard;
            if waited.timed_out() && state.remaining > 0 && gone() {
                break;
            }
        }
        let oldest =
            state.oldest.map_or(Duration::ZERO, |o| self.arrived.saturating_duration_since(o));
        (state.items.clone(), oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker reads a socket's items in board order: what is read per socket first, then
    /// each family read per core, core by core (the message order the mailbox sees).
    #[test]
    fn a_board_holds_the_socket_families_then_each_core_family_core_by_core() {
        let kind = |family, position| Kind { family, position };
        let want = [
            kind(Family::Prochot, 0),
            kind(Family::FrequencyLimit, 0),
            kind(Family::PackageEnergy, 0),
            kind(Family::CoreEnergy, 0),
            kind(Family::CoreEnergy, 1),
            kind(Family::BoostLimit, 0),
            kind(Family::BoostLimit, 1),
            kind(Family::CoreFrequencyLimit, 0),
            kind(Family::CoreFrequencyLimit, 1),
        ];
        assert_eq!(kinds(2).collect::<Vec<_>>(), want);
    }
}
