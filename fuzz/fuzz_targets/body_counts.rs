#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sglang_supervisor_tests::fuzzing::body_counts(data);
});
