#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colloquy_fuzz::rpc_codec(data);
});
