//! Steady streaming load for the load test (benches/load.sh): STREAMS client threads each send
//! streamed `/generate` requests back to back to ADDR for SECONDS; prints requests completed and
//! failed (a failure: an error, a non-200 status, or a stream without its `[DONE]`).
//! usage: stream-load ADDR STREAMS TOKENS SECONDS
use sglang_supervisor_tests::{dechunked, post_timed};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: stream-load ADDR STREAMS TOKENS SECONDS");
        std::process::exit(2);
    }
    let num = |i: usize| a[i].parse::<u64>().unwrap_or(0);
    let (streams, tokens, secs) = (num(2), num(3), num(4));
    let end = Instant::now() + Duration::from_secs(secs);
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let body =
        format!(r#"{{"text":"x","sampling_params":{{"max_new_tokens":{tokens}}},"stream":true}}"#);
    let threads: Vec<_> = (0..streams)
        .map(|_| {
            let (addr, body, ok, failed) = (a[1].clone(), body.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                while Instant::now() < end {
                    match post_timed(&addr, "/generate", &body) {
                        // A proxy may pass a server's chunk on in two (it came in two reads):
                        // the events are in the body without its framing.
                        Ok(t)
                            if t.status.contains("200")
                                && String::from_utf8_lossy(&dechunked(t.body.as_bytes()))
                                    .contains("[DONE]") =>
                        {
                            ok.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    println!(
        "streams {streams}: {} requests completed, {} failed",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
}
