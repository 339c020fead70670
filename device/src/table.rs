//! The HSMP message ids (`enum hsmp_message_ids`) and the driver's descriptor table
//! (`hsmp_msg_desc_table[]`): how many words each message takes and returns, and whether it
//! reads or changes the machine.

/// Message ids (`HSMP_*` in `enum hsmp_message_ids`) that anything in this project names.
pub mod id {
    /// `HSMP_TEST`: answers argument 0 plus one; the lowest valid id.
    pub const TEST: u32 = 0x01;
    /// `HSMP_GET_SMU_VER`.
    pub const GET_SMU_VER: u32 = 0x02;
    /// `HSMP_GET_PROTO_VER`.
    pub const GET_PROTO_VER: u32 = 0x03;
    /// `HSMP_SET_BOOST_LIMIT`: never sent by the broker.
    pub const SET_BOOST_LIMIT: u32 = 0x08;
    /// `HSMP_GET_BOOST_LIMIT`: argument 0 = APIC id.
    pub const GET_BOOST_LIMIT: u32 = 0x0A;
    /// `HSMP_GET_PROC_HOT`.
    pub const GET_PROC_HOT: u32 = 0x0B;
    /// `HSMP_GET_SOCKET_FREQ_LIMIT` (protocol 5): the socket's current frequency limit and the
    /// limiters imposing it.
    pub const GET_SOCKET_FREQ_LIMIT: u32 = 0x19;
    /// `HSMP_GET_CCLK_CORE_LIMIT` (protocol 5): argument 0 = APIC id.
    pub const GET_CCLK_CORE_LIMIT: u32 = 0x1A;
    /// `HSMP_GET_RAPL_UNITS` (protocol 7).
    pub const GET_RAPL_UNITS: u32 = 0x30;
    /// `HSMP_GET_RAPL_CORE_COUNTER` (protocol 7): argument 0 bits 15:0 = APIC id.
    pub const GET_RAPL_CORE_COUNTER: u32 = 0x31;
    /// `HSMP_GET_RAPL_PACKAGE_COUNTER` (protocol 7).
    pub const GET_RAPL_PACKAGE_COUNTER: u32 = 0x32;
}

/// One past the highest message id the driver knows (`HSMP_MSG_ID_MAX` on mainline).
pub const HSMP_MSG_ID_MAX: u32 = 0x33;

/// The kind of a message in the driver's descriptor table (`enum hsmp_msg_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// `HSMP_RSVD`: not a message.
    Reserved,
    /// `HSMP_SET`: changes the machine; needs a writable descriptor.
    Set,
    /// `HSMP_GET`: reads only.
    Get,
    /// `HSMP_SET_GET`: a GET if bit 31 of argument 0 is set, else a SET; `response_sz` is a
    /// maximum, not an exact count.
    SetGet,
}

/// One entry of the driver's descriptor table (`struct hsmp_msg_desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgDesc {
    /// Exact number of argument words.
    pub num_args: u16,
    /// Number of response words (exact, or a maximum for [`MsgKind::SetGet`]).
    pub response_sz: u16,
    /// The kind.
    pub kind: MsgKind,
}

const fn d(num_args: u16, response_sz: u16, kind: MsgKind) -> MsgDesc {
    MsgDesc { num_args, response_sz, kind }
}

const RSVD: MsgDesc = MsgDesc::RESERVED;

impl MsgDesc {
    /// The descriptor of a reserved id.
    pub const RESERVED: MsgDesc = d(0, 0, MsgKind::Reserved);
}

/// `hsmp_msg_desc_table[]` from `arch/x86/include/uapi/asm/amd_hsmp.h`, indexed by message id.
const DESC_TABLE: [MsgDesc; HSMP_MSG_ID_MAX as usize] = [
    RSVD,                     // 0x00 reserved
    d(1, 1, MsgKind::Get),    // 0x01 HSMP_TEST
    d(0, 1, MsgKind::Get),    // 0x02 HSMP_GET_SMU_VER
    d(0, 1, MsgKind::Get),    // 0x03 HSMP_GET_PROTO_VER
    d(0, 1, MsgKind::Get),    // 0x04 HSMP_GET_SOCKET_POWER
    d(1, 0, MsgKind::Set),    // 0x05 HSMP_SET_SOCKET_POWER_LIMIT
    d(0, 1, MsgKind::Get),    // 0x06 HSMP_GET_SOCKET_POWER_LIMIT
    d(0, 1, MsgKind::Get),    // 0x07 HSMP_GET_SOCKET_POWER_LIMIT_MAX
    d(1, 0, MsgKind::Set),    // 0x08 HSMP_SET_BOOST_LIMIT
    d(1, 0, MsgKind::Set),    // 0x09 HSMP_SET_BOOST_LIMIT_SOCKET
    d(1, 1, MsgKind::Get),    // 0x0A HSMP_GET_BOOST_LIMIT
    d(0, 1, MsgKind::Get),    // 0x0B HSMP_GET_PROC_HOT
    d(1, 0, MsgKind::Set),    // 0x0C HSMP_SET_XGMI_LINK_WIDTH
    d(1, 0, MsgKind::Set),    // 0x0D HSMP_SET_DF_PSTATE
    d(0, 0, MsgKind::Set),    // 0x0E HSMP_SET_AUTO_DF_PSTATE
    d(0, 2, MsgKind::Get),    // 0x0F HSMP_GET_FCLK_MCLK
    d(0, 1, MsgKind::Get),    // 0x10 HSMP_GET_CCLK_THROTTLE_LIMIT
    d(0, 1, MsgKind::Get),    // 0x11 HSMP_GET_C0_PERCENT
    d(1, 0, MsgKind::Set),    // 0x12 HSMP_SET_NBIO_DPM_LEVEL
    d(1, 1, MsgKind::Get),    // 0x13 HSMP_GET_NBIO_DPM_LEVEL
    d(0, 1, MsgKind::Get),    // 0x14 HSMP_GET_DDR_BANDWIDTH
    d(0, 1, MsgKind::Get),    // 0x15 HSMP_GET_TEMP_MONITOR
    d(1, 1, MsgKind::Get),    // 0x16 HSMP_GET_DIMM_TEMP_RANGE
    d(1, 1, MsgKind::Get),    // 0x17 HSMP_GET_DIMM_POWER
    d(1, 1, MsgKind::Get),    // 0x18 HSMP_GET_DIMM_THERMAL
    d(0, 1, MsgKind::Get),    // 0x19 HSMP_GET_SOCKET_FREQ_LIMIT
    d(1, 1, MsgKind::Get),    // 0x1A HSMP_GET_CCLK_CORE_LIMIT
    d(0, 1, MsgKind::Get),    // 0x1B HSMP_GET_RAILS_SVI
    d(0, 1, MsgKind::Get),    // 0x1C HSMP_GET_SOCKET_FMAX_FMIN
    d(1, 1, MsgKind::Get),    // 0x1D HSMP_GET_IOLINK_BANDWITH
    d(1, 1, MsgKind::Get),    // 0x1E HSMP_GET_XGMI_BANDWITH
    d(1, 0, MsgKind::Set),    // 0x1F HSMP_SET_GMI3_WIDTH
    d(1, 1, MsgKind::Set),    // 0x20 HSMP_SET_PCI_RATE
    d(1, 1, MsgKind::SetGet), // 0x21 HSMP_SET_POWER_MODE
    d(1, 0, MsgKind::Set),    // 0x22 HSMP_SET_PSTATE_MAX_MIN
    d(0, 1, MsgKind::Get),    // 0x23 HSMP_GET_METRIC_TABLE_VER
    d(0, 0, MsgKind::Get),    // 0x24 HSMP_GET_METRIC_TABLE
    d(0, 2, MsgKind::Get),    // 0x25 HSMP_GET_METRIC_TABLE_DRAM_ADDR
    d(1, 0, MsgKind::Set),    // 0x26 HSMP_SET_XGMI_PSTATE_RANGE
    d(1, 1, MsgKind::SetGet), // 0x27 HSMP_CPU_RAIL_ISO_FREQ_POLICY
    d(1, 1, MsgKind::SetGet), // 0x28 HSMP_DFC_ENABLE_CTRL
    RSVD,                     // 0x29
    RSVD,                     // 0x2A
    RSVD,                     // 0x2B
    RSVD,                     // 0x2C
    RSVD,                     // 0x2D
    RSVD,                     // 0x2E
    RSVD,                     // 0x2F
    d(0, 1, MsgKind::Get),    // 0x30 HSMP_GET_RAPL_UNITS
    d(1, 2, MsgKind::Get),    // 0x31 HSMP_GET_RAPL_CORE_COUNTER
    d(0, 2, MsgKind::Get),    // 0x32 HSMP_GET_RAPL_PACKAGE_COUNTER
];

/// The descriptor of message `msg_id`, `None` outside the table.
#[expect(clippy::indexing_slicing, reason = "the table holds HSMP_MSG_ID_MAX entries")]
pub const fn msg_desc(msg_id: u32) -> Option<MsgDesc> {
    if msg_id < HSMP_MSG_ID_MAX { Some(DESC_TABLE[msg_id as usize]) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_table_matches_the_kernel_for_the_messages_used() {
        assert_eq!(DESC_TABLE.len(), 0x33);
        assert_eq!(msg_desc(id::GET_PROTO_VER), Some(d(0, 1, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_BOOST_LIMIT), Some(d(1, 1, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_PROC_HOT), Some(d(0, 1, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_SOCKET_FREQ_LIMIT), Some(d(0, 1, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_CCLK_CORE_LIMIT), Some(d(1, 1, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_RAPL_UNITS), Some(d(0, 1, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_RAPL_CORE_COUNTER), Some(d(1, 2, MsgKind::Get)));
        assert_eq!(msg_desc(id::GET_RAPL_PACKAGE_COUNTER), Some(d(0, 2, MsgKind::Get)));
        assert_eq!(msg_desc(id::SET_BOOST_LIMIT), Some(d(1, 0, MsgKind::Set)));
        assert_eq!(msg_desc(0x33), None);
        let reserved: Vec<u32> = (0..0x33)
            .filter(|&id| msg_desc(id).map(|m| m.kind) == Some(MsgKind::Reserved))
            .collect();
        assert_eq!(reserved, vec![0x00, 0x29, 0x2A, 0x2B, 0x2C, 0x2D, 0x2E, 0x2F]);
    }
}
