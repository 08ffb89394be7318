#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sglang_supervisor_tests::fuzzing::flag_schema(data);
});
