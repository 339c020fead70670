//! `struct hsmp_message` and `HSMP_IOCTL_CMD`, laid out exactly as the kernel's uapi header.

/// Maximum number of argument/response words (`HSMP_MAX_MSG_LEN`).
pub const HSMP_MAX_MSG_LEN: usize = 8;

/// `_IOWR(0xF8, 0, struct hsmp_message)`: direction 3 (read|write) << 30, size 44 << 16,
/// type 0xF8 << 8, number 0.
pub const HSMP_IOCTL_CMD: u32 = (3 << 30) | ((size_of::<HsmpMessage>() as u32) << 16) | (0xF8 << 8);

/// `struct hsmp_message` under `#pragma pack(4)`: 44 bytes, 2 of them tail padding.
///
/// ```c
/// struct hsmp_message {
///     __u32 msg_id;
///     __u16 num_args;
///     __u16 response_sz;
///     __u32 args[HSMP_MAX_MSG_LEN];
///     __u16 sock_ind;
/// };
/// ```
#[repr(C, align(4))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HsmpMessage {
    /// Message id (`HSMP_GET_*`).
    pub msg_id: u32,
    /// Number of argument words the message takes.
    pub num_args: u16,
    /// Number of response words the message returns.
    pub response_sz: u16,
    /// Arguments in, response out.
    pub args: [u32; HSMP_MAX_MSG_LEN],
    /// Socket index.
    pub sock_ind: u16,
}

impl HsmpMessage {
    /// Size of the struct as the kernel sees it.
    pub const SIZE: usize = 44;

    /// The message as the kernel copies it in and out: 44 bytes, native (little) endian,
    /// padding zeroed.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let fields = (self.msg_id.to_le_bytes().into_iter())
            .chain(self.num_args.to_le_bytes())
            .chain(self.response_sz.to_le_bytes())
            .chain(self.args.iter().flat_map(|a| a.to_le_bytes()))
            .chain(self.sock_ind.to_le_bytes());
        // 42 bytes of fields, then the two bytes of padding left at zero.
        let mut b = [0u8; Self::SIZE];
        for (byte, field) in b.iter_mut().zip(fields) {
            *byte = field;
        }
        b
    }

    /// Parses the 44-byte kernel representation (padding ignored).
    pub fn from_bytes(b: &[u8; Self::SIZE]) -> Self {
        let [m0, m1, m2, m3, n0, n1, r0, r1, words @ .., s0, s1, _, _] = *b;
        let words: [u8; 4 * HSMP_MAX_MSG_LEN] = words;
        let mut args = [0u32; HSMP_MAX_MSG_LEN];
        for (a, word) in args.iter_mut().zip(words.as_chunks::<4>().0) {
            *a = u32::from_le_bytes(*word);
        }
        HsmpMessage {
            msg_id: u32::from_le_bytes([m0, m1, m2, m3]),
            num_args: u16::from_le_bytes([n0, n1]),
            response_sz: u16::from_le_bytes([r0, r1]),
            args,
            sock_ind: u16::from_le_bytes([s0, s1]),
        }
    }
}

// The kernel copies exactly this many bytes; a layout change would corrupt its memory.
const _: () = assert!(size_of::<HsmpMessage>() == HsmpMessage::SIZE);
const _: () = assert!(align_of::<HsmpMessage>() == 4);

/// `PERF_FORMAT_TOTAL_TIME_ENABLED`: a read also returns how long the event was enabled (ns).
pub const PERF_FORMAT_TOTAL_TIME_ENABLED: u64 = 1 << 0;
/// `PERF_FORMAT_TOTAL_TIME_RUNNING`: a read also returns how long the event was counting (ns).
pub const PERF_FORMAT_TOTAL_TIME_RUNNING: u64 = 1 << 1;
/// `PERF_FLAG_FD_CLOEXEC`: the new descriptor is close-on-exec.
pub const PERF_FLAG_FD_CLOEXEC: u64 = 1 << 3;

/// The first published layout of `struct perf_event_attr` (`PERF_ATTR_SIZE_VER0`, 64 bytes),
/// every field this exporter sets. The kernel takes an older, shorter struct as if its missing
/// tail were zero, so this one stays valid on every kernel.
///
/// ```c
/// struct perf_event_attr {
///     __u32 type;  __u32 size;  __u64 config;
///     __u64 sample_period;  __u64 sample_type;  __u64 read_format;
///     __u64 flags;   /* disabled:1, inherit:1, pinned:1, exclusive:1, exclude_user:1, ... */
///     __u32 wakeup_events;  __u32 bp_type;  __u64 config1;
/// };
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerfEventAttr {
    /// The PMU's type number (its sysfs `type` file).
    pub kind: u32,
    /// `size_of::<PerfEventAttr>()`: the layout version the kernel reads.
    pub size: u32,
    /// The event, encoded as the PMU's `format` files say.
    pub config: u64,
    /// 0: counting, not sampling.
    pub sample_period: u64,
    /// 0: no sample records.
    pub sample_type: u64,
    /// What a `read(2)` returns (`PERF_FORMAT_*`).
    pub read_format: u64,
    /// The bit fields; 0 is an enabled, non-inherited event counting user and kernel.
    pub flags: u64,
    /// 0.
    pub wakeup_events: u32,
    /// 0.
    pub bp_type: u32,
    /// 0.
    pub config1: u64,
}

impl PerfEventAttr {
    /// `PERF_ATTR_SIZE_VER0`.
    pub const SIZE: usize = 64;

    /// A counting event of `config` on the PMU of type `kind`, read with its enabled and
    /// running times.
    pub fn counting(kind: u32, config: u64) -> PerfEventAttr {
        PerfEventAttr {
            kind,
            size: Self::SIZE as u32,
            config,
            read_format: PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING,
            ..PerfEventAttr::default()
        }
    }
}

// The kernel reads `size` bytes from the pointer it is given.
const _: () = assert!(size_of::<PerfEventAttr>() == PerfEventAttr::SIZE);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layout_matches_the_kernel_struct() {
        assert_eq!(size_of::<HsmpMessage>(), 44);
        assert_eq!(align_of::<HsmpMessage>(), 4);
        assert_eq!(offset_of!(HsmpMessage, msg_id), 0);
        assert_eq!(offset_of!(HsmpMessage, num_args), 4);
        assert_eq!(offset_of!(HsmpMessage, response_sz), 6);
        assert_eq!(offset_of!(HsmpMessage, args), 8);
        assert_eq!(offset_of!(HsmpMessage, sock_ind), 40);
    }

    #[test]
    fn perf_event_attr_is_the_kernel_s_first_layout() {
        assert_eq!(size_of::<PerfEventAttr>(), 64);
        assert_eq!(offset_of!(PerfEventAttr, config), 8);
        assert_eq!(offset_of!(PerfEventAttr, read_format), 32);
        assert_eq!(offset_of!(PerfEventAttr, flags), 40);
        assert_eq!(offset_of!(PerfEventAttr, config1), 56);
        let attr = PerfEventAttr::counting(11, 1);
        assert_eq!((attr.kind, attr.size, attr.config, attr.read_format), (11, 64, 1, 3));
        assert_eq!((attr.flags, attr.sample_period), (0, 0));
    }

    #[test]
    fn ioctl_number_is_iowr_f8_0_of_44_bytes() {
        assert_eq!(HSMP_IOCTL_CMD, 0xC02C_F800);
    }

    #[test]
    fn bytes_sit_at_the_kernel_offsets_and_round_trip() {
        let msg = HsmpMessage {
            msg_id: 0x31,
            num_args: 1,
            response_sz: 2,
            args: [0x0102_0304, 2, 3, 4, 5, 6, 7, 0xffff_ffff],
            sock_ind: 0x0a0b,
        };
        let b = msg.to_bytes();
        assert_eq!(b[0..4], [0x31, 0, 0, 0]);
        assert_eq!(b[4..8], [1, 0, 2, 0]);
        assert_eq!(b[8..12], [0x04, 0x03, 0x02, 0x01]);
        assert_eq!(b[36..40], [0xff; 4]);
        assert_eq!(b[40..44], [0x0b, 0x0a, 0, 0]);
        assert_eq!(HsmpMessage::from_bytes(&b), msg);
    }

    #[test]
    fn from_bytes_ignores_the_tail_padding() {
        let mut b = HsmpMessage { msg_id: 3, response_sz: 1, ..Default::default() }.to_bytes();
        b[42] = 0xaa;
        b[43] = 0x55;
        assert_eq!(HsmpMessage::from_bytes(&b).to_bytes()[42..], [0, 0]);
    }
}
