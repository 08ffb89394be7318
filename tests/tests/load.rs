//! The load test of RELIABILITY.md, short: `benches/load.sh 20 512` (wrk on /metrics while the
//! proxy carries 512 concurrent streams and the sampler reads 8 stub GPUs). Zero errors on both
//! sides; the full 10-minute figures are in RELIABILITY.md.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::ExpectSuccess;

#[test]
fn metrics_under_scrape_load_with_512_streams_has_no_errors() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .arg(root.join("benches/load.sh"))
        .args(["20", "512"])
        .current_dir(&root)
        .output()
        .unwrap()
        .expect_success("benches/load.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("== wrk on /metrics"), "{text}");
    assert!(
        !text.contains("Socket errors") && !text.contains("Non-2xx"),
        "{text}"
    );
    let streams = text
        .lines()
        .find(|l| l.starts_with("streams 512:"))
        .unwrap();
    assert!(streams.ends_with(" 0 failed"), "{streams}");
    let done: u64 = streams.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(done > 512, "{streams}");
}
