//! A reader for the Python literals SGLang prints in its `server_args=` line.
//!
//! Two forms exist: 0.5.14 logs the dataclass repr `ServerArgs(model_path='...', ...)` (with nested
//! reprs such as `CudaGraphConfig(decode=PhaseConfig(...))`), 0.5.19+ logs `resolved_dict()`, a
//! dict repr. Both are Python, not JSON (`None`, `True`, `'...'`, tuples). We read them into JSON
//! without evaluating anything. A value we cannot read becomes its raw text as a string, so one odd
//! field never costs the others; nothing here can panic or recurse without bound.
use serde_json::{Map, Number, Value};

/// Nesting deeper than this is read as raw text (no real repr comes close; it bounds the stack).
const MAX_DEPTH: usize = 64;

/// Parse the text after `server_args=`: `Name(k=v, ...)` or `{'k': v, ...}`.
/// Returns `None` when the text is neither form. Keys that could not be reached (a truncated line)
/// are summarised under `_unparsed` as raw text.
pub fn parse_server_args(text: &str) -> Option<Map<String, Value>> {
    let mut p = Parser {
        s: text.as_bytes(),
        src: text,
        i: 0,
    };
    p.ws();
    match p.peek()? {
        b'{' => match p.value(0) {
            Value::Object(m) => Some(m),
            _ => None,
        },
        c if is_ident_start(c) => {
            p.ident();
            if p.peek() != Some(b'(') {
                return None;
            }
            p.i += 1;
            Some(p.call_args(0))
        }
        _ => None,
    }
}

struct Parser<'a> {
    s: &'a [u8],
    src: &'a str,
    i: usize,
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> &'a str {
        let start = self.i;
        while self.peek().is_some_and(is_ident) {
            self.i += 1;
        }
        &self.src[start..self.i]
    }

    /// One value; on failure, the raw text up to the next separator at this level.
    fn value(&mut self, depth: usize) -> Value {
        self.ws();
        let start = self.i;
        match self.try_value(depth) {
            Some(v) => {
                // A value must be followed by a separator or a closer; otherwise it was only the
                // start of something we do not read (`torch.bfloat16`, `a + b`).
                self.ws();
                match self.peek() {
                    None | Some(b',' | b')' | b']' | b'}' | b':') => v,
                    _ => self.raw_from(start),
                }
            }
            None => self.raw_from(start),
        }
    }

    fn try_value(&mut self, depth: usize) -> Option<Value> {
        if depth >= MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'\'' | b'"' => self.string().map(Value::String),
            b'{' => {
                self.i += 1;
                self.dict_or_set(depth + 1)
            }
            b'[' => {
                self.i += 1;
                self.sequence(b']', depth + 1).map(Value::Array)
            }
            b'(' => {
                self.i += 1;
                self.sequence(b')', depth + 1).map(Value::Array)
            }
            b'0'..=b'9' | b'-' | b'+' | b'.' => self.number(),
            c if is_ident_start(c) => {
                let word = self.ident();
                match word {
                    "None" => Some(Value::Null),
                    "True" => Some(Value::Bool(true)),
                    "False" => Some(Value::Bool(false)),
                    // Python's repr of float('inf') / float('nan'); JSON has no such numbers.
                    "inf" | "nan" => Some(Value::String(word.to_string())),
                    // String prefixes: r'..', b'..', u'..' (rare in reprs, but cheap to read).
                    "r" | "b" | "u" | "rb" | "br" if matches!(self.peek(), Some(b'\'' | b'"')) => {
                        let raw = word.contains('r');
                        if raw {
                            self.raw_string().map(Value::String)
                        } else {
                            self.string().map(Value::String)
                        }
                    }
                    _ if self.peek() == Some(b'(') => {
                        self.i += 1;
                        let args = self.call_args(depth + 1);
                        // `PosixPath('/x')`-style wrappers of one positional value read as that value.
                        if args.len() == 1 {
                            if let Some(Value::Array(a)) = args.get("_args") {
                                if a.len() == 1 {
                                    return Some(a[0].clone());
                                }
                            }
                        }
                        Some(Value::Object(args))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Everything from `start` to the next `,` / closer at this nesting level, as a string.
    fn raw_from(&mut self, start: usize) -> Value {
        self.i = start;
        let mut depth = 0usize;
        while let Some(c) = self.peek() {
            match c {
                b'\'' | b'"' => {
                    if self.string().is_none() {
                        self.i = self.s.len();
                    }
                    continue;
                }
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => {
                    if depth == 0 {
                        break;
                    }
                    depth -= 1;
                }
                b',' if depth == 0 => break,
                _ => {}
            }
            self.i += 1;
        }
        let end = self.i.min(self.s.len());
        Value::String(self.slice(start, end).trim().to_string())
    }

    /// A UTF-8-safe slice (positions can land inside a multi-byte char only on broken input).
    fn slice(&self, start: usize, end: usize) -> &'a str {
        let mut s = start.min(self.src.len());
        let mut e = end.min(self.src.len());
        while !self.src.is_char_boundary(s) {
            s += 1;
        }
        while e > s && !self.src.is_char_boundary(e) {
            e -= 1;
        }
        &self.src[s..e.max(s)]
    }

    fn string(&mut self) -> Option<String> {
        let q = self.peek()?;
        self.i += 1;
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote or backslash in one go.
            let run_start = self.i;
            while let Some(c) = self.peek() {
                if c == q || c == b'\\' {
                    break;
                }
                self.i += 1;
            }
            out.push_str(self.slice(run_start, self.i));
            match self.peek()? {
                c if c == q => {
                    self.i += 1;
                    return Some(out);
                }
                _ => {
                    self.i += 1;
                    let e = self.peek()?;
                    self.i += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'0' => out.push('\0'),
                        b'a' => out.push('\x07'),
                        b'b' => out.push('\x08'),
                        b'f' => out.push('\x0c'),
                        b'v' => out.push('\x0b'),
                        b'\\' => out.push('\\'),
                        b'\'' => out.push('\''),
                        b'"' => out.push('"'),
                        b'x' => out.push(self.hex_char(2)?),
                        b'u' => out.push(self.hex_char(4)?),
                        b'U' => out.push(self.hex_char(8)?),
                        other => {
                            // Unknown escape: Python keeps the backslash.
                            out.push('\\');
                            self.i -= 1;
                            if other.is_ascii() {
                                out.push(other as char);
                                self.i += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    fn raw_string(&mut self) -> Option<String> {
        let q = self.peek()?;
        self.i += 1;
        let start = self.i;
        while let Some(c) = self.peek() {
            if c == b'\\' {
                self.i += 2;
                continue;
            }
            if c == q {
                let s = self.slice(start, self.i).to_string();
                self.i += 1;
                return Some(s);
            }
            self.i += 1;
        }
        None
    }

    fn hex_char(&mut self, n: usize) -> Option<char> {
        let end = self.i.checked_add(n)?;
        let digits = self.src.get(self.i..end)?;
        let v = u32::from_str_radix(digits, 16).ok()?;
        self.i = end;
        char::from_u32(v)
    }

    fn number(&mut self) -> Option<Value> {
        let start = self.i;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.i += 1;
        }
        // `-inf` / `-nan`
        if self.peek().is_some_and(is_ident_start) {
            let w = self.ident();
            return matches!(w, "inf" | "nan")
                .then(|| Value::String(self.slice(start, self.i).to_string()));
        }
        let mut float = false;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' | b'_' => {}
                b'.' => float = true,
                b'e' | b'E' => {
                    float = true;
                    if matches!(self.s.get(self.i + 1), Some(b'-' | b'+')) {
                        self.i += 1;
                    }
                }
                _ => break,
            }
            self.i += 1;
        }
        let text: String = self
            .slice(start, self.i)
            .chars()
            .filter(|&c| c != '_')
            .collect();
        if !float {
            if let Ok(v) = text.parse::<i64>() {
                return Some(Value::Number(v.into()));
            }
            if let Ok(v) = text.parse::<u64>() {
                return Some(Value::Number(v.into()));
            }
            // Larger than 64 bits: keep the digits exactly rather than round them.
            return text
                .bytes()
                .skip_while(|&b| b == b'-' || b == b'+')
                .all(|b| b.is_ascii_digit())
                .then_some(Value::String(text));
        }
        let f: f64 = text.parse().ok()?;
        Number::from_f64(f).map(Value::Number)
    }

    fn sequence(&mut self, close: u8, depth: usize) -> Option<Vec<Value>> {
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Some(items);
            }
            items.push(self.value(depth));
            if self.eat(b',') {
                continue;
            }
            if self.eat(close) {
                return Some(items);
            }
            return None;
        }
    }

    fn dict_or_set(&mut self, depth: usize) -> Option<Value> {
        if self.eat(b'}') {
            return Some(Value::Object(Map::new()));
        }
        let first = self.value(depth);
        if self.eat(b':') {
            let mut map = Map::new();
            let v = self.value(depth);
            map.insert(key_text(first), v);
            loop {
                if self.eat(b'}') {
                    return Some(Value::Object(map));
                }
                if !self.eat(b',') {
                    return None;
                }
                if self.eat(b'}') {
                    return Some(Value::Object(map));
                }
                let k = self.value(depth);
                if !self.eat(b':') {
                    return None;
                }
                let v = self.value(depth);
                map.insert(key_text(k), v);
            }
        }
        // A set literal.
        let mut items = vec![first];
        loop {
            if self.eat(b'}') {
                return Some(Value::Array(items));
            }
            if !self.eat(b',') {
                return None;
            }
            if self.eat(b'}') {
                return Some(Value::Array(items));
            }
            items.push(self.value(depth));
        }
    }

    /// `k=v, ...)` after the opening parenthesis of a call; positional values go to `_args`.
    /// Structural trouble stops reading and keeps the rest as `_unparsed`.
    fn call_args(&mut self, depth: usize) -> Map<String, Value> {
        let mut map = Map::new();
        let mut positional = Vec::new();
        loop {
            if self.eat(b')') {
                break;
            }
            self.ws();
            let save = self.i;
            let key = if self.peek().is_some_and(is_ident_start) {
                let k = self.ident();
                if self.eat(b'=') {
                    Some(k.to_string())
                } else {
                    self.i = save;
                    None
                }
            } else {
                None
            };
            let v = self.value(depth);
            match key {
                Some(k) => {
                    map.insert(k, v);
                }
                None => positional.push(v),
            }
            if self.eat(b',') {
                continue;
            }
            if self.eat(b')') {
                break;
            }
            let rest = self.slice(self.i, self.s.len()).trim();
            if !rest.is_empty() {
                map.insert("_unparsed".into(), Value::String(rest.to_string()));
            }
            self.i = self.s.len();
            break;
        }
        if !positional.is_empty() {
            map.insert("_args".into(), Value::Array(positional));
        }
        map
    }
}

fn key_text(v: Value) -> String {
    match v {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_dataclass_repr_with_nested_calls() {
        let m = parse_server_args(
            "ServerArgs(model_path='/m', port=30000, mem_fraction_static=0.907, api_key=None, \
             enable_metrics=True, uvicorn_access_log_exclude_prefixes=[], mm_process_config={}, \
             cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend='disabled', bs=[1, 2]), prefill=None))",
        )
        .unwrap();
        assert_eq!(
            Value::Object(m),
            json!({"model_path": "/m", "port": 30000, "mem_fraction_static": 0.907, "api_key": null,
                   "enable_metrics": true, "uvicorn_access_log_exclude_prefixes": [], "mm_process_config": {},
                   "cuda_graph_config": {"decode": {"backend": "disabled", "bs": [1, 2]}, "prefill": null}})
        );
    }

    #[test]
    fn reads_the_dict_repr_with_tuples_sets_and_escapes() {
        let m = parse_server_args(
            r#"{'model_path': 'it\'s "q"\n\x41\u00e9', 'tp_size': 8, 'ratio': 1e-05, 'neg': -3, 'shape': (1, 2), 's': {1, 2}, 'inf': inf, 'd': {'a': {'b': [None]}}, 'big': 123456789012345678901234567890}"#,
        )
        .unwrap();
        assert_eq!(m["model_path"], json!("it's \"q\"\nAé"));
        assert_eq!(m["tp_size"], json!(8));
        assert_eq!(m["ratio"], json!(1e-05));
        assert_eq!(m["neg"], json!(-3));
        assert_eq!(m["shape"], json!([1, 2]));
        assert_eq!(m["s"], json!([1, 2]));
        assert_eq!(m["inf"], json!("inf"));
        assert_eq!(m["d"], json!({"a": {"b": [null]}}));
        assert_eq!(m["big"], json!("123456789012345678901234567890"));
    }

    #[test]
    fn unreadable_values_become_raw_strings_and_keep_their_neighbours() {
        let m = parse_server_args(
            "ServerArgs(dtype=torch.bfloat16, mode=<Mode.FAST: 1>, f=lambda x: x, next='ok', expr=1 + 2, last=3)",
        )
        .unwrap();
        assert_eq!(m["dtype"], json!("torch.bfloat16"));
        assert_eq!(m["mode"], json!("<Mode.FAST: 1>"));
        assert_eq!(m["next"], json!("ok"));
        assert_eq!(m["expr"], json!("1 + 2"));
        assert_eq!(m["last"], json!(3));
    }

    #[test]
    fn truncated_or_garbage_input_never_panics() {
        for s in [
            "ServerArgs(a='unterminated",
            "ServerArgs(a=[1, 2",
            "{'a': ",
            "{'a' 1}",
            "ServerArgs(",
            "{",
            "ServerArgs(a=\\xff, b='\\x4', c='\\U0011ffff')",
            "{'é': 'ü\\",
            "ServerArgs(a=1 b=2)",
            "",
            "not a repr",
        ] {
            let _ = parse_server_args(s);
        }
        let deep = format!("{{'a': {}1{}}}", "[".repeat(10_000), "]".repeat(10_000));
        let m = parse_server_args(&deep).unwrap();
        let text = serde_json::to_string(&m["a"]).unwrap();
        assert!(
            text.contains("\"[[["),
            "nesting past the limit is kept as raw text: {}",
            &text[..200]
        );
        let m = parse_server_args("ServerArgs(a=1, b='x").unwrap();
        assert_eq!(m["a"], json!(1));
    }
}
