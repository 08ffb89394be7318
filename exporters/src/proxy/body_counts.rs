//! Token counts of a whole (non-streamed) JSON answer, read as its bytes pass: `meta_info`'s
//! (SGLang's native API; a batch answers with a list, whose counts add up) or else `usage`'s
//! (OpenAI's) `completion_tokens` and `prompt_tokens`. Nothing of the body is kept: an answer
//! with logprobs runs to megabytes, and a copy per request in flight would be what bounds the
//! supervisor's memory. The reading is `serde_json::Value`'s: the last of a duplicated key wins,
//! a count that is not an unsigned integer is none, and a body that is not one whole JSON value
//! (its structure, numbers, their range and literals are checked, and no control byte may stand
//! in a string; escapes and UTF-8 inside strings are not) or that nests deeper than serde_json
//! allows has no counts.
use memchr::memchr2;

/// The deepest nesting serde_json reads (its recursion limit, 128, stops the 128th level): deeper
/// input is an error there, so it has no counts here.
const MAX_DEPTH: usize = 127;
/// Longest key that can matter ("completion_tokens").
const KEY_CAP: usize = 17;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    MetaInfo,
    Usage,
    Completion,
    Prompt,
    Other,
}

impl Key {
    fn of(name: &[u8]) -> Key {
        match name {
            b"meta_info" => Key::MetaInfo,
            b"usage" => Key::Usage,
            b"completion_tokens" => Key::Completion,
            b"prompt_tokens" => Key::Prompt,
            _ => Key::Other,
        }
    }
}

/// What the innermost container (or the top level) takes next.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    /// A value: the top level's only one, an array's first (or `]`), or after `:` / `,`.
    Value {
        or_close: bool,
    },
    /// An object's key (or `}` right after `{`).
    Key {
        or_close: bool,
    },
    Colon,
    /// `,` or the container's close; at the top level, only whitespace.
    Next,
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    object: bool,
    /// The key whose value is being read (objects).
    key: Key,
    /// Whether a value in it can be an answer or hold a count: the top level, a list's element,
    /// `meta_info` or `usage`. Values elsewhere are only checked, not placed.
    placed: bool,
}

/// A scalar being read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scalar {
    None,
    String {
        key: bool,
        escaped: bool,
    },
    /// A number: where in its grammar, and `Some(n)` while it is an unsigned integer that fits.
    Number(Num, Option<u64>),
    /// `true`, `false` or `null`, by how many of its letters came.
    Literal {
        word: &'static [u8],
        seen: usize,
    },
}

/// JSON's number grammar, `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, by the part last read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    /// The state after `b`, or None when `b` cannot follow (the number ends there, or is wrong).
    fn next(self, b: u8) -> Option<Num> {
        use Num::*;
        Some(match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') | (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => E,
            (E, b'+' | b'-') => ESign,
            (E | ESign | Exp, b'0'..=b'9') => Exp,
            _ => return None,
        })
    }

    /// Whether a number may end here.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

/// Where f64 ends: numbers from 2^1024 − 2^970 on (halfway to 2^1024, the tie rounding up)
/// round to infinity, which serde_json (correctly rounded) takes for an error. Its digits.
const F64_OVERFLOW: &[u8; 309] =
    b"17976931348623158079372897140530341507993413271003782693617377898044496829276475\
    09466490179775872070963302864166928879109465555478519404026306574886715058206819\
    08902000708383676273854845817711531764475730270069855571366959622842914819860834\
    936475292719074168444365510704342711559699508093042880177904174497792";

/// How large a number is, as far as f64 goes: serde_json takes one past f64's range (1e400) for
/// an error, so a body with one has no counts.
#[derive(Clone, Copy, Debug)]
struct Magnitude {
    /// Digits before the point, from the first nonzero one.
    int_digits: i64,
    /// Zeros after the point before the first nonzero digit, when none came before the point.
    frac_zeros: i64,
    /// Significant digits read, and how they compare with [`F64_OVERFLOW`]'s so far.
    significant: usize,
    against_overflow: std::cmp::Ordering,
    exp: i64,
    exp_negative: bool,
}

impl Default for Magnitude {
    fn default() -> Self {
        Magnitude {
            int_digits: 0,
            frac_zeros: 0,
            significant: 0,
            against_overflow: std::cmp::Ordering::Equal,
            exp: 0,
            exp_negative: false,
        }
    }
}

impl Magnitude {
    /// Digit `d` read in the part `state` of the number.
    fn digit(&mut self, state: Num, d: u8) {
        match state {
            Num::Zero | Num::Int if self.int_digits > 0 || d != 0 => {
                self.int_digits = self.int_digits.saturating_add(1);
                self.push(d);
            }
            Num::Frac if self.significant == 0 && d == 0 => {
                self.frac_zeros = self.frac_zeros.saturating_add(1);
            }
            Num::Frac => self.push(d),
            Num::Exp => self.exp = self.exp.saturating_mul(10).saturating_add(i64::from(d)),
            _ => {}
        }
    }

    fn push(&mut self, d: u8) {
        if self.against_overflow.is_eq() {
            self.against_overflow = match F64_OVERFLOW.get(self.significant) {
                Some(&o) => d.cmp(&(o - b'0')),
                None if d > 0 => std::cmp::Ordering::Greater,
                None => std::cmp::Ordering::Equal,
            };
        }
        self.significant = self.significant.saturating_add(1);
    }

    fn past_f64(&self) -> bool {
        if self.significant == 0 || (self.exp == 0 && self.int_digits < 300) {
            return false; // zero, or an integer (or fraction) well inside f64
        }
        let point = if self.int_digits > 0 {
            self.int_digits - 1
        } else {
            -(self.frac_zeros.saturating_add(1))
        };
        let exp = if self.exp_negative {
            -self.exp
        } else {
            self.exp
        };
        let e10 = point.saturating_add(exp);
        // At 308, the digits decide: from the halfway point on (all of its digits, equal) it is
        // past; a prefix of it is below.
        let at_or_past_halfway = self.against_overflow.is_gt()
            || (self.against_overflow.is_eq() && self.significant >= F64_OVERFLOW.len());
        e10 > 308 || (e10 == 308 && at_or_past_halfway)
    }
}

/// The counts found for one answer (the top object, or one element of a top-level list).
#[derive(Clone, Copy, Default, Debug)]
struct Item {
    /// meta_info's, usage's: [completion, prompt].
    meta: [Option<u64>; 2],
    usage: [Option<u64>; 2],
}

#[derive(Debug)]
pub struct BodyCounts {
    stack: Vec<Frame>,
    expect: Expect,
    scalar: Scalar,
    key: [u8; KEY_CAP],
    key_len: usize,
    /// The number being read's size (an error past f64's range).
    magnitude: Magnitude,
    /// `Some(true)`: the body is a list of answers; `Some(false)`: one answer.
    list: Option<bool>,
    item: Item,
    /// Where the current count goes: (meta_info or usage, completion or prompt).
    slot: Option<(bool, usize)>,
    sums: [Option<u64>; 2],
    broken: bool,
}

/// Whether `bytes` hold one below 0x20 (JSON forbids them inside a string): no early exit, so the
/// loop vectorizes.
fn has_control_byte(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |acc, &b| acc | u8::from(b < 0x20)) != 0
}

impl Default for BodyCounts {
    fn default() -> Self {
        BodyCounts {
            stack: Vec::new(),
            expect: Expect::Value { or_close: false },
            scalar: Scalar::None,
            key: [0; KEY_CAP],
            key_len: 0,
            magnitude: Magnitude::default(),
            list: None,
            item: Item::default(),
            slot: None,
            sums: [Some(0); 2],
            broken: false,
        }
    }
}

impl BodyCounts {
    /// The next bytes of the body.
    pub fn feed(&mut self, data: &[u8]) {
        let mut i = 0;
        while i < data.len() && !self.broken {
            match self.scalar {
                Scalar::String {
                    key: false,
                    escaped: false,
                } => {
                    // Most of an answer is its text: jump to the next quote or backslash.
                    let k = memchr2(b'"', b'\\', &data[i..]).unwrap_or(data.len() - i);
                    self.broken = has_control_byte(&data[i..i + k]);
                    i += k;
                    if i == data.len() {
                        return;
                    }
                }
                Scalar::None
                    if matches!(self.expect, Expect::Value { .. })
                        && self.stack.last().is_some_and(|f| !f.object && !f.placed) =>
                {
                    i = self.skim_integers(data, i);
                    if i == data.len() {
                        return;
                    }
                }
                Scalar::Number(Num::Int, n) => {
                    // And then its token ids: the digits of an integer at once.
                    let digits = data[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                    let run = &data[i..i + digits];
                    for &d in run {
                        self.magnitude.digit(Num::Int, d - b'0');
                    }
                    let n = n.and_then(|n| {
                        run.iter().try_fold(n, |n, &d| {
                            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                        })
                    });
                    self.scalar = Scalar::Number(Num::Int, n);
                    i += digits;
                    if i == data.len() {
                        return;
                    }
                }
                _ => {}
            }
            self.byte(data[i]);
            i += 1;
        }
    }
    /// The same counts from a body held whole, as serde_json reads it: what [`BodyCounts`] gives
    /// without holding it (its tests and fuzz harness hold it to this).
    pub fn of_whole(body: &[u8]) -> (Option<u64>, Option<u64>) {
        use serde_json::Value;
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return (None, None);
        };
        let items: Vec<&Value> = v
            .as_array()
            .map_or_else(|| vec![&v], |a| a.iter().collect());
        let sum = |key: &str| {
            items.iter().try_fold(0u64, |acc, it| {
                let n = it["meta_info"][key]
                    .as_u64()
                    .or_else(|| it["usage"][key].as_u64())?;
                acc.checked_add(n)
            })
        };
        (sum("completion_tokens"), sum("prompt_tokens"))
    }

    /// `(completion_tokens, prompt_tokens)` once the whole body was fed; none unless it was one
    /// whole JSON value whose every answer had the count.
    pub fn finish(mut self) -> (Option<u64>, Option<u64>) {
        if let Scalar::Number(num, _) = self.scalar {
            self.broken |= !num.complete();
            self.end_scalar();
        }
        // A top level that is not an object or a list (a number, say) holds no answer.
        let whole = !self.broken
            && self.list.is_some()
            && self.stack.is_empty()
            && self.scalar == Scalar::None
            && self.expect == Expect::Next;
        if whole {
            (self.sums[0], self.sums[1])
        } else {
            (None, None)
        }
    }

    fn byte(&mut self, b: u8) {
        match self.scalar {
            Scalar::String { key, escaped } => self.string_byte(b, key, escaped),
            Scalar::Number(num, n) => match num.next(b) {
                Some(next) => {
                    if b.is_ascii_digit() {
                        self.magnitude.digit(next, b - b'0');
                    }
                    self.magnitude.exp_negative |= next == Num::ESign && b == b'-';
                    let n = match next {
                        Num::Int => {
                            n.and_then(|n| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
                        }
                        _ => None,
                    };
                    self.scalar = Scalar::Number(next, n);
                }
                None if num.complete() && !b.is_ascii_digit() => {
                    self.end_scalar();
                    self.structural(b);
                }
                // "01", "1.", "-", "1e+": not JSON
                None => self.broken = true,
            },
            Scalar::Literal { word, seen } => {
                if word.get(seen) == Some(&b) {
                    if seen + 1 == word.len() {
                        self.end_scalar();
                    } else {
                        self.scalar = Scalar::Literal {
                            word,
                            seen: seen + 1,
                        };
                    }
                } else {
                    self.broken = true;
                }
            }
            Scalar::None => self.structural(b),
        }
    }

    /// In a list that holds nothing read, whole runs of plain integers and their commas
    /// ("100,101,102,": SGLang's `output_ids`, the bulk of a long answer), from `i`; returns where
    /// the general reading goes on (at a number not followed by a comma in `data`, or anything
    /// else).
    fn skim_integers(&mut self, data: &[u8], mut i: usize) -> usize {
        loop {
            let rest = &data[i..];
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            let plain = match digits {
                0 => false,
                1 => true,
                n => rest[0] != b'0' && n < 300,
            };
            if !plain || rest.get(digits) != Some(&b',') {
                return i;
            }
            i += digits + 1;
            self.expect = Expect::Value { or_close: false };
        }
    }

    fn string_byte(&mut self, b: u8, key: bool, escaped: bool) {
        if b < 0x20 {
            self.broken = true;
        } else if escaped {
            self.scalar = Scalar::String {
                key,
                escaped: false,
            };
            if key {
                // An escaped key ("meta\u005finfo") is taken for none of ours: no server writes one.
                self.key_len = KEY_CAP + 1;
            }
        } else if b == b'\\' {
            self.scalar = Scalar::String { key, escaped: true };
        } else if b == b'"' {
            self.scalar = Scalar::None;
            if key {
                let name = self.key.get(..self.key_len).unwrap_or_default();
                let k = Key::of(name);
                if let Some(top) = self.stack.last_mut() {
                    top.key = k;
                }
                self.expect = Expect::Colon;
            } else {
                self.end_value();
            }
        } else if key {
            if let Some(slot) = self.key.get_mut(self.key_len) {
                *slot = b;
            }
            self.key_len = self.key_len.saturating_add(1);
        }
    }

    fn structural(&mut self, b: u8) {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return;
        }
        match (self.expect, b) {
            (Expect::Key { .. }, b'"') => {
                self.key_len = 0;
                self.scalar = Scalar::String {
                    key: true,
                    escaped: false,
                };
            }
            (Expect::Key { or_close: true }, b'}') => self.close(true),
            (Expect::Colon, b':') => self.expect = Expect::Value { or_close: false },
            (Expect::Value { or_close: true }, b']') => self.close(false),
            (Expect::Value { .. }, _) => self.value(b),
            (Expect::Next, b',') if !self.stack.is_empty() => {
                let object = self.stack.last().is_some_and(|f| f.object);
                self.expect = if object {
                    Expect::Key { or_close: false }
                } else {
                    Expect::Value { or_close: false }
                };
            }
            (Expect::Next, b'}') => self.close(true),
            (Expect::Next, b']') => self.close(false),
            _ => self.broken = true,
        }
    }

    /// A value starts with `b`.
    fn value(&mut self, b: u8) {
        self.begin_value(b == b'{');
        match b {
            b'{' | b'[' => self.open(b == b'{'),
            b'"' => {
                self.scalar = Scalar::String {
                    key: false,
                    escaped: false,
                }
            }
            b'0'..=b'9' | b'-' => {
                self.magnitude = Magnitude::default();
                self.scalar = match b {
                    b'-' => Scalar::Number(Num::Minus, None),
                    b'0' => Scalar::Number(Num::Zero, Some(0)),
                    _ => {
                        self.magnitude.digit(Num::Int, b - b'0');
                        Scalar::Number(Num::Int, Some(u64::from(b - b'0')))
                    }
                };
            }
            b't' => {
                self.scalar = Scalar::Literal {
                    word: b"true",
                    seen: 1,
                }
            }
            b'f' => {
                self.scalar = Scalar::Literal {
                    word: b"false",
                    seen: 1,
                }
            }
            b'n' => {
                self.scalar = Scalar::Literal {
                    word: b"null",
                    seen: 1,
                }
            }
            _ => self.broken = true,
        }
    }

    /// Where a value about to start lands, by its depth and the keys above it.
    fn begin_value(&mut self, object: bool) {
        let depth = self.stack.len();
        if !self.stack.last().is_some_and(|f| f.placed) {
            return;
        }
        let list = self.list == Some(true);
        // The depth of an answer's own keys: the top object's (1), or a list element's (2).
        let answer = if list { 2 } else { 1 };
        if list && depth == 1 {
            // A list element that is not an object has no counts: neither sum is known.
            if !object {
                self.sums = [None; 2];
            }
            self.item = Item::default();
        } else if depth == answer {
            // A new value of `meta_info` or `usage` replaces the old one, whatever it held.
            match self.stack.last().map(|f| f.key) {
                Some(Key::MetaInfo) => self.item.meta = [None; 2],
                Some(Key::Usage) => self.item.usage = [None; 2],
                _ => {}
            }
        } else if depth == answer + 1 {
            let parent = self.stack.get(answer - 1).map(|f| (f.object, f.key));
            let counts = match parent {
                Some((true, Key::MetaInfo)) => Some(true),
                Some((true, Key::Usage)) => Some(false),
                _ => None,
            };
            let which = match self.stack.last().map(|f| (f.object, f.key)) {
                Some((true, Key::Completion)) => Some(0),
                Some((true, Key::Prompt)) => Some(1),
                _ => None,
            };
            if let (Some(meta), Some(k)) = (counts, which) {
                // Whatever it is, it replaces an earlier value of the key; a number may fill it.
                self.set(meta, k, None);
                self.slot = Some((meta, k));
            }
        }
    }

    fn set(&mut self, meta: bool, k: usize, n: Option<u64>) {
        let slots = if meta {
            &mut self.item.meta
        } else {
            &mut self.item.usage
        };
        slots[k] = n;
    }

    fn end_scalar(&mut self) {
        if let Scalar::Number(..) = self.scalar {
            self.broken |= self.magnitude.past_f64();
        }
        if let (Scalar::Number(_, n), Some((meta, k))) = (self.scalar, self.slot) {
            self.set(meta, k, n);
        }
        self.scalar = Scalar::None;
        self.end_value();
    }

    /// A value (scalar or container) ended.
    fn end_value(&mut self) {
        self.slot = None;
        self.expect = Expect::Next;
    }

    fn open(&mut self, object: bool) {
        if self.stack.len() >= MAX_DEPTH {
            self.broken = true;
            return;
        }
        if self.stack.is_empty() {
            self.list = Some(!object);
        }
        // A count whose value is a container is none; nothing inside it is the count.
        self.slot = None;
        let depth = self.stack.len();
        let list = self.list == Some(true);
        let placed = depth == 0
            || (list && depth == 1)
            || (depth == if list { 2 } else { 1 }
                && self
                    .stack
                    .last()
                    .is_some_and(|f| f.object && matches!(f.key, Key::MetaInfo | Key::Usage)));
        self.stack.push(Frame {
            object,
            key: Key::Other,
            placed,
        });
        self.expect = if object {
            Expect::Key { or_close: true }
        } else {
            Expect::Value { or_close: true }
        };
    }

    fn close(&mut self, object: bool) {
        match self.stack.pop() {
            Some(f) if f.object == object => {}
            _ => {
                self.broken = true;
                return;
            }
        }
        let depth = self.stack.len();
        let answer_closed = object
            && match self.list {
                Some(true) => depth == 1,
                Some(false) => depth == 0,
                None => false,
            };
        if answer_closed {
            let item = std::mem::take(&mut self.item);
            for k in 0..2 {
                let n = item.meta[k].or(item.usage[k]);
                self.sums[k] = self.sums[k].and_then(|s| s.checked_add(n?));
            }
        }
        self.end_value();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn reference(body: &[u8]) -> (Option<u64>, Option<u64>) {
        BodyCounts::of_whole(body)
    }

    fn streamed(body: &[u8], cuts: &[usize]) -> (Option<u64>, Option<u64>) {
        let mut c = BodyCounts::default();
        let mut at = 0;
        for &cut in cuts {
            let cut = cut.min(body.len()).max(at);
            c.feed(&body[at..cut]);
            at = cut;
        }
        c.feed(&body[at..]);
        c.finish()
    }

    #[track_caller]
    fn agrees(body: &str) {
        let b = body.as_bytes();
        let want = reference(b);
        assert_eq!(streamed(b, &[]), want, "whole: {body}");
        for cut in 0..=b.len() {
            assert_eq!(streamed(b, &[cut]), want, "cut at {cut}: {body}");
        }
        let ones: Vec<usize> = (1..b.len()).collect();
        assert_eq!(streamed(b, &ones), want, "byte by byte: {body}");
    }

    #[test]
    fn counts_match_serde_json_on_native_openai_and_batch_answers() {
        for body in [
            r#"{"text":"a \"quoted\" \\ text","meta_info":{"id":"x","prompt_tokens":12,"completion_tokens":7,"e2e_latency":0.5}}"#,
            r#"{"id":"c","choices":[{"text":"hi"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#,
            r#"[{"text":"a","meta_info":{"prompt_tokens":4,"completion_tokens":3}},{"text":"b","meta_info":{"prompt_tokens":6,"completion_tokens":2}}]"#,
            r#" { "meta_info" : { "completion_tokens" : 9 , "prompt_tokens" : 1 } } "#,
            r#"[]"#,
            r#"{"meta_info":{"completion_tokens":7},"usage":{"prompt_tokens":2}}"#,
            r#"{"meta_info":{"prompt_tokens":2,"completion_tokens":18446744073709551615}}"#,
        ] {
            agrees(body);
        }
    }

    #[test]
    fn what_serde_json_would_not_count_is_none_here_too() {
        for body in [
            // not numbers, too big, negative, fractions, exponents
            r#"{"meta_info":{"completion_tokens":"7","prompt_tokens":null}}"#,
            r#"{"meta_info":{"completion_tokens":18446744073709551616,"prompt_tokens":-1}}"#,
            r#"{"meta_info":{"completion_tokens":7.0,"prompt_tokens":1e2}}"#,
            // a list with an answer that lacks a count, or an element that is no answer
            r#"[{"meta_info":{"completion_tokens":3,"prompt_tokens":1}},{"meta_info":{}}]"#,
            r#"[{"meta_info":{"completion_tokens":3,"prompt_tokens":1}},5]"#,
            r#"[[{"meta_info":{"completion_tokens":3,"prompt_tokens":1}}]]"#,
            // counts one level too deep or too shallow, meta_info that is not an object
            r#"{"x":{"meta_info":{"completion_tokens":3,"prompt_tokens":1}}}"#,
            r#"{"completion_tokens":3,"prompt_tokens":1}"#,
            r#"{"meta_info":[3,1]}"#,
            r#""meta_info""#,
            r#"7"#,
            // not whole JSON: cut short, trailing bytes, wrong closes, control bytes in text
            r#"{"meta_info":{"completion_tokens":3,"prompt_tokens":1}"#,
            r#"{"meta_info":{"completion_tokens":3,"prompt_tokens":1}} x"#,
            r#"{"meta_info":{"completion_tokens":3,"prompt_tokens":1}]"#,
            "{\"text\":\"a\u{1}b\",\"meta_info\":{\"completion_tokens\":3,\"prompt_tokens\":1}}",
            r#"{"meta_info":{"completion_tokens":3,"prompt_tokens":1}}{}"#,
            r#"{"meta_info":{"completion_tokens":3 "prompt_tokens":1}}"#,
            r#"{"meta_info":{"completion_tokens":tru,"prompt_tokens":1}}"#,
            // numbers serde_json refuses: past f64's range (as an exponent or as digits), "01"
            r#"{"created":1e400,"meta_info":{"completion_tokens":3,"prompt_tokens":1}}"#,
            r#"{"created":0.0001e313,"meta_info":{"completion_tokens":3,"prompt_tokens":1}}"#,
            r#"{"created":1e308,"x":0e99999,"y":1e-99999,"meta_info":{"completion_tokens":3,"prompt_tokens":1}}"#,
            r#"{"created":01,"meta_info":{"completion_tokens":3,"prompt_tokens":1}}"#,
            r#"{"meta_info":{"completion_tokens":-0,"prompt_tokens":-0.0}}"#,
            "",
            "   ",
        ] {
            agrees(body);
        }
    }

    #[test]
    fn an_integer_too_long_for_f64_is_refused_as_by_serde_json() {
        let meta = r#""meta_info":{"completion_tokens":3,"prompt_tokens":1}"#;
        for digits in [300, 308, 309, 310, 400] {
            agrees(&format!(r#"{{"x":{},{meta}}}"#, "9".repeat(digits)));
        }
    }

    #[test]
    fn a_number_at_f64s_edge_is_refused_exactly_where_serde_json_refuses_it() {
        let meta = r#""meta_info":{"completion_tokens":1,"prompt_tokens":2}"#;
        let half = std::str::from_utf8(F64_OVERFLOW).unwrap();
        let below = "17976931348623158079372897140530341507993413271003782693617377898044496829276475094664901797758720709630286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497791";
        for x in [
            "1.7976931348623158e308".to_string(),
            "1.797693134862315807937e308".to_string(),
            "1.7976931348623157e308".to_string(),
            format!("{}e-1", &half),
            format!("{}.0", &half),
            format!("{half}1e-1"),
            below.to_string(),
            format!("{below}.99999"),
            format!("0.{half}e309"),
        ] {
            agrees(&format!(r#"{{"x":{x},{meta}}}"#));
        }
    }

    #[test]
    fn the_last_of_a_duplicated_key_wins_as_in_serde_json() {
        for body in [
            r#"{"meta_info":{"completion_tokens":3,"completion_tokens":4,"prompt_tokens":1}}"#,
            r#"{"meta_info":{"completion_tokens":3,"prompt_tokens":1},"meta_info":{"prompt_tokens":2}}"#,
            r#"{"meta_info":{"completion_tokens":3,"prompt_tokens":1},"meta_info":null,"usage":{"completion_tokens":5,"prompt_tokens":6}}"#,
            r#"{"meta_info":{"completion_tokens":3,"completion_tokens":"x","prompt_tokens":1}}"#,
        ] {
            agrees(body);
        }
    }

    #[test]
    fn nesting_past_serde_jsons_limit_has_no_counts() {
        let deep = |n: usize| {
            format!(
                r#"{{"meta_info":{{"completion_tokens":3,"prompt_tokens":1}},"x":{}{}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        for n in [125, 126, 127, 128, 200] {
            agrees(&deep(n));
        }
    }

    #[test]
    fn a_large_answer_is_counted_without_keeping_it() {
        // 16 MiB of text (logprobs-sized): read in 64 KiB frames, with nothing held.
        let text = "token ".repeat(16 << 20 >> 3);
        let body = format!(
            r#"{{"text":"{text}","meta_info":{{"prompt_tokens":256,"completion_tokens":2796202}}}}"#
        );
        let mut c = BodyCounts::default();
        for frame in body.as_bytes().chunks(65536) {
            c.feed(frame);
        }
        // What it holds is its two levels of nesting, whatever the body's size.
        assert!(c.stack.capacity() <= 4, "{}", c.stack.capacity());
        assert_eq!(c.finish(), (Some(2_796_202), Some(256)));
    }
}
