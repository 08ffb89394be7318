//! The proxy's one listening socket, accepted from by all its threads under one connection cap
//! (a hostile review of 83326ca, one SO_REUSEPORT listener per thread, found connections left in
//! a queue no thread with room would accept from, another program taking a share of the port, and
//! 64 threads failing to start under a low file limit; each test below failed on it).
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);
const BODY: &str = r#"{"text":"hi","sampling_params":{"max_new_tokens":4}}"#;

/// One `Connection: close` request; Err when no whole answer came within `wait`.
fn post_within(addr: &str, wait: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(wait)).unwrap();
    let req = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut b = Vec::new();
    match s.read_to_end(&mut b) {
        Ok(_) => Ok(String::from_utf8_lossy(&b)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()),
        Err(e) => Err(format!(
            "no answer within {wait:?} ({e}); local {:?}",
            s.local_addr()
        )),
    }
}

/// `n` kept-alive connections to `proxy`, a request sent on each while all stay open; the local
/// addresses of those with no `200` answer within `wait`.
fn kept_alive_unanswered(proxy: &str, n: usize, wait: Duration) -> Vec<std::net::SocketAddr> {
    let mut conns: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(proxy).unwrap()).collect();
    let req = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    for c in &mut conns {
        c.write_all(req.as_bytes()).unwrap();
    }
    let end = Instant::now() + wait;
    let mut unanswered = Vec::new();
    for c in &mut conns {
        let left = end
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        c.set_read_timeout(Some(left)).unwrap();
        let mut b = [0u8; 64];
        if !matches!(c.read(&mut b), Ok(n) if n > 0 && b.starts_with(b"HTTP/1.1 200")) {
            unanswered.push(c.local_addr().unwrap());
        }
    }
    unanswered
}

/// The supervisor under `ulimit -n 320`: a proxy connection cap of (320 - 256) / 2 = 32.
fn start_capped(name: &str, threads: &str) -> (Run, String) {
    let env = [("SGLANG_SUPERVISOR_PROXY_THREADS", threads)];
    let run = Run::start(
        name,
        Opts {
            supervisor: &["--proxy-addr", "127.0.0.1:0"],
            replay: &["--speed", "50"],
            env: &env,
            wrap: &["sh", "-c", "ulimit -n 320 && exec \"$@\"", "sh"],
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", T);
    run.wait_event("ready", T);
    (run, l["proxy"].as_str().unwrap().to_string())
}

/// With more proxy threads than the connection cap (48 threads, cap 32, both allowed), an idle
/// proxy must still answer every request: one client, one connection at a time.
#[test]
fn an_idle_proxy_with_48_threads_and_a_cap_of_32_answers_every_request() {
    let (mut run, proxy) = start_capped("plisten-48-threads", "48");
    let mut failed = Vec::new();
    for i in 0..16 {
        match post_within(&proxy, Duration::from_secs(3)) {
            Ok(status) => assert!(status.contains("200"), "{status}"),
            Err(e) => failed.push(format!("request {i}: {e}")),
        }
    }
    run.stop_by_sigterm();
    assert!(
        failed.is_empty(),
        "{} of 16 requests to an idle proxy got no answer: {failed:#?}",
        failed.len()
    );
}

/// At the default thread count's upper end (4), clients up to the cap (32) are all served: each
/// kept-alive connection gets its answer while the others stay open.
#[test]
fn as_many_kept_alive_clients_as_the_cap_all_get_answers() {
    let (mut run, proxy) = start_capped("plisten-at-cap", "4");
    let mut report = Vec::new();
    for round in 0..3 {
        let unanswered = kept_alive_unanswered(&proxy, 32, Duration::from_secs(10));
        report.push(format!(
            "round {round}: {} of 32 answered within 10 s",
            32 - unanswered.len()
        ));
        std::thread::sleep(Duration::from_millis(300));
    }
    run.stop_by_sigterm();
    assert!(
        report.iter().all(|r| r.contains(": 32 of 32")),
        "{report:#?}"
    );
}

/// Another program of the same user binding the proxy's port (with SO_REUSEPORT, as many servers
/// do) after the supervisor started must be refused: otherwise it silently takes a share of the
/// benchmark's connections, which the proxy never sees nor measures.
#[test]
fn another_program_cannot_take_a_share_of_the_proxys_connections() {
    let (mut run, proxy, _) = Run::start_with_proxy("plisten-intruder", Opts::default());
    let addr: std::net::SocketAddr = proxy.parse().unwrap();
    let intruder = (|| -> std::io::Result<std::net::TcpListener> {
        use std::os::fd::FromRawFd;
        let std::net::SocketAddr::V4(v4) = addr else {
            unreachable!()
        };
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            let l = std::net::TcpListener::from_raw_fd(fd);
            let one: libc::c_int = 1;
            for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
                let p = (&one as *const libc::c_int).cast();
                libc::setsockopt(fd, libc::SOL_SOCKET, opt, p, 4);
            }
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(fd, (&sin as *const libc::sockaddr_in).cast(), len) != 0
                || libc::listen(fd, 128) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(l)
        }
    })();
    let stolen = match &intruder {
        Err(_) => 0,
        Ok(l) => {
            l.set_nonblocking(true).unwrap();
            let mut held = Vec::new();
            for _ in 0..64 {
                held.push(TcpStream::connect(addr).unwrap());
            }
            std::thread::sleep(Duration::from_millis(200));
            let mut n = 0;
            while l.accept().is_ok() {
                n += 1;
            }
            n
        }
    };
    run.stop_by_sigterm();
    assert!(
        intruder.is_err(),
        "another process bound the proxy's address {proxy} and accepted {stolen} of 64 connections meant for the proxy"
    );
}

/// `SGLANG_SUPERVISOR_PROXY_THREADS=64` (documented: 1 to 64) starts under a 320 open-file
/// limit: the threads share one listening socket (one each took 63 more descriptors).
#[test]
fn sixty_four_proxy_threads_start_under_a_320_file_limit() {
    let env = [("SGLANG_SUPERVISOR_PROXY_THREADS", "64")];
    let mut run = Run::start(
        "plisten-64-start",
        Opts {
            supervisor: &["--proxy-addr", "127.0.0.1:0"],
            replay: &["--speed", "50"],
            env: &env,
            wrap: &["sh", "-c", "ulimit -n 320 && exec \"$@\"", "sh"],
            ..Default::default()
        },
    );
    let end = Instant::now() + T;
    while run.events_named("ready").is_empty() && run.events_named("fatal").is_empty() {
        assert!(Instant::now() < end, "{:#?}", run.events());
        std::thread::sleep(Duration::from_millis(20));
    }
    let fatal = run.events_named("fatal");
    if fatal.is_empty() {
        run.stop_by_sigterm();
    }
    assert!(fatal.is_empty(), "{fatal:#?}");
}

/// The default configuration (thread count from the cores, the common 1,024 open-file limit: a
/// cap of 384): a benchmark client that keeps 384 connections open gets an answer on each.
#[test]
fn at_the_1024_file_limit_384_kept_alive_clients_all_get_answers() {
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
    let run = Run::start(
        "plisten-1024",
        Opts {
            supervisor: &["--proxy-addr", "127.0.0.1:0"],
            replay: &["--speed", "50"],
            wrap: &["sh", "-c", "ulimit -n 1024 && exec \"$@\"", "sh"],
            ..Default::default()
        },
    );
    let proxy = run.wait_event("listening", T)["proxy"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", T);
    let mut run = run;
    let unanswered = kept_alive_unanswered(&proxy, 384, Duration::from_secs(15));
    run.stop_by_sigterm();
    assert!(
        unanswered.is_empty(),
        "{} of 384 unanswered after 15 s: {unanswered:?}",
        unanswered.len()
    );
}
