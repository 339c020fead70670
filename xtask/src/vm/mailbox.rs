//! The SMU mailbox registers of one emulated socket, read and written through the file that
//! backs the guest's RAM.
//!
//! QEMU maps `/dev/shm/<name>` `MAP_SHARED` as guest RAM (`memory-backend-file,share=on`); on
//! `q35` a low guest-physical address is the same offset in that file. The guest's `amd_hsmp`
//! driver `ioremap`s the window its ACPI device declares and accesses the registers with
//! 32-bit `ioread32`/`iowrite32`; under TCG those are plain loads and stores to the shared
//! pages. This module reaches the same page-cache pages with `pread`/`pwrite` on the same file,
//! so it needs no `mmap` and no `unsafe`: the kernel copies to and from the very pages QEMU has
//! mapped.
//!
//! Ordering: x86 keeps stores in program order (TSO) and a string copy's stores are not
//! reordered with later stores, so one `pwrite` is visible before the next one. Every register
//! is written by its own call, in the order the driver expects: reply words, then the message
//! id cleared, then the status last. A torn 32-bit write cannot be observed as a wrong status:
//! the driver zeroes the status register before each message and every status code fits in
//! the low byte.

use anyhow::{Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{Ordering, fence};

/// Guest-physical base of socket 0's window; socket `n`'s is `WINDOW_BASE + n * WINDOW_SIZE`.
/// Kept out of the guest's allocator with `memmap=` and declared by the SSDT.
pub const WINDOW_BASE: u64 = 0x1F00_0000;
/// Size of one socket's window (the SSDT's `Memory32Fixed` length).
pub const WINDOW_SIZE: u64 = 0x10_0000;
/// `MsgIdOffset` of the SSDT's `_DSD`: the message id register.
pub const MSG_ID_OFFSET: u64 = 0x10934;
/// `MsgRspOffset`: the status (response) register.
pub const MSG_RSP_OFFSET: u64 = 0x10980;
/// `MsgArgOffset`: the eight argument / reply words.
pub const MSG_ARG_OFFSET: u64 = 0x109E0;

/// The registers of one socket's mailbox.
#[derive(Debug)]
pub struct Mailbox {
    file: File,
    base: u64,
}

impl Mailbox {
    /// Opens the RAM file `ram` for socket `socket`'s window.
    pub fn open(ram: &Path, socket: u32) -> Result<Mailbox> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(ram)
            .with_context(|| format!("cannot open the guest RAM file {}", ram.display()))?;
        Ok(Mailbox { file, base: WINDOW_BASE + u64::from(socket) * WINDOW_SIZE })
    }

    fn read(&self, offset: u64) -> Result<u32> {
        let mut word = [0u8; 4];
        self.file
            .read_exact_at(&mut word, self.base + offset)
            .with_context(|| format!("cannot read mailbox register {offset:#x}"))?;
        Ok(u32::from_le_bytes(word))
    }

    fn write(&self, offset: u64, value: u32) -> Result<()> {
        self.file
            .write_all_at(&value.to_le_bytes(), self.base + offset)
            .with_context(|| format!("cannot write mailbox register {offset:#x}"))
    }

    /// The message id register: non-zero while a message waits for an answer.
    pub fn message_id(&self) -> Result<u32> {
        self.read(MSG_ID_OFFSET)
    }

    /// The eight argument words the driver wrote.
    pub fn args(&self) -> Result<[u32; 8]> {
        let mut bytes = [0u8; 32];
        self.file
            .read_exact_at(&mut bytes, self.base + MSG_ARG_OFFSET)
            .context("cannot read the mailbox arguments")?;
        let mut args = [0u32; 8];
        for (word, chunk) in args.iter_mut().zip(bytes.chunks_exact(4)) {
            *word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        Ok(args)
    }

    /// Answers the pending message as the SMU does: the reply words (if any) into the argument
    /// registers, the message id cleared, then `status` last.
    pub fn reply(&self, status: u32, words: Option<&[u32; 8]>) -> Result<()> {
        if let Some(words) = words {
            for (i, word) in (0u64..).zip(words) {
                self.write(MSG_ARG_OFFSET + 4 * i, *word)?;
            }
        }
        self.write(MSG_ID_OFFSET, 0)?;
        // The status is what the driver polls for; everything above must be visible first.
        fence(Ordering::Release);
        self.write(MSG_RSP_OFFSET, status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_writes_words_clears_the_id_and_sets_the_status() {
        let dir = tempfile::tempdir().unwrap();
        let ram = dir.path().join("ram");
        // Sparse, as QEMU's RAM file is until the guest touches it.
        File::create(&ram).unwrap().set_len(WINDOW_BASE + 2 * WINDOW_SIZE).unwrap();
        let socket1 = Mailbox::open(&ram, 1).unwrap();
        let raw = File::options().read(true).write(true).open(&ram).unwrap();
        let at = |off: u64| WINDOW_BASE + WINDOW_SIZE + off;
        raw.write_all_at(&0x0Au32.to_le_bytes(), at(MSG_ID_OFFSET)).unwrap();
        raw.write_all_at(&7u32.to_le_bytes(), at(MSG_ARG_OFFSET)).unwrap();
        assert_eq!(socket1.message_id().unwrap(), 0x0A);
        assert_eq!(socket1.args().unwrap()[0], 7);
        // Socket 0's window is elsewhere and stays idle.
        assert_eq!(Mailbox::open(&ram, 0).unwrap().message_id().unwrap(), 0);

        socket1.reply(1, Some(&[3100, 2, 0, 0, 0, 0, 0, 0])).unwrap();
        let word = |off: u64| {
            let mut b = [0u8; 4];
            raw.read_exact_at(&mut b, at(off)).unwrap();
            u32::from_le_bytes(b)
        };
        assert_eq!(word(MSG_ID_OFFSET), 0);
        assert_eq!(word(MSG_RSP_OFFSET), 1);
        assert_eq!(word(MSG_ARG_OFFSET), 3100);
        assert_eq!(word(MSG_ARG_OFFSET + 4), 2);
    }
}
