//! A flood of idle connections on both listeners, at the common open-file limit of 1,024: the
//! supervisor neither spins nor stops answering scrapes and proxied requests, and teardown still
//! takes the whole tree (reading /proc needs descriptors too).
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::*;
use sglang_supervisor_tests::{http, post_timed, stat_cpu_ticks};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);
const FLOOD: usize = 1100;

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat_cpu_ticks(&stat).unwrap()
}

fn flood(addr: &str) -> Vec<TcpStream> {
    (0..FLOOD)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect()
}

#[test]
fn idle_connection_floods_at_the_1024_file_limit_neither_spin_nor_starve_nor_leak() {
    // The test itself holds 2 × 1,100 sockets.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
    let mut run = Run::start(
        "flood",
        Opts {
            supervisor: &["--proxy-addr", "127.0.0.1:0"],
            replay: &["--speed", "50", "--grandchildren"],
            wrap: &["sh", "-c", "ulimit -n 1024 && exec \"$@\"", "sh"],
            ..Default::default()
        },
    );
    run.wait_event("ready", T);

    let listening = run.wait_event("listening", T);
    let metrics = listening["metrics"].as_str().unwrap().to_string();
    let proxy = listening["proxy"].as_str().unwrap().to_string();
    let sup = run.child.id();

    let held_m = flood(&metrics);
    let held_p = flood(&proxy);
    assert!(
        held_m.len() + held_p.len() >= 2 * FLOOD - 10,
        "the flood connected"
    );

    // Scrapes and proxied requests are answered meanwhile.
    let t0 = Instant::now();
    let (status, body) = http(&metrics, "GET", "/metrics", "");
    assert!(status.contains("200"), "{status}");
    assert!(
        body.contains("sglang_supervisor_up") || body.contains("sglang_supervisor"),
        "{body:.200}"
    );
    let scrape = t0.elapsed();
    assert!(
        scrape < Duration::from_secs(5),
        "a scrape took {scrape:?} under the flood"
    );

    // No spinning while the flood is held: CPU over one second.
    let (c0, w0) = (cpu_ticks(sup), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cores = (cpu_ticks(sup) - c0) as f64 / ticks_per_s / w0.elapsed().as_secs_f64();
    eprintln!("scrape under flood {scrape:?}, supervisor CPU {cores:.3} cores");
    assert!(
        cores < 0.2,
        "the supervisor spins at {cores:.2} cores under the flood"
    );

    // The proxy's flood waited in the backlog beyond its cap; once it leaves, requests flow.
    drop(held_p);
    let t1 = Instant::now();
    let r = post_timed(
        &proxy,
        "/generate",
        r#"{"text":"hi","sampling_params":{"max_new_tokens":4}}"#,
    )
    .unwrap();
    assert!(r.status.contains("200"), "{}", r.status);
    assert!(t1.elapsed() < Duration::from_secs(5), "{:?}", t1.elapsed());

    // Teardown with the metrics flood still open: the whole tree goes, nothing reported left over.
    run.stop_by_sigterm();

    assert!(
        run.events_named("leftover").is_empty(),
        "{:#?}",
        run.events()
    );
    run.assert_no_survivors();
    drop(held_m);
}
