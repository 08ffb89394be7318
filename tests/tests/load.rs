//! The load test of RELIABILITY.md, short: `benches/load.sh 20 512` (wrk on /metrics while the
//! proxy carries 512 concurrent streams and the sampler reads 8 stub GPUs). Zero errors on both
//! sides; the full 10-minute figures are in RELIABILITY.md. With `TAP=1`, the same load straight
//! to the server, measured by the tap: one exact record per request the client made.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::ExpectSuccess;

/// `benches/load.sh 20 512`'s output, with `env` set.
fn load_sh(env: &[(&str, &str)]) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .arg(root.join("benches/load.sh"))
        .args(["20", "512"])
        .envs(env.iter().copied())
        .current_dir(&root)
        .output()
        .unwrap()
        .expect_success("benches/load.sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The requests the 512 streams made, held to no error on either side (wrk's scrapes, the
/// streams).
fn requests_made_without_errors(text: &str) -> u64 {
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
    let made: u64 = streams.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(made > 512, "{streams}");
    made
}

#[test]
fn metrics_under_scrape_load_with_512_streams_has_no_errors() {
    requests_made_without_errors(&load_sh(&[]));
}

#[test]
fn the_tap_under_scrape_load_with_512_streams_records_every_request_exactly() {
    if !common::has_net_raw() {
        return eprintln!("SKIPPED: the tap needs CAP_NET_RAW, which this test process lacks");
    }
    let text = load_sh(&[("TAP", "1")]);
    let made = requests_made_without_errors(&text);
    // one record per request, every one exact, nothing the ring or the reader lost
    assert!(
        text.contains(&format!(
            "tap records {made} for {made} requests made; {made} exact"
        )),
        "{text}"
    );
    for counter in [
        "sglang_supervisor_tap_dropped_packets_total 0",
        "sglang_supervisor_tap_unread_connections_total 0",
    ] {
        assert!(text.lines().any(|l| l == counter), "{counter}: {text}");
    }
}
