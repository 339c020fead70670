//! The model-specific registers read through the `msr` driver (`/dev/cpu/<N>/msr`: `pread` of
//! 8 bytes at offset = register number).

/// `MSR_AMD_RAPL_POWER_UNIT`: power unit bits 3:0, energy status unit (ESU) bits 12:8, time
/// unit bits 19:16.
pub const MSR_RAPL_PWR_UNIT: u32 = 0xC001_0299;

/// `MSR_AMD_CORE_ENERGY_STATUS`: a 32-bit counter of energy status units in bits 31:0, which
/// wraps (about 65,536 J at ESU 16).
pub const MSR_CORE_ENERGY_STAT: u32 = 0xC001_029A;

/// The energy status unit in a RAPL units word (bits 12:8), the same layout in the MSR and in
/// HSMP `GET_RAPL_UNITS`: joules = counter × 2^-ESU.
pub const fn energy_status_unit(units: u64) -> u8 {
    ((units >> 8) & 0x1f) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_esu_is_bits_12_to_8() {
        // Time unit 0xA in bits 19:16 and the power unit in bits 3:0 must not leak into it.
        assert_eq!(energy_status_unit(0x000A_1003), 16);
        assert_eq!(energy_status_unit(0x1f00), 31);
        assert_eq!(energy_status_unit(0xFFFF_E0FF), 0);
    }
}
