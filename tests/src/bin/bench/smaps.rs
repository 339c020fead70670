//! Where a process's resident memory is, from `/proc/PID/smaps`: its mapped files (the binary's
//! and the libraries' code, read-only data and relocated data), its heap (the `[heap]` arena
//! and anonymous mappings: other malloc arenas, large allocations), its thread stacks (the main
//! thread's `[stack]`, and each anonymous mapping holding a thread's stack pointer as
//! `/proc/PID/task/TID/syscall` gives it) and the rest (`[vdso]`, `[vvar]` and the like).
//!
//! The kernel keeps the peak of the whole resident set (`VmHWM`), not of its parts: the split
//! is of the resident set when it is read, right after the series whose peak it sits beside.
//! Neither process returns memory between scrapes but what glibc trims from the top of its
//! heap, so the two stay close (the report gives both).

use anyhow::{Context, Result};
use serde::Serialize;

/// Resident memory by kind, KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Split {
    /// File-backed mappings: the binary, libc, the dynamic loader, libgcc_s.
    pub files_kib: u64,
    /// `[heap]` and anonymous mappings that hold no thread's stack.
    pub heap_kib: u64,
    /// `[stack]` and the anonymous mappings holding a thread's stack pointer.
    pub stacks_kib: u64,
    /// Everything else (`[vdso]`, `[vvar]`).
    pub rest_kib: u64,
}

/// The split of process `pid`'s resident set now.
pub fn of(pid: u32) -> Result<Split> {
    let path = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    Ok(split(&text, &stack_pointers(pid)))
}

/// Each thread's user stack pointer, where the thread is stopped in or outside a system call
/// (`/proc/PID/task/TID/syscall`: the call's number and arguments, or `-1`, then the stack
/// pointer and the program counter; `running` for a thread on a CPU, which has none to give).
fn stack_pointers(pid: u32) -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("syscall")).ok())
        .filter_map(|line| parse_stack_pointer(&line))
        .collect()
}

/// The stack pointer of a `syscall` line: its second-to-last field, in hex.
pub fn parse_stack_pointer(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 3 {
        return None;
    }
    let sp = fields[fields.len() - 2].strip_prefix("0x")?;
    u64::from_str_radix(sp, 16).ok()
}

/// The split of an `smaps` text, with the threads' stack pointers.
pub fn split(smaps: &str, stack_pointers: &[u64]) -> Split {
    let mut out = Split::default();
    let mut kind: Option<Kind> = None;
    for line in smaps.lines() {
        if let Some(k) = mapping(line, stack_pointers) {
            kind = Some(k);
        } else if let Some(rss) = line.strip_prefix("Rss:") {
            let kib: u64 = rss.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            match kind {
                Some(Kind::Files) => out.files_kib += kib,
                Some(Kind::Heap) => out.heap_kib += kib,
                Some(Kind::Stacks) => out.stacks_kib += kib,
                Some(Kind::Rest) | None => out.rest_kib += kib,
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Files,
    Heap,
    Stacks,
    Rest,
}

/// The kind of the mapping a header line (`start-end perms offset dev inode [name]`) opens;
/// `None` for any other line.
fn mapping(line: &str, stack_pointers: &[u64]) -> Option<Kind> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let _offset = fields.next()?;
    let _device = fields.next()?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let name = fields.collect::<Vec<_>>().join(" ");
    let holds_stack = stack_pointers.iter().any(|&sp| (start..end).contains(&sp));
    Some(match name.as_str() {
        "[stack]" => Kind::Stacks,
        "[heap]" => Kind::Heap,
        _ if inode != 0 => Kind::Files,
        _ if holds_stack => Kind::Stacks,
        "" => Kind::Heap,
        n if n.starts_with("[anon") => Kind::Heap,
        _ => Kind::Rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0100000 r-xp 00001000 fd:01 1234                       /usr/bin/amd-hsmp-broker
Size:               1024 kB
Rss:                 900 kB
55d0a1000000-55d0a1040000 rw-p 00000000 00:00 0                          [heap]
Rss:                 200 kB
7f0000000000-7f0000001000 ---p 00000000 00:00 0 
Rss:                   0 kB
7f0000001000-7f0000201000 rw-p 00000000 00:00 0 
Rss:                  16 kB
7f0000300000-7f0000400000 rw-p 00000000 00:00 0 
Rss:                 132 kB
7f1000000000-7f1000200000 r-xp 00000000 fd:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1100 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  32 kB
7ffc00100000-7ffc00102000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   4 kB
";

    #[test]
    fn resident_pages_are_split_into_files_heap_stacks_and_the_rest() {
        // One thread's stack pointer is in the 2 MiB mapping after the guard page.
        let split = split(SMAPS, &[0x7f00_0010_0000]);
        assert_eq!(
            split,
            Split { files_kib: 2000, heap_kib: 332, stacks_kib: 48, rest_kib: 4 },
            "the anonymous mapping without a stack pointer is heap (another malloc arena)"
        );
    }

    #[test]
    fn an_anonymous_mapping_is_heap_when_no_thread_is_known_to_stand_in_it() {
        let split = split(SMAPS, &[]);
        assert_eq!((split.heap_kib, split.stacks_kib), (348, 32));
    }

    #[test]
    fn a_threads_stack_pointer_is_the_second_to_last_field_of_its_syscall_line() {
        let blocked = "232 0x3 0x7ffd1 0x80 0xffffffff 0x0 0x8 0x7f00002007d8 0x7f1000012345\n";
        assert_eq!(parse_stack_pointer(blocked), Some(0x7f00_0020_07d8));
        assert_eq!(
            parse_stack_pointer("-1 0x7ffc00020000 0x55d0a0001234\n"),
            Some(0x7ffc_0002_0000)
        );
        assert_eq!(parse_stack_pointer("running\n"), None);
        assert_eq!(parse_stack_pointer(""), None);
    }
}
