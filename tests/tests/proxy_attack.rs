//! The proxy attacked as a hostile client would: keep-alive, `Expect: 100-continue`, odd request
//! bodies, clients that leave early or never read, upstreams that die mid-stream. Each compares
//! what the client gets with a direct connection to the replay server, and checks the log.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn start_with(name: &str, replay_extra: &[&str]) -> (Run, String, String, std::path::PathBuf) {
    let log = std::env::temp_dir().join(format!(
        "sglsup-{name}-{}-requests.jsonl",
        std::process::id()
    ));
    let log_s = log.to_str().unwrap().to_string();
    let sup = ["--proxy-addr", "127.0.0.1:0", "--requests-log", &log_s];
    let run = Run::start(
        name,
        Opts {
            supervisor: &sup,
            replay: &[&["--speed", "50"], replay_extra].concat(),
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", T);
    run.wait_event("ready", T);
    let direct = format!("127.0.0.1:{}", run.port);
    (run, l["proxy"].as_str().unwrap().to_string(), direct, log)
}

fn records(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn wait_records(log: &std::path::Path, n: usize, wait: Duration) -> Vec<Value> {
    let end = Instant::now() + wait;
    loop {
        let r = records(log);
        if r.len() >= n || Instant::now() > end {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut run: Run, log: std::path::PathBuf) {
    run.stop_by_sigterm();
    let _ = std::fs::remove_file(log);
}

/// One HTTP/1.1 response read off a kept-alive connection: (status, payload, dechunked).
fn read_response(r: &mut BufReader<TcpStream>) -> (u16, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (mut len, mut chunked) = (None, false);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.strip_prefix("content-length:") {
            len = Some(v.trim().parse::<usize>().unwrap());
        }
        if h.starts_with("transfer-encoding:") && h.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        r.read_exact(&mut body).unwrap();
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    (status, body)
}

/// Several requests on one kept-alive connection; their responses in order.
fn exchange(addr: &str, reqs: &[(&str, &str)]) -> Vec<(u16, Vec<u8>)> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    reqs.iter()
        .map(|(path, body)| {
            let req = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            w.write_all(req.as_bytes()).unwrap();
            read_response(&mut r)
        })
        .collect()
}

const COMPLETIONS: &str = r#"{"model":"m","prompt":"one two three","max_tokens":12,"stream":true}"#;
const CHAT: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"a b"}],"max_tokens":9,"stream":true}"#;
const GENERATE: &str = r#"{"text":"x y","sampling_params":{"max_new_tokens":7},"stream":true}"#;
const PLAIN: &str = r#"{"text":"x y","sampling_params":{"max_new_tokens":5}}"#;

#[test]
fn keep_alive_requests_on_one_connection_match_a_direct_connection() {
    let (run, proxy, direct, log) = start_with("atk-keepalive", &["--merge-every", "3"]);
    let reqs = [
        ("/v1/completions", COMPLETIONS),
        ("/generate", PLAIN),
        ("/v1/chat/completions", CHAT),
        ("/generate", GENERATE),
        ("/v1/completions", COMPLETIONS),
    ];
    let via = exchange(&proxy, &reqs);
    let want = exchange(&direct, &reqs);
    assert_eq!(via.len(), want.len());
    for (i, (v, w)) in via.iter().zip(&want).enumerate() {
        assert_eq!(v.0, w.0, "status of request {i}");
        assert_eq!(
            String::from_utf8_lossy(&v.1),
            String::from_utf8_lossy(&w.1),
            "bytes of request {i}"
        );
    }
    let recs = wait_records(&log, reqs.len(), Duration::from_secs(20));
    assert_eq!(recs.len(), reqs.len(), "{recs:?}");
    let tokens: Vec<Value> = recs
        .iter()
        .map(|r| r["completion_tokens"].clone())
        .collect();
    assert_eq!(tokens, [12, 5, 9, 7, 12].map(Value::from), "{recs:?}");
    assert!(recs.iter().all(|r| r.get("error").is_none()), "{recs:?}");
    stop(run, log);
}

#[test]
fn expect_100_continue_is_answered_and_the_stream_is_counted() {
    let (run, proxy, direct, log) = start_with("atk-expect", &[]);
    let mut s = TcpStream::connect(&proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        COMPLETIONS.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("HTTP/1.1 100"),
        "got {line:?} before sending the body"
    );
    r.read_line(&mut line).unwrap();
    s.write_all(COMPLETIONS.as_bytes()).unwrap();
    let (status, body) = read_response(&mut r);
    let want = exchange(&direct, &[("/v1/completions", COMPLETIONS)]);
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&want[0].1)
    );
    let recs = wait_records(&log, 1, Duration::from_secs(20));
    assert_eq!(recs[0]["completion_tokens"], 12, "{recs:?}");
    stop(run, log);
}

#[test]
fn odd_request_bodies_pass_through_unchanged_and_are_recorded() {
    let (run, proxy, direct, log) = start_with("atk-bodies", &[]);
    let p = r#""prompt":"a b c","max_tokens":6"#;
    let bodies = [
        "not json".to_string(),
        format!(r#"[{{{p},"stream":true}}]"#),
        format!(r#"{{{p},"stream": true, "stream_options": null}}"#),
        format!(r#"{{{p},"stream":true,"stream_options":"x"}}"#),
        format!(r#"{{{p},"stream":true,"stream_options":{{"include_usage":false}}}}"#),
        format!(r#"{{{p},"stream":true,"stream_options":{{"continuous_usage_stats":true}}}}"#),
        format!(r#"  {{ {p} , "stream" : true }}  "#),
    ];
    for b in &bodies {
        let via = exchange(&proxy, &[("/v1/completions", b)]);
        let want = exchange(&direct, &[("/v1/completions", b)]);
        assert_eq!(via[0].0, want[0].0, "status for {b}");
        assert_eq!(
            String::from_utf8_lossy(&via[0].1),
            String::from_utf8_lossy(&want[0].1),
            "bytes for {b}"
        );
    }
    let recs = wait_records(&log, bodies.len(), Duration::from_secs(20));
    assert_eq!(recs.len(), bodies.len(), "{recs:?}");
    for r in &recs {
        assert_ne!(r["completion_tokens"], 0, "never 0: {r}");
        assert_ne!(r["prompt_tokens"], 0, "never 0: {r}");
    }
    // The streams that asked for usage through the proxy get the server's exact count.
    for i in [2, 4, 5, 6] {
        assert_eq!(
            recs[i]["completion_tokens"], 6,
            "{}: {}",
            bodies[i], recs[i]
        );
    }
    stop(run, log);
}

#[test]
fn a_client_that_leaves_before_the_response_is_recorded_with_an_error() {
    // Not streamed: the replay answers only after all its tokens (about 5 s here).
    let (run, proxy, _, log) = start_with("atk-early-leave", &["--token-gap-us", "5000"]);
    {
        let mut s = TcpStream::connect(&proxy).unwrap();
        let body = r#"{"text":"x","sampling_params":{"max_new_tokens":1000}}"#;
        let req = post_request("/generate", body);
        s.write_all(req.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    } // gone before the first response byte
    let recs = wait_records(&log, 1, Duration::from_secs(15));
    assert_eq!(recs.len(), 1, "the request left no record");
    assert!(recs[0]["error"].is_string(), "{}", recs[0]);
    assert!(recs[0]["e2e_s"].as_f64().unwrap() < 3.0, "{}", recs[0]);
    stop(run, log);
}

#[test]
fn a_client_that_never_reads_does_not_stall_the_others() {
    let (run, proxy, _, log) = start_with("atk-slow-reader", &[]);
    let mut s = TcpStream::connect(&proxy).unwrap();
    let body = r#"{"text":"x","sampling_params":{"max_new_tokens":4096},"stream":true}"#;
    let req = post_request("/generate", body);
    s.write_all(req.as_bytes()).unwrap(); // and never read
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let p = proxy.clone();
            std::thread::spawn(move || exchange(&p, &[("/v1/completions", COMPLETIONS)]))
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap()[0].0, 200);
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop(s);
    let recs = wait_records(&log, 17, Duration::from_secs(20));
    assert_eq!(recs.len(), 17);
    stop(run, log);
}

#[test]
fn an_upstream_that_dies_mid_stream_is_recorded_and_the_client_gets_what_it_sent() {
    let (run, proxy, direct, log) = start_with("atk-cut", &["--cut-stream-after", "5"]);
    let raw = |addr: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{COMPLETIONS}",
            COMPLETIONS.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        let b = String::from_utf8_lossy(&b).to_string();
        let body = b.split_once("\r\n\r\n").unwrap().1.to_string();
        // The payload of the chunks received.
        let mut out = String::new();
        let mut rest = body.as_str();
        while let Some((size, after)) = rest.split_once("\r\n") {
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
                break;
            };
            if n == 0 || after.len() < n + 2 {
                break;
            }
            out.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        out
    };
    let via = raw(&proxy);
    let want = raw(&direct);
    assert_eq!(
        via,
        want,
        "through the proxy {} bytes, direct {}",
        via.len(),
        want.len()
    );
    let recs = wait_records(&log, 1, Duration::from_secs(20));
    assert!(recs[0]["error"].is_string(), "{}", recs[0]);
    assert_ne!(recs[0]["completion_tokens"], 0);
    stop(run, log);
}

#[test]
fn a_chunked_request_body_is_asked_for_usage_like_any_other() {
    let (run, proxy, direct, log) = start_with("atk-chunked", &[]);
    let s = TcpStream::connect(&proxy).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut w = s.try_clone().unwrap();
    let (a, b) = COMPLETIONS.split_at(10);
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    w.write_all(req.as_bytes()).unwrap();
    let (status, body) = read_response(&mut BufReader::new(s));
    let want = exchange(&direct, &[("/v1/completions", COMPLETIONS)]);
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&want[0].1)
    );
    let recs = wait_records(&log, 1, Duration::from_secs(20));
    assert_eq!(recs[0]["completion_tokens"], 12, "{recs:?}");
    assert_eq!(recs[0]["prompt_tokens"], 3, "{recs:?}");
    stop(run, log);
}

#[test]
fn a_chunked_request_body_over_the_rewrite_limit_is_answered() {
    let (run, proxy, _, log) = start_with("atk-huge", &[]);
    // Over 16 MiB, chunked: read up to the limit, then the rest streams on.
    let pad = "a ".repeat(9 << 20);
    let body = format!(r#"{{"model":"m","prompt":"{pad}","max_tokens":3,"stream":true}}"#);
    let s = TcpStream::connect(&proxy).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut w = s.try_clone().unwrap();
    let bytes = body.as_bytes();
    let mut req =
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for c in bytes.chunks(1 << 20) {
        req.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        req.extend_from_slice(c);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let writer = std::thread::spawn(move || w.write_all(&req).unwrap());
    let (status, _) = read_response(&mut BufReader::new(s));
    writer.join().unwrap();
    assert_eq!(status, 200);
    let recs = wait_records(&log, 1, Duration::from_secs(20));
    assert!(recs[0].get("error").is_none(), "{recs:?}");
    assert_ne!(recs[0]["completion_tokens"], 0);
    stop(run, log);
}

#[test]
fn pipelined_requests_are_answered_in_order_with_the_usage_event_cut() {
    let (run, proxy, direct, log) = start_with("atk-pipeline", &["--merge-every", "2"]);
    let reqs = [
        ("/v1/completions", COMPLETIONS),
        ("/v1/chat/completions", CHAT),
        ("/generate", GENERATE),
    ];
    let s = TcpStream::connect(&proxy).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut all = String::new();
    for (path, body) in reqs {
        all.push_str(&post_request(path, body));
    }
    w.write_all(all.as_bytes()).unwrap(); // all at once, before reading
    let mut r = BufReader::new(s);
    let via: Vec<_> = reqs.iter().map(|_| read_response(&mut r)).collect();
    let want = exchange(&direct, &reqs);
    for (i, (v, w)) in via.iter().zip(&want).enumerate() {
        assert_eq!(v.0, w.0, "status of request {i}");
        assert!(v.1 == w.1, "bytes of request {i}");
    }
    let recs = wait_records(&log, 3, Duration::from_secs(20));
    let tokens: Vec<Value> = recs
        .iter()
        .map(|r| r["completion_tokens"].clone())
        .collect();
    assert_eq!(tokens, [12, 9, 7].map(Value::from), "{recs:?}");
    stop(run, log);
}

#[test]
fn a_server_that_answers_before_reading_the_body_still_gets_the_rest_and_the_next_request() {
    // The server rejects on the headers, then reads the body and keeps the connection: the
    // client goes on sending the body after the answer, then sends its next request.
    let (run, proxy, direct, log) = start_with(
        "atk-early-answer",
        &["--api-key", "k", "--reject-before-body"],
    );
    let big = "a".repeat(20 << 20);
    for addr in [&direct, &proxy] {
        let s = TcpStream::connect(addr.as_str()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let head = format!(
            "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            big.len()
        );
        w.write_all(head.as_bytes()).unwrap();
        let (status, _) = read_response(&mut r);
        assert_eq!(status, 401, "{addr}");
        let body = big.clone();
        let sender = std::thread::spawn(move || {
            w.write_all(body.as_bytes())?;
            w.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        });
        let (status, _) = read_response(&mut r);
        assert_eq!(status, 200, "the request after the body, via {addr}");
        sender.join().unwrap().unwrap();
    }
    stop(run, log);
}
