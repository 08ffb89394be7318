//! JSON as Python's `json` writes it: bare `NaN`, `Infinity` and `-Infinity` tokens (not JSON)
//! become `null` (absent, never a made-up number), and a JSON-lines file (bench_serving appends
//! one result per run) reads as its last line. Shared by the readers of benchmark results.
use serde_json::Value;

/// `text` with Python's non-finite number tokens outside strings replaced by `null`.
pub fn sanitize(text: &str) -> std::borrow::Cow<'_, str> {
    if !["NaN", "Infinity"].iter().any(|t| text.contains(t)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied, mut in_str, mut esc) = (0, 0, false, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            i += 1;
            continue;
        }
        let token = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| b[i..].starts_with(t.as_bytes()));
        if let Some(t) = token {
            out.push_str(&text[copied..i]);
            out.push_str("null");
            i += t.len();
            copied = i;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out)
}

/// Parse one JSON document written by Python.
pub fn parse(text: &str) -> serde_json::Result<Value> {
    serde_json::from_str(&sanitize(text))
}

/// A result file: one JSON document, or JSON lines whose last non-empty line is the latest run.
pub fn parse_result(text: &str) -> serde_json::Result<Value> {
    match parse(text) {
        Ok(v) => Ok(v),
        Err(e) => match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) if last.len() < text.trim().len() => parse(last),
            _ => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tokens_become_null_outside_strings() {
        let v =
            parse(r#"{"a": NaN, "b": -Infinity, "c": [Infinity], "d": "NaN Infinity", "e": 1}"#)
                .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": null, "b": null, "c": [null], "d": "NaN Infinity", "e": 1})
        );
    }

    #[test]
    fn json_lines_read_as_their_last_run() {
        let v = parse_result("{\"completed\": 1}\n{\"completed\": 2, \"x\": NaN}\n\n").unwrap();
        assert_eq!(v["completed"], 2);
        assert!(parse_result("{\"a\": 1").is_err());
    }
}
