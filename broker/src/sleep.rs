//! Sleeping that survives signals, stops, freezes and ptrace, and never panics.
//!
//! `std::thread::sleep` asserts that `nanosleep` fails only with `EINTR`; any other errno (a
//! seccomp filter refusing `restart_syscall` after a `SIGSTOP`, say) panics the thread. The
//! broker sleeps through [`sleep`] instead, which retries interruptions until the monotonic
//! deadline and returns any other failure to its caller.

use std::io;
use std::time::{Duration, Instant};

/// Sleeps for `duration` of monotonic time (time stopped or frozen counts), resuming after every
/// interruption. Fails only if the kernel refuses to sleep at all.
pub(crate) fn sleep(duration: Duration) -> io::Result<()> {
    sleep_until(Instant::now() + duration)
}

/// Sleeps until `deadline`, resuming after every interruption.
pub(crate) fn sleep_until(deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        let request = rustix::thread::Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        match rustix::thread::nanosleep(&request) {
            rustix::thread::NanosleepRelativeResult::Ok
            | rustix::thread::NanosleepRelativeResult::Interrupted(_) => {}
            rustix::thread::NanosleepRelativeResult::Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_at_least_the_duration() {
        let started = Instant::now();
        sleep(Duration::from_millis(30)).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_deadline_in_the_past_returns_at_once() {
        sleep_until(Instant::now() - Duration::from_millis(1)).unwrap();
        sleep(Duration::ZERO).unwrap();
    }
}
