//! Proxy overhead, side by side: the same streamed `/generate` load sent alternately straight to
//! the server and through the supervisor's proxy. Prints medians of TTFT and E2E per side and
//! their ratios. usage: proxy-bench DIRECT_ADDR PROXY_ADDR [STREAMS] [TOKENS] [ROUNDS]
use sglang_supervisor_tests::{median, post_timed};
use std::time::Instant;

fn round(addr: &str, streams: usize, tokens: usize) -> (Vec<f64>, Vec<f64>, f64) {
    let body =
        format!(r#"{{"text":"x","sampling_params":{{"max_new_tokens":{tokens}}},"stream":true}}"#);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..streams)
        .map(|_| {
            let (a, b) = (addr.to_string(), body.clone());
            std::thread::spawn(move || post_timed(&a, "/generate", &b))
        })
        .collect();
    let (mut ttft, mut e2e) = (Vec::new(), Vec::new());
    for h in handles {
        if let Ok(Ok(t)) = h.join() {
            ttft.push(t.first_text.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0));
            e2e.push(t.total.as_secs_f64() * 1000.0);
        }
    }
    (ttft, e2e, t0.elapsed().as_secs_f64())
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 3 {
        eprintln!("usage: proxy-bench DIRECT_ADDR PROXY_ADDR [STREAMS=64] [TOKENS=256] [ROUNDS=5]");
        std::process::exit(2);
    }
    let num = |i: usize, d: usize| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (streams, tokens, rounds) = (num(3, 64), num(4, 256), num(5, 5));
    let (mut d_ttft, mut d_e2e, mut p_ttft, mut p_e2e, mut d_wall, mut p_wall) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let (t, e, w) = round(&a[1], streams, tokens);
        d_ttft.extend(t);
        d_e2e.extend(e);
        d_wall.push(w);
        let (t, e, w) = round(&a[2], streams, tokens);
        p_ttft.extend(t);
        p_e2e.extend(e);
        p_wall.push(w);
    }
    let (dt, de, pt, pe) = (
        median(&mut d_ttft),
        median(&mut d_e2e),
        median(&mut p_ttft),
        median(&mut p_e2e),
    );
    let (dw, pw) = (median(&mut d_wall), median(&mut p_wall));
    println!("{rounds} rounds x {streams} concurrent streams x {tokens} tokens, alternating");
    println!("direct: median TTFT {dt:.2} ms, median E2E {de:.1} ms, round wall {dw:.3} s");
    println!("proxy : median TTFT {pt:.2} ms, median E2E {pe:.1} ms, round wall {pw:.3} s");
    println!(
        "ratios proxy/direct: TTFT {:.3}, E2E {:.4}, wall {:.4}; added median TTFT {:.2} ms",
        pt / dt,
        pe / de,
        pw / dw,
        pt - dt
    );
}
