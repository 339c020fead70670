/*
 * SSDT declaring the HSMP mailbox of socket @SOCKET@ to the guest, as EPYC firmware does: an
 * ACPI device AMDI0097 with the mailbox window and the register offsets the amd_hsmp driver's
 * ACPI probe (drivers/platform/x86/amd/hsmp/acpi.c) reads. The VM test fills in the
 * placeholders from xtask/src/vm/mailbox.rs and compiles one table per socket with iasl.
 * The window lies in guest RAM kept from the kernel with memmap=, so the host's responder
 * sees the registers through the shared RAM file.
 */
DefinitionBlock ("", "SSDT", 2, "AMDHSM", "HSMPSK@SOCKET@", 0x00000001)
{
    Scope (\_SB)
    {
        Device (HSM@SOCKET@)
        {
            Name (_HID, "AMDI0097")
            /* The driver takes the socket index from the digits after "ID". */
            Name (_UID, "@UID@")
            Method (_STA, 0, NotSerialized)
            {
                Return (0x0F)
            }
            Name (_CRS, ResourceTemplate ()
            {
                Memory32Fixed (ReadWrite, @BASE@, @SIZE@)
            })
            Name (_DSD, Package ()
            {
                ToUUID ("b74d619d-5707-48bd-a69f-4ea2871fc2f6"),
                Package ()
                {
                    Package () { "MsgIdOffset", @MSG_ID@ },
                    Package () { "MsgRspOffset", @MSG_RSP@ },
                    Package () { "MsgArgOffset", @MSG_ARG@ },
                }
            })
        }
    }
}
