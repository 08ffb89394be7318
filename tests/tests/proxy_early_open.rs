//! The proxy opens a client connection's upstream connection when the client connects: what that
//! early connect does when the server is slow to accept (a full listen queue). A client that leaves
//! takes its connect with it, as a direct client's connect ends when it gives up.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A server that listens but does not accept (its Python event loop is busy, its backlog full):
/// the kernel drops further SYNs, and a connect to it waits, retransmitting, for up to ~127 s.
/// Returns the listener (kept, never accepted on), its port and the connection that fills the
/// backlog.
fn stalled_server() -> (TcpListener, u16, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    // listen() again on a listening socket sets its backlog: one connection fills it.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
    let addr = l.local_addr().unwrap();
    let filler = TcpStream::connect(addr).unwrap();
    // Set-up check: a further connect does not complete.
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err(),
        "the backlog is full"
    );
    (l, addr.port(), filler)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// TCP sockets of `pid` in SYN_SENT (connects under way), from /proc/<pid>/net/tcp with the
/// process's own socket inodes.
fn connecting(pid: u32) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|p| {
                    let s = p.to_string_lossy().to_string();
                    s.strip_prefix("socket:[")
                        .and_then(|s| s.strip_suffix(']'))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9 && f[3] == "02" && inodes.contains(f[9])
        })
        .count()
}

fn start(name: &str, upstream: &str, wrap: &[&str]) -> (Run, String, String) {
    Run::start_with_proxy(
        name,
        Opts {
            supervisor: &[
                "--upstream",
                upstream,
                // readiness from the replay server, not the stalled one
                "--health-url",
                "http://127.0.0.1:{port}",
            ],
            wrap,
            ..Default::default()
        },
    )
}

/// A direct client that gives up on a stalled server closes its connecting socket, and the
/// server never sees it. Through the proxy, the early connect of a client that has left is
/// stopped with it: no socket stays open in the supervisor (up to the kernel's ~127 s SYN
/// timeout, as it did in 6ad9654, found by a hostile review).
#[test]
fn clients_that_leave_while_the_server_is_not_accepting_leave_no_upstream_socket_open() {
    let (_l, port, _filler) = stalled_server();
    let (mut run, proxy, _) = start("early-leak", &format!("http://127.0.0.1:{port}"), &[]);
    let pid = run.child.id();
    let (fds0, syn0) = (fds(pid), connecting(pid));
    let clients = 200;
    for _ in 0..clients {
        drop(TcpStream::connect(&proxy).unwrap());
    }
    // Every client is gone; give the proxy time to see them go.
    std::thread::sleep(Duration::from_secs(2));
    let (fds1, syn1) = (fds(pid), connecting(pid));
    eprintln!("supervisor fds {fds0} -> {fds1}, sockets in SYN_SENT {syn0} -> {syn1}");
    assert!(
        syn1 <= syn0 + 5 && fds1 <= fds0 + 5,
        "{clients} clients left, the supervisor still holds {} connecting upstream sockets \
         ({fds0} -> {fds1} descriptors)",
        syn1 - syn0
    );
    run.stop_by_sigterm();
}

/// Serve `l` from now on (the stalled server recovers): every request on every connection is
/// answered `200 ok`, connections kept alive.
fn recover(l: TcpListener) {
    use std::io::BufRead;
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 128) }, 0);
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = std::io::BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line.trim_end().is_empty() {
                        let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                    }
                }
            });
        }
    });
}

fn get(addr: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    // Until the answer's end ("ok", or a proxy error's body), the connection's end or 3 s.
    let mut b = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(String::from_utf8_lossy(&b).to_string()),
            Ok(n) => {
                b.extend_from_slice(&buf[..n]);
                if b.ends_with(b"ok") {
                    return Ok(String::from_utf8_lossy(&b).to_string());
                }
            }
            Err(e) => return Err(format!("{e} after {:?}", String::from_utf8_lossy(&b))),
        }
    }
}

/// `proxy_connection_cap` keeps two descriptors per client connection. At a file limit of 400
/// (cap 72 connections), clients that come and go while the server stalls for a few seconds
/// (never more than one at a time) must not fill the supervisor's descriptor table with connects
/// nobody waits for: once the server answers again, a client of the proxy is served at once, as a
/// direct client is (6ad9654 answered 502 "Too many open files" until those connects ended).
#[test]
fn after_a_server_stall_with_clients_coming_and_going_the_proxy_serves_at_once_as_the_server_does()
{
    let (l, port, _filler) = stalled_server();
    let (mut run, proxy, _) = start(
        "early-emfile",
        &format!("http://127.0.0.1:{port}"),
        &["sh", "-c", "ulimit -n 400 && exec \"$@\"", "sh"],
    );
    let pid = run.child.id();
    let stall = Instant::now();
    for _ in 0..400 {
        drop(TcpStream::connect(&proxy).unwrap());
        std::thread::sleep(Duration::from_millis(2));
    }
    // The server stalls 4 s in all, then answers again.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(stall.elapsed()));
    eprintln!(
        "at recovery: supervisor fds {} (limit 400), sockets in SYN_SENT {}",
        fds(pid),
        connecting(pid)
    );
    recover(l);
    let direct = get(&format!("127.0.0.1:{port}"));
    assert!(
        matches!(&direct, Ok(t) if t.starts_with("HTTP/1.1 200")),
        "{direct:?}"
    );
    let t0 = Instant::now();
    let proxied = get(&proxy);
    eprintln!("through the proxy after {:?}: {proxied:?}", t0.elapsed());
    assert!(
        matches!(&proxied, Ok(t) if t.starts_with("HTTP/1.1 200")),
        "direct: 200 at once; through the proxy: {proxied:?} after {:?}",
        t0.elapsed()
    );
    run.stop_by_sigterm();
}

/// Clients that leave at once, or halfway through a request, leave nothing behind with a server
/// that accepts at once either: the supervisor's descriptors come back to where they were (an
/// upstream connection opened early is closed with its client, or its connect stopped).
#[test]
fn client_connections_dropped_at_once_or_mid_request_leave_no_upstream_connection_open() {
    let (mut run, proxy, _) = start("early-drop", "http://127.0.0.1:{port}", &[]);
    let pid = run.child.id();
    let before = fds(pid);
    for i in 0..250 {
        let mut c = TcpStream::connect(&proxy).unwrap();
        if i >= 200 {
            // cut before its body ends
            let _ =
                c.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
        }
    }
    let until = Instant::now() + Duration::from_secs(10);
    let mut now = fds(pid);
    while now > before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        now = fds(pid);
    }
    assert!(now <= before, "supervisor descriptors {before} -> {now}");
    run.stop_by_sigterm();
}
