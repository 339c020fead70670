//! The HSMP messages the broker sends, with the word counts the driver checks, and typed
//! functions that encode a request, send it over a transport and decode the reply.
//!
//! Nothing in the broker builds an `HsmpMessage` any other way: the message ids a peer can
//! cause to be sent are exactly the ones in [`Message`].

use crate::msr::energy_status_unit;
use crate::table::{self, MsgDesc, id};
use crate::{HSMP_MAX_MSG_LEN, HsmpMessage, HsmpTransport, classify};
use amd_hsmp_proto::ItemError;

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
}

// Every message the broker sends has an entry in the driver's table, so `desc` cannot fail.
const _: () = {
    let mut i = 0;
    while i < Message::ALL.len() {
        assert!(table::msg_desc(Message::ALL[i].id()).is_some());
        i += 1;
    }
};

impl Message {
    /// Every message the broker may send.
    pub const ALL: [Message; 5] = [
        Message::GetProtoVer,
        Message::GetBoostLimit,
        Message::GetProcHot,
        Message::GetRaplUnits,
        Message::GetRaplCoreCounter,
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
        assert_eq!(table, [(0x03, 0, 1), (0x0A, 1, 1), (0x0B, 0, 1), (0x30, 0, 1), (0x31, 1, 2)]);
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
        let sent = t.sent();
        assert_eq!((sent[0].msg_id, sent[0].num_args, sent[0].response_sz), (0x0A, 1, 1));
        assert_eq!(sent[0].args[0], 0x1_0043);
    }

    #[test]
    fn prochot_reads_bit_zero_only() {
        assert_eq!(prochot(&Scripted::new(Ok([1, 0])), 0), Ok(true));
        assert_eq!(prochot(&Scripted::new(Ok([0, 0])), 0), Ok(false));
        assert_eq!(prochot(&Scripted::new(Ok([0xffff_fffe, 0])), 0), Ok(false));
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
        let sent = t.sent();
        assert_eq!((sent[0].msg_id, sent[0].num_args, sent[0].response_sz), (0x31, 1, 2));
        assert_eq!((sent[0].args[0], sent[0].sock_ind), (0x21, 1));
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
