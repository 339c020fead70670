//! The HSMP messages the broker sends, with the word counts the driver checks, and typed
//! functions that encode a request, send it over a transport and decode the reply.
//!
//! Nothing in the broker builds an `HsmpMessage` any other way: the message ids a peer can
//! cause to be sent are exactly the ones in [`Message`].

use crate::msr::energy_status_unit;
use crate::table::{self, MsgDesc, id};
use crate::{HSMP_MAX_MSG_LEN, HsmpMessage, HsmpTransport, classify};
use amd_hsmp_proto::{ItemError, LimitReason};

/// The messages the broker sends.
///
/// The driver checks `num_args` and `response_sz` of a GET message for exact equality with its
/// descriptor table and answers `EINVAL` otherwise, so both counts come from that table
/// ([`table::msg_desc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Message {
    /// `HSMP_GET_PROTO_VER`: no argument; reply word 0 = protocol version.
    GetProtoVer = id::GET_PROTO_VER,
    /// `HSMP_GET_BOOST_LIMIT`: argument 0 = APIC id; reply word 0 = boost limit in MHz.
    GetBoostLimit = id::GET_BOOST_LIMIT,
    /// `HSMP_GET_PROC_HOT`: no argument; reply word 0 = PROCHOT status, see [`prochot`].
    GetProcHot = id::GET_PROC_HOT,
    /// `HSMP_GET_RAPL_UNITS` (protocol 7): no argument; reply word 0 = time unit in bits
    /// 19:16, energy status unit (ESU) in bits 12:8.
    GetRaplUnits = id::GET_RAPL_UNITS,
    /// `HSMP_GET_RAPL_CORE_COUNTER` (protocol 7): argument 0 = APIC id in bits 15:0; reply
    /// words 0 and 1 = low and high half of a 64-bit energy counter. The uapi comment says
    /// `response_sz = 1`, but the descriptor table the driver checks says 2.
    GetRaplCoreCounter = id::GET_RAPL_CORE_COUNTER,
    /// `HSMP_GET_RAPL_PACKAGE_COUNTER` (protocol 7): no argument; reply words 0 and 1 = low and
    /// high half of the socket's 64-bit package energy counter, in the units of
    /// [`Message::GetRaplUnits`] as the core counters.
    GetRaplPackageCounter = id::GET_RAPL_PACKAGE_COUNTER,
    /// `HSMP_GET_SOCKET_FREQ_LIMIT` (protocol 5): no argument; reply word 0 = the socket's
    /// current frequency limit in MHz in bits 31:16 and the limiters imposing it in bits 15:0,
    /// see [`socket_freq_limit`].
    GetSocketFreqLimit = id::GET_SOCKET_FREQ_LIMIT,
    /// `HSMP_GET_CCLK_CORE_LIMIT` (protocol 5): argument 0 = APIC id (all 32 bits); reply word 0
    /// = the core's CCLK frequency limit in MHz.
    GetCclkCoreLimit = id::GET_CCLK_CORE_LIMIT,
}

// Every message the broker sends has an entry in the driver's table, so `desc` cannot fail.
const _: () = {
    let mut rest: &[Message] = &Message::ALL;
    while let [message, tail @ ..] = rest {
        assert!(table::msg_desc(message.id()).is_some());
        rest = tail;
    }
};

impl Message {
    /// Every message the broker may send.
    pub const ALL: [Message; 8] = [
        Message::GetProtoVer,
        Message::GetBoostLimit,
        Message::GetProcHot,
        Message::GetRaplUnits,
        Message::GetRaplCoreCounter,
        Message::GetSocketFreqLimit,
        Message::GetCclkCoreLimit,
        Message::GetRaplPackageCounter,
    ];

    /// The message id (`msg_id`).
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The driver's descriptor of the message.
    const fn desc(self) -> MsgDesc {
        match table::msg_desc(self.id()) {
            Some(desc) => desc,
            // Unreachable: checked for every message at compile time above.
            None => MsgDesc::RESERVED,
        }
    }

    /// Number of argument words (`num_args`).
    pub const fn num_args(self) -> u16 {
        self.desc().num_args
    }

    /// Number of reply words (`response_sz`).
    pub const fn response_sz(self) -> u16 {
        self.desc().response_sz
    }

    /// The kernel's name for the message, for logs.
    pub const fn name(self) -> &'static str {
        match self {
            Message::GetProtoVer => "GET_PROTO_VER",
            Message::GetBoostLimit => "GET_BOOST_LIMIT",
            Message::GetProcHot => "GET_PROC_HOT",
            Message::GetRaplUnits => "GET_RAPL_UNITS",
            Message::GetRaplCoreCounter => "GET_RAPL_CORE_COUNTER",
            Message::GetSocketFreqLimit => "GET_SOCKET_FREQ_LIMIT",
            Message::GetCclkCoreLimit => "GET_CCLK_CORE_LIMIT",
            Message::GetRaplPackageCounter => "GET_RAPL_PACKAGE_COUNTER",
        }
    }

    /// The message with id `id`, if the broker sends it.
    pub fn from_id(id: u32) -> Option<Message> {
        Message::ALL.into_iter().find(|m| m.id() == id)
    }

    /// The request for socket `sock_ind` with `arg` as argument word 0 (ignored by messages
    /// that take no argument).
    pub fn request(self, sock_ind: u16, arg: u32) -> HsmpMessage {
        let mut args = [0; HSMP_MAX_MSG_LEN];
        if self.num_args() > 0 {
            args[0] = arg;
        }
        HsmpMessage {
            msg_id: self.id(),
            num_args: self.num_args(),
            response_sz: self.response_sz(),
            args,
            sock_ind,
        }
    }
}

/// Sends `message` to socket `socket` and returns the reply words.
fn call(
    transport: &dyn HsmpTransport,
    message: Message,
    socket: u32,
    arg: u32,
) -> Result<[u32; HSMP_MAX_MSG_LEN], ItemError> {
    // `sock_ind` is 16 bits wide; the driver answers ENODEV for an index it does not know.
    let sock_ind = u16::try_from(socket).map_err(|_| ItemError::NoSuchSocket)?;
    let mut msg = message.request(sock_ind, arg);
    transport.send(&mut msg).map_err(classify)?;
    Ok(msg.args)
}

/// HSMP protocol version of socket `socket` (`GET_PROTO_VER`).
pub fn proto_version(transport: &dyn HsmpTransport, socket: u32) -> Result<u32, ItemError> {
    Ok(call(transport, Message::GetProtoVer, socket, 0)?[0])
}

/// Current boost limit of the core with APIC id `apic_id`, in MHz (`GET_BOOST_LIMIT`).
pub fn boost_limit_mhz(
    transport: &dyn HsmpTransport,
    socket: u32,
    apic_id: u32,
) -> Result<u32, ItemError> {
    Ok(call(transport, Message::GetBoostLimit, socket, apic_id)?[0])
}

/// Whether PROCHOT is asserted on socket `socket` (`GET_PROC_HOT`).
///
/// The uapi header only says "proc hot status"; the PPR defines bit 0 as the status
/// (1 = asserted) and bits 31:1 as reserved, so only bit 0 is read.
pub fn prochot(transport: &dyn HsmpTransport, socket: u32) -> Result<bool, ItemError> {
    Ok(call(transport, Message::GetProcHot, socket, 0)?[0] & 1 == 1)
}

/// Energy status unit of socket `socket`: joules = counter × 2^-ESU (`GET_RAPL_UNITS`, bits
/// 12:8).
pub fn rapl_esu(transport: &dyn HsmpTransport, socket: u32) -> Result<u8, ItemError> {
    let word = call(transport, Message::GetRaplUnits, socket, 0)?[0];
    Ok(energy_status_unit(u64::from(word)))
}

/// The largest APIC id `GET_RAPL_CORE_COUNTER` carries (its argument's bits 15:0).
/// `GET_BOOST_LIMIT` takes the whole 32-bit word.
pub const RAPL_APIC_ID_MAX: u32 = u16::MAX as u32;

/// 64-bit energy counter of the core with APIC id `apic_id` (`GET_RAPL_CORE_COUNTER`).
///
/// The message carries only bits 15:0 of the APIC id; a larger id would address another core,
/// so it is refused as [`ItemError::Rejected`] without sending anything (never truncated).
pub fn rapl_core_counter(
    transport: &dyn HsmpTransport,
    socket: u32,
    apic_id: u32,
) -> Result<u64, ItemError> {
    if apic_id > RAPL_APIC_ID_MAX {
        return Err(ItemError::Rejected);
    }
    let words = call(transport, Message::GetRaplCoreCounter, socket, apic_id)?;
    Ok(u64::from(words[0]) | u64::from(words[1]) << 32)
}

/// 64-bit package energy counter of socket `socket` (`GET_RAPL_PACKAGE_COUNTER`).
pub fn rapl_package_counter(transport: &dyn HsmpTransport, socket: u32) -> Result<u64, ItemError> {
    let words = call(transport, Message::GetRaplPackageCounter, socket, 0)?;
    Ok(u64::from(words[0]) | u64::from(words[1]) << 32)
}

/// The limiters a socket reports as imposing its frequency limit: bits 15:0 of the
/// `GET_SOCKET_FREQ_LIMIT` reply, one bit per limiter (the kernel's descriptor table calls them
/// the "frequency source"; AMD's E-SMI library names bits 0 to 7).
///
/// The bits are said once, by [`LimitReason::mask`] (the contract's name for each limiter);
/// every constant here is that mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LimitReasons(pub u16);

impl LimitReasons {
    /// No limiter.
    pub const NONE: LimitReasons = LimitReasons(0);
    /// cHTC-Active: the socket's thermal control (the temperature limit `Tctl` set for it).
    pub const CHTC: LimitReasons = LimitReasons::of(LimitReason::Chtc);
    /// PROCHOT: the PROCHOT_L pin is asserted (an external thermal or power alarm).
    pub const PROCHOT: LimitReasons = LimitReasons::of(LimitReason::Prochot);
    /// TDC: the thermal design current limit of a voltage rail.
    pub const TDC: LimitReasons = LimitReasons::of(LimitReason::Tdc);
    /// PPT: the package power tracking limit (the socket's power cap).
    pub const PPT: LimitReasons = LimitReasons::of(LimitReason::Ppt);
    /// OPN max: the part's own maximum frequency; nothing else holds the socket down.
    pub const OPN_MAX: LimitReasons = LimitReasons::of(LimitReason::OpnMax);
    /// The reliability limit (voltage and temperature for the part's lifetime).
    pub const RELIABILITY: LimitReasons = LimitReasons::of(LimitReason::Reliability);
    /// A cap set by an APML agent (the BMC).
    pub const APML: LimitReasons = LimitReasons::of(LimitReason::Apml);
    /// A cap set by an HSMP agent (software on the host).
    pub const HSMP: LimitReasons = LimitReasons::of(LimitReason::Hsmp);
    /// Bits 15:8, which the specification does not name.
    pub const OTHER_MASK: LimitReasons = LimitReasons::of(LimitReason::Other);

    /// The bits that mean `reason`.
    pub const fn of(reason: LimitReason) -> LimitReasons {
        LimitReasons(reason.mask())
    }

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Whether any bit of `other` is set.
    pub const fn intersects(self, other: LimitReasons) -> bool {
        self.0 & other.0 != 0
    }

    /// The bits of both.
    pub const fn union(self, other: LimitReasons) -> LimitReasons {
        LimitReasons(self.0 | other.0)
    }
}

impl std::ops::BitOr for LimitReasons {
    type Output = LimitReasons;

    fn bitor(self, other: LimitReasons) -> LimitReasons {
        self.union(other)
    }
}

/// A socket's current frequency limit and the limiters imposing it (`GET_SOCKET_FREQ_LIMIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketFreqLimit {
    /// The limit, MHz (reply bits 31:16).
    pub mhz: u16,
    /// The limiters (reply bits 15:0).
    pub reasons: LimitReasons,
}

impl SocketFreqLimit {
    /// Decodes the reply word.
    pub const fn from_word(word: u32) -> SocketFreqLimit {
        SocketFreqLimit { mhz: (word >> 16) as u16, reasons: LimitReasons(word as u16) }
    }

    /// The reply word the firmware writes.
    pub const fn word(self) -> u32 {
        (self.mhz as u32) << 16 | self.reasons.0 as u32
    }
}

impl From<SocketFreqLimit> for amd_hsmp_proto::FrequencyLimit {
    /// The limit as the IPC contract carries it.
    fn from(limit: SocketFreqLimit) -> amd_hsmp_proto::FrequencyLimit {
        amd_hsmp_proto::FrequencyLimit { mhz: limit.mhz, reasons: limit.reasons.bits() }
    }
}

/// The current frequency limit of socket `socket` and the limiters imposing it
/// (`GET_SOCKET_FREQ_LIMIT`).
pub fn socket_freq_limit(
    transport: &dyn HsmpTransport,
    socket: u32,
) -> Result<SocketFreqLimit, ItemError> {
    let word = call(transport, Message::GetSocketFreqLimit, socket, 0)?[0];
    Ok(SocketFreqLimit::from_word(word))
}

/// The current CCLK frequency limit of the core with APIC id `apic_id`, in MHz
/// (`GET_CCLK_CORE_LIMIT`).
pub fn core_freq_limit_mhz(
    transport: &dyn HsmpTransport,
    socket: u32,
    apic_id: u32,
) -> Result<u32, ItemError> {
    Ok(call(transport, Message::GetCclkCoreLimit, socket, apic_id)?[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Errno;
    use std::sync::Mutex;

    /// Records every message and answers with a fixed reply or errno.
    #[derive(Debug)]
    struct Scripted {
        sent: Mutex<Vec<HsmpMessage>>,
        reply: Result<[u32; 2], Errno>,
    }

    impl Scripted {
        fn new(reply: Result<[u32; 2], Errno>) -> Scripted {
            Scripted { sent: Mutex::new(Vec::new()), reply }
        }

        fn sent(&self) -> Vec<HsmpMessage> {
            self.sent.lock().unwrap().clone()
        }

        /// The one message sent, as (id, num_args, response_sz, argument 0, sock_ind).
        fn only_sent(&self) -> (u32, u16, u16, u32, u16) {
            let sent = self.sent();
            assert_eq!(sent.len(), 1, "{sent:?}");
            let m = sent[0];
            (m.msg_id, m.num_args, m.response_sz, m.args[0], m.sock_ind)
        }
    }

    impl HsmpTransport for Scripted {
        fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
            self.sent.lock().unwrap().push(*msg);
            let words = self.reply?;
            msg.args[..2].copy_from_slice(&words);
            Ok(())
        }
    }

    #[test]
    fn the_table_matches_the_driver_descriptors() {
        let table: Vec<_> =
            Message::ALL.iter().map(|m| (m.id(), m.num_args(), m.response_sz())).collect();
        assert_eq!(
            table,
            [
                (0x03, 0, 1),
                (0x0A, 1, 1),
                (0x0B, 0, 1),
                (0x30, 0, 1),
                (0x31, 1, 2),
                (0x19, 0, 1),
                (0x1A, 1, 1),
                (0x32, 0, 2)
            ]
        );
        assert_eq!(Message::from_id(0x31), Some(Message::GetRaplCoreCounter));
        assert_eq!(Message::from_id(0x08), None, "SET_BOOST_LIMIT is never sent");
    }

    #[test]
    fn proto_version_asks_the_given_socket() {
        let t = Scripted::new(Ok([7, 0]));
        assert_eq!(proto_version(&t, 1), Ok(7));
        assert_eq!(t.sent(), [Message::GetProtoVer.request(1, 0)]);
        assert_eq!(t.sent()[0].sock_ind, 1);
    }

    #[test]
    fn boost_limit_sends_the_apic_id_and_reads_mhz() {
        let t = Scripted::new(Ok([3_700, 0]));
        assert_eq!(boost_limit_mhz(&t, 0, 0x1_0043), Ok(3_700));
        assert_eq!(t.only_sent(), (0x0A, 1, 1, 0x1_0043, 0));
    }

    #[test]
    fn prochot_reads_bit_zero_only() {
        assert_eq!(prochot(&Scripted::new(Ok([1, 0])), 0), Ok(true));
        assert_eq!(prochot(&Scripted::new(Ok([0, 0])), 0), Ok(false));
        assert_eq!(prochot(&Scripted::new(Ok([0xffff_fffe, 0])), 0), Ok(false));
    }

    #[test]
    fn socket_freq_limit_is_mhz_in_the_high_half_and_reasons_in_the_low() {
        let t = Scripted::new(Ok([2_450 << 16 | 0x0008, 0]));
        let limit = socket_freq_limit(&t, 1).unwrap();
        assert_eq!(limit, SocketFreqLimit { mhz: 2_450, reasons: LimitReasons::PPT });
        assert_eq!(limit.word(), 2_450 << 16 | 0x0008);
        assert_eq!(t.only_sent(), (0x19, 0, 1, 0, 1));
    }

    #[test]
    fn each_limit_reason_is_its_own_bit() {
        let named = [
            (0, LimitReasons::CHTC),
            (1, LimitReasons::PROCHOT),
            (2, LimitReasons::TDC),
            (3, LimitReasons::PPT),
            (4, LimitReasons::OPN_MAX),
            (5, LimitReasons::RELIABILITY),
            (6, LimitReasons::APML),
            (7, LimitReasons::HSMP),
        ];
        for (bit, reason) in named {
            let word = 3_000 << 16 | 1u32 << bit;
            let limit = socket_freq_limit(&Scripted::new(Ok([word, 0])), 0).unwrap();
            assert_eq!(limit.mhz, 3_000, "bit {bit}");
            assert_eq!(limit.reasons, reason, "bit {bit}");
            for (other, r) in named {
                assert_eq!(limit.reasons.intersects(r), other == bit, "bit {bit} vs {other}");
            }
            assert!(!limit.reasons.intersects(LimitReasons::OTHER_MASK), "bit {bit}");
        }
        for bit in 8..16 {
            let limit = SocketFreqLimit::from_word(1u32 << bit);
            assert!(limit.reasons.intersects(LimitReasons::OTHER_MASK), "bit {bit}");
            assert!(named.iter().all(|&(_, r)| !limit.reasons.intersects(r)), "bit {bit}");
            assert_eq!(limit.mhz, 0);
        }
        let both = LimitReasons::PROCHOT | LimitReasons::CHTC;
        assert_eq!(both.bits(), 0x03);
        assert_eq!(SocketFreqLimit::from_word(0xFFFF_0000).reasons, LimitReasons::NONE);
    }

    #[test]
    fn core_freq_limit_sends_the_whole_apic_id_and_reads_mhz() {
        let t = Scripted::new(Ok([3_100, 0]));
        assert_eq!(core_freq_limit_mhz(&t, 1, 0x1_0043), Ok(3_100));
        assert_eq!(t.only_sent(), (0x1A, 1, 1, 0x1_0043, 1));
    }

    #[test]
    fn rapl_esu_is_bits_12_to_8() {
        // Time unit 0xA in bits 19:16 and noise in bits 7:0 must not leak into the ESU.
        let t = Scripted::new(Ok([0x000A_10FF, 0]));
        assert_eq!(rapl_esu(&t, 0), Ok(16));
        assert_eq!(rapl_esu(&Scripted::new(Ok([0x1f00, 0])), 0), Ok(31));
    }

    #[test]
    fn rapl_core_counter_asks_two_words_and_joins_them() {
        let t = Scripted::new(Ok([0x89ab_cdef, 0x0123_4567]));
        assert_eq!(rapl_core_counter(&t, 1, 0x21), Ok(0x0123_4567_89ab_cdef));
        assert_eq!(t.only_sent(), (0x31, 1, 2, 0x21, 1));
    }

    #[test]
    fn rapl_package_counter_asks_two_words_of_the_socket_and_joins_them() {
        let t = Scripted::new(Ok([0x89ab_cdef, 0x0123_4567]));
        assert_eq!(rapl_package_counter(&t, 1), Ok(0x0123_4567_89ab_cdef));
        assert_eq!(t.only_sent(), (0x32, 0, 2, 0, 1));
    }

    #[test]
    fn rapl_core_counter_refuses_an_apic_id_wider_than_16_bits() {
        let t = Scripted::new(Ok([1, 0]));
        assert_eq!(rapl_core_counter(&t, 0, 0x1_0000), Err(ItemError::Rejected));
        assert!(t.sent().is_empty());
    }

    #[test]
    fn rapl_core_counter_carries_apic_ids_above_255_up_to_16_bits_whole() {
        for apic_id in [0x100, 0x1FF, RAPL_APIC_ID_MAX] {
            let t = Scripted::new(Ok([1, 0]));
            assert_eq!(rapl_core_counter(&t, 1, apic_id), Ok(1));
            assert_eq!(t.sent()[0].args[0], apic_id);
        }
    }

    #[test]
    fn driver_errors_are_classified() {
        let t = Scripted::new(Err(libc::ENOMSG));
        assert_eq!(rapl_esu(&t, 0), Err(ItemError::Unsupported));
        let t = Scripted::new(Err(libc::EREMOTEIO));
        assert_eq!(prochot(&t, 0), Err(ItemError::Io { errno: libc::EREMOTEIO }));
    }

    #[test]
    fn a_socket_beyond_sock_ind_is_no_such_socket_without_a_message() {
        let t = Scripted::new(Ok([1, 0]));
        assert_eq!(proto_version(&t, 70_000), Err(ItemError::NoSuchSocket));
        assert!(t.sent().is_empty());
    }
}
