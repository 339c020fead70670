//! The raw counters behind the guest's `power_core` PMU (`tests/vm/power-core/power_core_sim.c`,
//! the stand-in for the kernel's `arch/x86/events/rapl.c`, which a TCG guest never has): a table
//! in the spare space of each socket's mailbox window, kept current by the responder from the
//! same simulator that answers the HSMP `GET_RAPL_CORE_COUNTER` message.
//!
//! At [`TABLE_OFFSET`] of socket `s`'s window: `u32` [`TABLE_MAGIC`], `u32` cores, then per core
//! `c` (the guest's core id within its package, which is how the responder maps APIC ids) a
//! `u32` raw counter (the low 32 bits of the simulator's counter, what
//! `MSR_AMD_CORE_ENERGY_STATUS` holds) and a `u32` energy status unit.
//!
//! Each word is written by its own `pwrite` and only when it differs from the file's, so the
//! guest reads a stable table between two changes the test makes.

use super::mailbox::{WINDOW_BASE, WINDOW_SIZE};
use anyhow::{Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Where the table starts in a socket's window: past the mailbox registers (0x10934 to 0x109FF),
/// within the window's 1 MiB.
pub const TABLE_OFFSET: u64 = 0x8_0000;
/// The table's first word, "PWRC" in memory; the module refuses to load without it.
pub const TABLE_MAGIC: u32 = 0x4352_5750;

/// The words of one socket's table: its cores' 64-bit counters (in core id order) and their
/// energy status unit.
pub fn table(counters: &[u64], esu: u8) -> Vec<u32> {
    let cores = u32::try_from(counters.len()).unwrap_or(u32::MAX);
    let mut words = vec![TABLE_MAGIC, cores];
    for counter in counters {
        // The low 32 bits, as the MSR holds them: truncation is the point.
        words.push(*counter as u32);
        words.push(u32::from(esu));
    }
    words
}

/// Writes `words` at socket `socket`'s table in the guest RAM file, each word only where the
/// file holds another value.
pub fn sync(ram: &File, socket: u32, words: &[u32]) -> Result<()> {
    let at = WINDOW_BASE + u64::from(socket) * WINDOW_SIZE + TABLE_OFFSET;
    let mut now = vec![0u8; 4 * words.len()];
    ram.read_exact_at(&mut now, at).context("cannot read the power_core table")?;
    for ((i, word), old) in (0u64..).zip(words).zip(now.chunks_exact(4)) {
        if old != word.to_le_bytes() {
            ram.write_all_at(&word.to_le_bytes(), at + 4 * i)
                .context("cannot write the power_core table")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_each_core_s_low_32_bits_and_unit_where_the_module_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let ram = File::options().read(true).write(true).create_new(true).open(&path).unwrap();
        ram.set_len(WINDOW_BASE + 2 * WINDOW_SIZE).unwrap();
        sync(&ram, 1, &table(&[1, 2, (7 << 32) | 0xDEAD_BEEF], 16)).unwrap();
        let word = |socket: u64, off: u64| {
            let mut b = [0u8; 4];
            let at = WINDOW_BASE + socket * WINDOW_SIZE + TABLE_OFFSET + off;
            ram.read_exact_at(&mut b, at).unwrap();
            u32::from_le_bytes(b)
        };
        // The module's layout: magic, cores, then 8 bytes per core from offset 8.
        assert_eq!(word(1, 0), TABLE_MAGIC);
        assert_eq!(&word(1, 0).to_le_bytes(), b"PWRC");
        assert_eq!(word(1, 4), 3);
        assert_eq!(word(1, 8 + 2 * 8), 0xDEAD_BEEF);
        assert_eq!(word(1, 8 + 2 * 8 + 4), 16);
        assert_eq!(word(1, 8), 1);
        // Socket 0's window is untouched until its own table is written.
        assert_eq!(word(0, 0), 0);
    }
}
