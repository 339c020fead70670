//! libFuzzer entry point of the `web_config` property (`amd_hsmp_fuzz::web_config`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: amd_hsmp_fuzz::Alloc = amd_hsmp_fuzz::Alloc::new(std::alloc::System, usize::MAX);

fuzz_target!(|data: &[u8]| amd_hsmp_fuzz::web_config(data, &ALLOC));
