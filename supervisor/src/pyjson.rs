//! JSON as Python's `json` writes it: the bare tokens `NaN` (becomes `null`: no measurement,
//! never a made-up number) and `Infinity`/`-Infinity` (become `"inf"`/`"-inf"`, the way
//! InferenceX writes an infinite request rate; read as a number they are absent too), and
//! JSON-lines files (bench_serving appends one result per run). Shared by every reader of
//! benchmark results (`compare`, `report --bench-result`).
use serde_json::Value;

/// `text` with Python's non-finite number tokens outside strings made JSON; strings untouched.
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
        let token = [
            ("-Infinity", "\"-inf\""),
            ("Infinity", "\"inf\""),
            ("NaN", "null"),
        ]
        .into_iter()
        .find(|(t, _)| b[i..].starts_with(t.as_bytes()));
        if let Some((t, with)) = token {
            out.push_str(&text[copied..i]);
            out.push_str(with);
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

/// Every JSON value of a text: one document, or JSON lines.
pub fn values(text: &str) -> serde_json::Result<Vec<Value>> {
    serde_json::Deserializer::from_str(&sanitize(text))
        .into_iter::<Value>()
        .collect()
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
    fn python_tokens_become_json_outside_strings_only() {
        let v = parse(
            r#"{"a": NaN, "b": -Infinity, "c": [Infinity], "d": "NaN Infinity", "q": "a \"NaN\" \\", "e": 1}"#,
        )
        .unwrap();
        assert_eq!(v["q"], "a \"NaN\" \\");
        let v =
            parse(r#"{"a": NaN, "b": -Infinity, "c": [Infinity], "d": "NaN Infinity", "e": 1}"#)
                .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": null, "b": "-inf", "c": ["inf"], "d": "NaN Infinity", "e": 1})
        );
    }

    #[test]
    fn json_lines_read_as_their_last_run() {
        let v = parse_result("{\"completed\": 1}\n{\"completed\": 2, \"x\": NaN}\n\n").unwrap();
        assert_eq!(v["completed"], 2);
        assert!(parse_result("{\"a\": 1").is_err());
    }
}
