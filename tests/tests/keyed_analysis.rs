//! `scripts/gpu/keyed.py`, the analysis of the acceptance's keyed arm (the tap on and off in
//! turns within one benchmark run), on a synthetic run whose effect is known: it must find a 2 %
//! slowdown in the on-turns, and none where there is none. A device call is too dear to find a
//! bug in it there.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report; it runs the script directly
mod common;
use common::{temp_dir, ExpectSuccess};
use std::path::Path;
use std::process::Command;

/// A synthetic run's shape: 32 clients, each sending 100-event requests back to back for 100 s,
/// an event every 10 ms (`slower` times that inside the slowed on-turns); on-turns of 5 s every
/// 10 s, ready 50 ms after their start.
#[derive(Clone, Copy)]
struct Shape {
    slower: f64,
    /// The clients start together and send the next request 20 ms after the last event, so
    /// requests end in waves, as a real server's batch ends them.
    lockstep: bool,
    /// The time to first token (a wave's prefill, when no request sends an event).
    ttft: f64,
    /// On-turns alternate the tap (slowed) and its control (not), as SIDES=keyedmix runs them.
    mix: bool,
    /// The client is killed then (its `timeout`): no event after it.
    killed_at: Option<f64>,
    /// One tap keyed by swapping its filter (SIDES=keyedtog): turns of kind "tog", watching
    /// from the swap itself.
    toggled: bool,
    /// RUN.cpu also holds the HTTP process's cycles, instructions and kernel cycles, as
    /// scripts/gpu/cpu_trace.py writes them where the machine lends counters.
    counters: bool,
}

const PLAIN: Shape = Shape {
    slower: 1.0,
    lockstep: false,
    ttft: 0.004,
    mix: false,
    killed_at: None,
    toggled: false,
    counters: false,
};

/// Writes the client's stamps (RUN.chunks, RUN.begun) and the turns (KEYS) of a run of `shape`.
fn synthetic(dir: &Path, shape: Shape) -> (String, String) {
    let Shape {
        slower,
        lockstep,
        ttft,
        mix,
        killed_at,
        toggled,
        counters,
    } = shape;
    // on-turn k spans 1005 + 10k .. 1010 + 10k; with `mix` only the even ones (the tap's) slow
    let on = |t: f64| t.rem_euclid(10.0) >= 5.0 && !(mix && ((t - 1_005.0) / 10.0) as i64 % 2 == 1);
    let (mut events, mut begun) = (Vec::new(), Vec::new());
    for client in 0..32 {
        let mut t = if lockstep {
            1_000.0
        } else {
            1_000.0 + client as f64 / 32.0
        };
        while t < 1_100.0 {
            let n = begun.len();
            begun.push(t);
            t += ttft;
            for _ in 0..100 {
                events.push((t, n as f64));
                t += if on(t) { 0.010 * slower } else { 0.010 };
            }
            if lockstep {
                t += 0.010;
            }
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let Some(at) = killed_at {
        // (a request begun later has no event, and keyed.py knows requests by their events)
        events.retain(|(t, _)| *t <= at);
    }
    let run = dir.join("run.jsonl");
    let bytes: Vec<u8> = events
        .iter()
        .flat_map(|(t, n)| [t.to_le_bytes(), n.to_le_bytes()].concat())
        .collect();
    std::fs::write(format!("{}.chunks", run.display()), bytes).unwrap();
    let lines: String = begun
        .iter()
        .enumerate()
        .map(|(n, t)| format!("{n} {t:.6}\n"))
        .collect();
    std::fs::write(format!("{}.begun", run.display()), lines).unwrap();
    // the server's HTTP process: 45 µs of user time an event, 4.5 µs of system time, 5.0 µs in
    // the slowed turns (the tap's copy of each segment), sampled every 0.1 s as RUN.cpu; with
    // `counters`, 100 000 cycles an event (10 000 in the kernel) and 80 000 instructions, the
    // slowed turns' kernel 1 000 cycles and 500 instructions more
    let (mut user, mut sys, mut next) = (0.0, 0.0, events.iter().peekable());
    let (mut cycles, mut instructions, mut kernel) = (0u64, 0u64, 0u64);
    let samples: String = (0..=1_000)
        .map(|k| {
            let at = 1_000.0 + k as f64 * 0.1;
            while let Some((t, _)) = next.next_if(|(t, _)| *t <= at) {
                let slowed = on(*t) && slower != 1.0;
                user += 45e-6;
                sys += if slowed { 5.0e-6 } else { 4.5e-6 };
                let more = if slowed { 1_000 } else { 0 };
                cycles += 100_000 + more;
                kernel += 10_000 + more;
                instructions += 80_000 + more / 2;
            }
            let line = format!("{at:.6} {user:.6} {sys:.6}");
            match counters {
                true => format!("{line} {cycles} {instructions} {kernel}\n"),
                false => line + "\n",
            }
        })
        .collect();
    std::fs::write(format!("{}.cpu", run.display()), samples).unwrap();
    let keys = dir.join("run.keys");
    let turns: String = (0..10)
        .map(|k| {
            let start = 1_005.0 + 10.0 * k as f64;
            let kind = match (mix, k % 2) {
                _ if toggled => " tog",
                (false, _) => "",
                (true, 0) => " tap",
                (true, _) => " ctl",
            };
            let ready = if toggled { start } else { start + 0.05 };
            format!("{start} {ready} {}{kind}\n", start + 5.0)
        })
        .collect();
    std::fs::write(&keys, turns).unwrap();
    (
        run.to_str().unwrap().to_string(),
        keys.to_str().unwrap().to_string(),
    )
}

/// keyed.py's on/off ratio for the metric whose line starts with `label`.
fn ratio(out: &str, label: &str) -> f64 {
    ratio_of(out, label, "on/off")
}

/// Asserts keyed.py's on/off ratio for `label` lies in `range`.
fn ratio_within(out: &str, label: &str, range: std::ops::Range<f64>) {
    let r = ratio(out, label);
    assert!(
        range.contains(&r),
        "{label} on/off {r}, not in {range:?}:\n{out}"
    );
}

/// keyed.py's ratio `which` ("tap/ctl", ...) on the first line that starts with `label` and has it.
fn ratio_of(out: &str, label: &str, which: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label) && l.contains(which))
        .unwrap_or_else(|| panic!("no {label} line with {which} in:\n{out}"));
    let after = line.split(&format!("{which} ")).nth(1).unwrap();
    let value = after.split(',').next().unwrap().trim();
    value
        .parse()
        .unwrap_or_else(|_| panic!("{label}: {value:?} in:\n{out}"))
}

/// keyed.py's output on a synthetic run; `test` names the run's folder apart from those of the
/// tests beside it (they run at once).
fn analyse(test: &str, shape: Shape) -> String {
    let dir = temp_dir(&format!("keyed-{test}-{}", (shape.slower * 1000.0) as u64));
    let (run, keys) = synthetic(&dir, shape);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu/keyed.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["32", &run, &keys])
        .output()
        .unwrap()
        .expect_success("keyed.py");
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8(out.stdout).unwrap();
    println!("{test}:\n{out}"); // shown with --nocapture, or when the test fails
    out
}

#[test]
fn the_keyed_analysis_finds_a_two_percent_slowdown_in_the_on_turns() {
    let out = analyse(
        "slowdown",
        Shape {
            slower: 1.02,
            ..PLAIN
        },
    );
    ratio_within(&out, "events/s", 0.975..0.985);
    ratio_within(&out, "mean gap (TPOT) ms", 1.015..1.025);
    ratio_within(&out, "median E2E ms", 1.015..1.025);
    assert!(
        out.contains(" 9 on and 9 off"),
        "every turn but the last (the drain) at full concurrency:\n{out}"
    );
}

#[test]
fn a_toggled_taps_turns_are_measured_from_the_swap_and_find_its_slowdown() {
    let out = analyse(
        "toggled",
        Shape {
            slower: 1.02,
            toggled: true,
            ..PLAIN
        },
    );
    let rate = ratio_of(&out, "events/s", "tog/off");
    assert!(
        (0.975..0.985).contains(&rate),
        "events/s tog/off {rate}:\n{out}"
    );
    // a tap started for the turn counts only from when every request in flight began after it
    // (here a second later); the swap reaches every connection at once
    assert!(
        out.contains("(median on 5.00 s, off 5.00 s)"),
        "whole turns:\n{out}"
    );
    let nothing = analyse(
        "toggled-null",
        Shape {
            toggled: true,
            ..PLAIN
        },
    );
    let rate = ratio_of(&nothing, "events/s", "tog/off");
    assert!(
        (0.995..1.005).contains(&rate),
        "events/s tog/off {rate}:\n{nothing}"
    );
}

#[test]
fn the_http_process_cost_an_event_is_read_turn_by_turn() {
    let out = analyse(
        "cpu",
        Shape {
            slower: 1.02,
            ..PLAIN
        },
    );
    let sys = ratio(&out, "HTTP process system us/event");
    let user = ratio(&out, "HTTP process user us/event");
    assert!((1.10..1.12).contains(&sys), "system on/off {sys}:\n{out}");
    assert!((0.995..1.005).contains(&user), "user on/off {user}:\n{out}");
}

/// Where the machine lends counters, the work an event costs the HTTP process is read apart from
/// the speed its CPU ran at: the synthetic server's kernel spends 1 % more cycles an event in
/// the slowed turns.
#[test]
fn the_http_process_cycles_and_instructions_an_event_are_read_turn_by_turn() {
    let out = analyse(
        "counters",
        Shape {
            slower: 1.02,
            counters: true,
            ..PLAIN
        },
    );
    ratio_within(&out, "HTTP process cycles/event", 1.0095..1.0105);
    ratio_within(&out, "HTTP process kernel cycles/event", 1.095..1.105);
    ratio_within(&out, "HTTP process instructions/event", 1.006..1.0065);
    // a trace without counters (three fields a line) has no such lines
    let without = analyse(
        "no-counters",
        Shape {
            slower: 1.02,
            ..PLAIN
        },
    );
    assert!(
        without.contains("HTTP process system us/event"),
        "{without}"
    );
    assert!(!without.contains("cycles"), "{without}");
}

#[test]
fn the_keyed_analysis_finds_nothing_where_nothing_differs() {
    let out = analyse("null", PLAIN);
    for label in ["events/s", "mean gap (TPOT) ms", "median gap ms"] {
        let r = ratio(&out, label);
        assert!((0.995..1.005).contains(&r), "{label} on/off {r}:\n{out}");
    }
}

#[test]
fn requests_ending_in_waves_keep_the_on_turns_as_the_off_turns() {
    // Each on-turn starts at the end of a request, where a wave of others ends too: judged at
    // that instant, every on-turn was dropped and every off-turn kept (three GPU runs kept 1–2
    // on-turns against 3–6 off-turns).
    let out = analyse(
        "waves",
        Shape {
            slower: 1.02,
            lockstep: true,
            ..PLAIN
        },
    );
    assert!(
        out.contains(" 9 on and 9 off"),
        "every turn but the drain's kept:\n{out}"
    );
    let gap = ratio(&out, "mean gap (TPOT) ms");
    assert!(
        (1.015..1.025).contains(&gap),
        "mean gap on/off {gap}:\n{out}"
    );
}

#[test]
fn an_on_turn_that_starts_where_a_wave_ends_is_not_read_as_slower() {
    // An on-turn counts from the end of the last request the tap did not see begin: in lockstep
    // that is where a wave ends and the next wave's prefill begins, when no events come. Counted
    // from an ordinary instant, the off-turns held no such gap, and this run, with nothing
    // slower, read 0.958 (0.928–0.988); a GPU run read three of four on-turns 13 % slower.
    let out = analyse(
        "phase",
        Shape {
            lockstep: true,
            ttft: 0.3,
            ..PLAIN
        },
    );
    let rate = ratio(&out, "events/s");
    assert!(
        (0.99..1.01).contains(&rate),
        "events/s on/off {rate}:\n{out}"
    );
}

#[test]
fn the_tap_and_its_control_in_turn_are_each_held_against_the_off_turns_and_each_other() {
    // SIDES=keyedmix: the tap's turns 2 % slower, its control's not
    let out = analyse(
        "mix",
        Shape {
            slower: 1.02,
            mix: true,
            ..PLAIN
        },
    );
    for (which, lo, hi) in [
        ("tap/off", 0.975, 0.985),
        ("ctl/off", 0.995, 1.005),
        ("tap/ctl", 0.975, 0.985),
    ] {
        let rate = ratio_of(&out, "events/s", which);
        assert!((lo..hi).contains(&rate), "events/s {which} {rate}:\n{out}");
    }
    // the last turn, a control, ends as the clients stop (the drain): not counted
    assert!(
        out.contains(" 5 tap turns and 4 ctl turns at full concurrency"),
        "{out}"
    );
}

#[test]
fn a_run_stopped_inside_its_last_on_turn_does_not_read_that_turn_as_slower() {
    // The keys end with an on-turn, so a client stopped by its timeout stops inside one. Stopped
    // 0.3 s before its end, the turn was at 94 % concurrency on average, was kept, was held
    // against the off-turn before it alone, and the run read 0.992 with nothing slower. A turn
    // now counts only with kept turns on both sides, and none past the last request's begin.
    let out = analyse(
        "killed",
        Shape {
            killed_at: Some(1_099.7),
            ..PLAIN
        },
    );
    let rate = ratio(&out, "events/s");
    assert!(
        (0.995..1.005).contains(&rate),
        "events/s on/off {rate}:\n{out}"
    );
}

#[test]
fn saved_outputs_of_two_calls_pool_into_one_verdict_over_all_their_turns() {
    let dir = temp_dir("keyed-pool");
    let (slow, same) = (dir.join("slow.txt"), dir.join("same.txt"));
    // a call's summary holds each run's lines twice (after the run, and in the pooled verdict)
    let slow_run = analyse(
        "pool",
        Shape {
            slower: 1.02,
            ..PLAIN
        },
    );
    std::fs::write(&slow, format!("{slow_run}{slow_run}")).unwrap();
    std::fs::write(&same, analyse("pool", PLAIN)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu/keyed.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--pool")
        .args([&slow, &same])
        .output()
        .unwrap()
        .expect_success("keyed.py --pool");
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8(out.stdout).unwrap();
    // both runs' turns in one verdict: half of them 2 % slower, half not
    let line = pooled(&out, "c=32 sglang run on/off (run 2 runs), events/s:");
    // of each run's 10 on-turns, the first has no off-turn before it and the last ends in the drain
    assert!(line.ends_with(", 16 turns"), "{line}");
    let rate = pooled_value(line);
    assert!((0.985..0.995).contains(&rate), "{line}");
}

/// The pooled line that starts with "keyed, pooled, " and then `what`.
fn pooled<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("keyed, pooled, {what}")))
        .unwrap_or_else(|| panic!("no pooled {what:?} line in:\n{out}"))
}

/// The number that follows `word` on a pooled line ("... system +0.500 us ...").
fn number_after(line: &str, word: &str) -> f64 {
    let rest = line
        .split(word)
        .nth(1)
        .unwrap_or_else(|| panic!("{word:?} in {line}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// The ratio on a pooled line ("...: 0.9900, 95 % interval ...").
fn pooled_value(line: &str) -> f64 {
    let after = line.split(": ").nth(1).unwrap();
    after.split(',').next().unwrap().trim().parse().unwrap()
}

/// keyed.py --pool over the given saved outputs, with more arguments before them.
fn pool(test: &str, outputs: &[(&str, String)], args: &[&str]) -> String {
    let dir = temp_dir(&format!("keyed-pool-{test}"));
    let paths: Vec<_> = outputs
        .iter()
        .map(|(name, text)| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu/keyed.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--pool")
        .args(args)
        .args(&paths)
        .output()
        .unwrap()
        .expect_success("keyed.py --pool");
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8(out.stdout).unwrap();
    println!("{test}:\n{out}");
    out
}

/// A saved output as if its run were `name` (c32-keyed-1.jsonl: the keyed arm's first run).
fn as_run(out: &str, name: &str) -> String {
    out.replace("\"run\": \"run.jsonl\"", &format!("\"run\": \"{name}\""))
}

#[test]
fn the_keyed_arms_tap_turns_and_keyedmixs_pool_into_one_tap_against_off_verdict() {
    let slow = Shape {
        slower: 1.02,
        ..PLAIN
    };
    let keyed = as_run(&analyse("pool-keyed", slow), "c32-keyed-1.jsonl");
    let mix = as_run(
        &analyse("pool-mix", Shape { mix: true, ..slow }),
        "c32-keyedmix-1.jsonl",
    );
    let out = pool("arms", &[("keyed.txt", keyed), ("mix.txt", mix)], &[]);
    // keyed: 8 on-turns with both neighbours kept; keyedmix: 4 of its 5 tap turns (the first
    // has no off-turn before it)
    let line = pooled(
        &out,
        "c=32 sglang tap/off (keyed 1 run, keyedmix/tap 1 run), events/s:",
    );
    assert!(line.ends_with(", 12 turns"), "{line}");
    assert!((0.975..0.985).contains(&pooled_value(line)), "{line}");
    let ctl = pooled(&out, "c=32 sglang ctl/off (keyedmix/ctl 1 run), events/s:");
    assert!((0.995..1.005).contains(&pooled_value(ctl)), "{ctl}");
    let vs = pooled(
        &out,
        "c=32 sglang tap/ctl (keyedmix/tap-vs-ctl 1 run), events/s:",
    );
    assert!((0.975..0.985).contains(&pooled_value(vs)), "{vs}");
}

#[test]
fn runs_of_two_backends_are_never_pooled_together() {
    let keyed = as_run(&analyse("pool-backend", PLAIN), "c32-keyed-1.jsonl");
    // a line saved with its backend, and one saved before backends were printed
    let chat = keyed.replace(
        "\"ratios\":",
        "\"backend\": \"sglang-oai-chat\", \"ratios\":",
    );
    let out = pool(
        "backends",
        &[("chat.txt", chat), ("old.txt", keyed.clone())],
        &[],
    );
    pooled(&out, "c=32 sglang tap/off (keyed 1 run), events/s:");
    pooled(
        &out,
        "c=32 sglang-oai-chat tap/off (keyed 1 run), events/s:",
    );
    // --backend names what an old line's runs used
    let out = pool(
        "backend-named",
        &[("old.txt", keyed)],
        &["--backend", "sglang-oai"],
    );
    pooled(&out, "c=32 sglang-oai tap/off (keyed 1 run), events/s:");
}

/// Neighbouring toggled turns share an off-turn, as the keyed arm's do: pooled alone, a toggled
/// run keeps the interval its own analysis printed (a review found the pool narrowing it).
#[test]
fn a_toggled_run_pooled_alone_keeps_the_interval_of_its_own_analysis() {
    let saved = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/real-h200-supervised/summary_s24_call2.txt");
    let text = std::fs::read_to_string(&saved).unwrap();
    let own = text
        .lines()
        .find(|l| l.trim_start().starts_with("events/s: tog median"))
        .unwrap();
    let interval = own.split("tog/off ").nth(1).unwrap();
    let out = pool("pool-tog", &[("s24_call2.txt", text.clone())], &[]);
    let line = pooled(
        &out,
        "c=128 sglang-oai-chat tap/off, toggled (keyedtog/tog 1 run), events/s:",
    );
    assert!(
        line.ends_with(interval),
        "pooled {line:?}, the run's own {interval:?}"
    );
}

/// What the acceptance reads as the tap's cost to the process that sets the pace: a toggled
/// run's HTTP process CPU per event, each on-turn less the mean of the off-turns beside it, in
/// µs and as a share of that process's CPU (the synthetic server pays 0.5 µs more system time
/// an event in its on-turns, of 49.5 µs).
#[test]
fn pooled_toggled_runs_give_the_cpu_an_event_each_on_turn_adds_to_the_http_process() {
    let out = as_run(
        &analyse(
            "pool-cpu",
            Shape {
                slower: 1.02,
                toggled: true,
                ..PLAIN
            },
        ),
        "c32-keyedtog-1.jsonl",
    );
    // the same file named twice counts once
    let twice = pool(
        "cpu-twice",
        &[("tog.txt", out.clone()), ("tog.txt", out.clone())],
        &[],
    );
    let out = pool("cpu", &[("tog.txt", out)], &[]);
    assert_eq!(out, twice, "the same file twice");
    let line = pooled(&out, "c=32 sglang toggled, HTTP process CPU per event");
    let after = |word: &str| number_after(line, word);
    assert!((0.48..0.52).contains(&after("system ")), "{line}");
    assert!(
        (0.97..1.05).contains(&after("), ")),
        "share of its CPU: {line}"
    );
    assert!(after("user ").abs() < 0.02, "{line}");
    assert!(line.contains(", 8 turns:"), "{line}");
}

/// A toggled run 2 % slower in its on-turns, with counter columns (cycles 1 %, kernel cycles
/// 10 % and instructions 0.625 % more an event), saved as the keyed arm's first run.
fn toggled_with_counters(test: &str) -> String {
    as_run(
        &analyse(
            test,
            Shape {
                slower: 1.02,
                toggled: true,
                counters: true,
                ..PLAIN
            },
        ),
        "c32-keyedtog-1.jsonl",
    )
}

/// Pooled toggled runs with counters also give what each on-turn adds in cycles, kernel cycles
/// and instructions an event, as shares of the off-turns' (1 %, 1 % and 0.625 % here).
#[test]
fn pooled_toggled_runs_with_counters_give_the_share_of_cycles_each_on_turn_adds() {
    let out = toggled_with_counters("pool-counters");
    let out = pool("counters", &[("tog.txt", out)], &[]);
    let line = pooled(&out, "c=32 sglang toggled, HTTP process counters per event");
    let after = |word: &str| number_after(line, word);
    assert!((0.99..1.01).contains(&after("turns: cycles ")), "{line}");
    assert!((0.99..1.01).contains(&after("kernel cycles ")), "{line}");
    assert!((0.62..0.63).contains(&after("instructions ")), "{line}");
    assert!(line.contains(", 8 turns:"), "{line}");
    let cycles = pooled(
        &out,
        "c=32 sglang tap/off, toggled (keyedtog/tog 1 run), HTTP process cycles/event",
    );
    assert!((1.0095..1.0105).contains(&pooled_value(cycles)), "{cycles}");
}

/// The same runs read with `--counters software` (traces of the kernel's task clock, context
/// switches and page faults, in the same columns): each named so, and each a share of its own
/// off-turns' count, page faults too (not of the task clock, as kernel cycles are of cycles).
#[test]
fn pooled_runs_with_software_counters_name_them_and_give_each_as_a_share_of_its_own() {
    let out = toggled_with_counters("pool-software");
    let out = pool("software", &[("tog.txt", out)], &["--counters", "software"]);
    let line = pooled(
        &out,
        "c=32 sglang toggled, HTTP process software counters per event",
    );
    let after = |word: &str| number_after(line, word);
    assert!(
        (0.99..1.01).contains(&after("turns: task clock ns ")),
        "{line}"
    );
    assert!((0.62..0.63).contains(&after("context switches ")), "{line}");
    assert!((9.9..10.1).contains(&after("page faults ")), "{line}");
    assert!(
        !out.contains("kernel cycles") && !out.contains("cycles/event"),
        "{out}"
    );
    let faults = pooled(
        &out,
        "c=32 sglang tap/off, toggled (keyedtog/tog 1 run), HTTP process page faults/event",
    );
    assert!((1.095..1.105).contains(&pooled_value(faults)), "{faults}");
}

/// scripts/gpu/cpu_trace.py counts every thread of the process, those begun after the trace
/// too. The dev machines lend no hardware counters, so this runs the same code with the
/// kernel's software ones (CPU_TRACE_COUNTERS=software): the task clock summed over the
/// threads is the process's CPU time.
#[test]
fn the_cpu_trace_counts_every_thread_of_the_process_those_begun_after_it_too() {
    let dir = temp_dir("cpu-trace-threads");
    // the work is all in a thread begun 0.5 s after the process (the trace has seen it by then)
    let busy = "import threading, time\n\
                def spin():\n    end = time.time() + 0.6\n    while time.time() < end: pass\n\
                time.sleep(0.5)\nt = threading.Thread(target=spin); t.start(); t.join()\n\
                time.sleep(0.3)\n";
    let mut child = Command::new("python3").args(["-c", busy]).spawn().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu/cpu_trace.py");
    let trace = dir.join("run.cpu");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            &child.id().to_string(),
            trace.to_str().unwrap(),
            "/nonexistent-stop",
            "0.05",
        ])
        .env("CPU_TRACE_COUNTERS", "software")
        .output()
        .unwrap();
    child.wait().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        said.contains(
            "software counters (task clock, context switches, page faults) over 2 threads"
        ),
        "{said}"
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let last: Vec<f64> = text
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    assert_eq!(last.len(), 6, "{text}");
    let (cpu_s, task_clock_s) = (last[1] + last[2], last[3] / 1e9);
    // its spin is 0.6 s of wall time: on a loaded machine it gets less CPU, never none, and
    // the task clock then has it only if the late thread was counted
    assert!(cpu_s > 0.1, "the late thread ran: {cpu_s} s\n{text}");
    assert!(
        (task_clock_s - cpu_s).abs() < 0.05 + 0.1 * cpu_s,
        "task clock {task_clock_s} s against user + system {cpu_s} s\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_without_bench_servings_output_is_filed_under_the_backend_its_arm_was_given() {
    // A run stopped by its timeout printed no "Backend:" line; its turns are the keyed arm's.
    let dir = temp_dir("keyed-backend-given");
    let (run, keys) = synthetic(&dir, PLAIN);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu/keyed.py");
    for given in [Some("sglang-oai-chat"), None] {
        let mut keyed = Command::new("python3");
        keyed
            .arg(&script)
            .args(["32", &run, &keys])
            .env_remove("KEYED_BACKEND");
        if let Some(b) = given {
            keyed.env("KEYED_BACKEND", b);
        }
        let out = keyed.output().unwrap().expect_success("keyed.py");
        let out = String::from_utf8(out.stdout).unwrap();
        let line = out
            .lines()
            .find(|l| l.starts_with("keyed-ratios "))
            .unwrap_or_else(|| panic!("no keyed-ratios line: {out}"));
        match given {
            Some(b) => assert!(line.contains(&format!("\"backend\": \"{b}\"")), "{line}"),
            None => assert!(!line.contains("\"backend\""), "{line}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pooled a run at a time (from three runs): each run's own ratio is one value, their geometric
/// mean the figure, so that runs differing among themselves widen the interval; with two runs
/// there is no such line.
#[test]
fn three_saved_runs_are_also_pooled_a_run_at_a_time() {
    let slower = |by: f64| {
        analyse(
            "pool-runs",
            Shape {
                slower: by,
                ..PLAIN
            },
        )
    };
    let runs = [
        ("a.txt", slower(1.04)),
        ("b.txt", slower(1.0)),
        ("c.txt", slower(1.02)),
    ];
    let own: Vec<f64> = runs
        .iter()
        .map(|(name, text)| {
            let out = pool("runs-own", &[(name, text.clone())], &[]);
            pooled_value(pooled(
                &out,
                "c=32 sglang run on/off (run 1 run), events/s:",
            ))
        })
        .collect();
    let out = pool("runs", &runs, &[]);
    let line = pooled(&out, "c=32 sglang run on/off, a run at a time, events/s:");
    assert!(line.ends_with(", 3 runs"), "{line}");
    let want = (own.iter().map(|r| r.ln()).sum::<f64>() / 3.0).exp();
    assert!(
        (pooled_value(line) - want).abs() < 1e-3,
        "{line}: want {want} from {own:?}"
    );
    let two = pool("runs-two", &runs[..2], &[]);
    assert!(!two.contains("a run at a time"), "{two}");
}
