//! Exporters: the Prometheus `/metrics` endpoint for the supervised server and its GPUs (with the
//! server's own `sglang:*` series re-exposed), the latency-measuring proxy, and
//! the passive tap that measures the same requests with no hop in between.
pub mod listen;
pub mod metrics;
pub mod proxy;
pub mod report;
pub mod server;
pub mod tap;

/// A switch's value as written in the environment: `true`, `yes`, `on`, `1` or `false`, `no`,
/// `off`, `0`, in any case, around spaces; empty is off (`export VAR=` turns a switch off).
/// `None`: none of those.
pub fn switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_switch_is_one_of_the_words_said_in_any_case_and_empty_is_off() {
        for on in ["1", "true", " TRUE ", "Yes", "on\n"] {
            assert_eq!(super::switch(on), Some(true), "{on:?}");
        }
        for off in ["", " ", "0", "False", "NO", "off"] {
            assert_eq!(super::switch(off), Some(false), "{off:?}");
        }
        for neither in ["y", "t", "2", "01", "maybe", "on off"] {
            assert_eq!(super::switch(neither), None, "{neither:?}");
        }
    }
}
