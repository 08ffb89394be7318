//! One verdict per flag of a launch command, decided the way argparse itself will decide it
//! (Python 3.11's `_parse_optional`, `_get_option_tuples` and `consume_optional`): exact option
//! string, then a unique prefix — `allow_abbrev` is on in every SGLang version — else "ambiguous
//! option"; single-dash words; how many following words each option consumes; a value given to
//! a flag that takes none; int/float conversion and choices; retired flags that stop the launch
//! with their own message; `--help`; words no option consumed ("unrecognized arguments"). Plus
//! deprecations, and a baseline schema that names flags that were removed and where they went.
use crate::schema::{Nargs, Opt, Schema};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Alias,
    Abbrev,
    Deprecated,
    Ambiguous,
    Unknown,
    Removed,
    InvalidChoice,
    MissingValue,
    /// A value for a flag that takes none (`--flag=1`): "ignored explicit argument".
    UnexpectedValue,
    /// A value its type (int, float) does not convert: "invalid int value".
    InvalidValue,
    /// A flag the version keeps only to stop the launch with a message (`DeprecatedAction`).
    Retired,
    /// `--help` (or a prefix of it): argparse prints the help and exits 0; no server starts.
    Help,
}

impl Status {
    /// Does this make the launch fail?
    pub fn fails(self) -> bool {
        self > Status::Deprecated
    }

    /// The name in audit output (`invalid_choice`, ...), as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Alias => "alias",
            Status::Abbrev => "abbrev",
            Status::Deprecated => "deprecated",
            Status::Ambiguous => "ambiguous",
            Status::Unknown => "unknown",
            Status::Removed => "removed",
            Status::InvalidChoice => "invalid_choice",
            Status::MissingValue => "missing_value",
            Status::UnexpectedValue => "unexpected_value",
            Status::InvalidValue => "invalid_value",
            Status::Retired => "retired",
            Status::Help => "help",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub flag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canonical: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Verdict {
    fn new(flag: &str, value: Option<String>) -> Verdict {
        Verdict {
            flag: flag.to_string(),
            value,
            status: Status::Ok,
            canonical: None,
            replacement: None,
            candidates: Vec::new(),
            message: None,
        }
    }

    /// What to do about it, for people: `→ canonical; use replacement; argparse's message`.
    pub fn note(&self) -> String {
        [
            self.canonical.as_ref().map(|c| format!("→ {c}")),
            self.replacement.as_ref().map(|r| format!("use {r}")),
            self.message.clone(),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
    }

    fn fail(&mut self, status: Status, message: String) {
        self.status = status;
        self.message = Some(message);
    }
}

/// What argparse's `_parse_optional` makes of one word.
enum Word<'a> {
    /// A positional string ('A'): a value, or an extra if nothing consumes it.
    Arg,
    /// `$X`, `$(...)`: only the shell knows; consumed as a value where one is due, else noted.
    Symbolic,
    /// An option ('O'): the action (none: not an option of this parser), the option string it
    /// matched, the explicit `=value` or single-dash tail, and whether it was a prefix.
    Opt {
        action: Option<&'a Opt>,
        string: String,
        explicit: Option<String>,
        abbrev: bool,
    },
    /// A prefix of several option strings: argparse stops at once.
    Ambiguous(Vec<String>),
}

fn is_symbolic(w: &str) -> bool {
    w.starts_with('$')
}

/// argparse's `_negative_number_matcher`: `^-\d+$|^-\d*\.\d+$` (no SGLang option looks like one).
fn negative_number(w: &str) -> bool {
    let Some(rest) = w.strip_prefix('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    match rest.split_once('.') {
        None => digits(rest),
        Some((a, b)) => (a.is_empty() || digits(a)) && digits(b),
    }
}

fn classify<'a>(schema: &'a Schema, w: &str) -> Word<'a> {
    if is_symbolic(w) {
        return Word::Symbolic;
    }
    if !w.starts_with('-') {
        return Word::Arg;
    }
    if let Some(o) = schema.exact(w) {
        return Word::Opt {
            action: Some(o),
            string: w.to_string(),
            explicit: None,
            abbrev: false,
        };
    }
    if w.len() == 1 {
        return Word::Arg;
    }
    if let Some((f, v)) = w.split_once('=') {
        if let Some(o) = schema.exact(f) {
            return Word::Opt {
                action: Some(o),
                string: f.to_string(),
                explicit: Some(v.to_string()),
                abbrev: false,
            };
        }
    }
    // `_get_option_tuples`: `--x` prefixes split at `=`; `-x` is a short option plus its tail,
    // or a prefix of single-dash option strings.
    let mut found: Vec<(&Opt, String, Option<String>)> = Vec::new();
    if w.starts_with("--") {
        let (prefix, explicit) = match w.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (w, None),
        };
        for (o, s) in schema.prefixed(prefix) {
            found.push((o, s.to_string(), explicit.clone()));
        }
    } else {
        let short = &w[..w.char_indices().nth(2).map_or(w.len(), |(i, _)| i)];
        for (o, s) in schema.prefixed("-") {
            if s == short {
                found.push((o, s.to_string(), Some(w[short.len()..].to_string())));
            } else if s.starts_with(w) {
                found.push((o, s.to_string(), None));
            }
        }
    }
    match found.len() {
        0 => {}
        1 => {
            let (o, s, explicit) = found.remove(0);
            return Word::Opt {
                action: Some(o),
                string: s,
                explicit,
                abbrev: true,
            };
        }
        _ => {
            // Several option strings of one action (its aliases) still mean that action
            // (as on the Pythons the recipes were checked with).
            if found.iter().all(|(o, _, _)| std::ptr::eq(*o, found[0].0)) {
                let (o, s, explicit) = found.remove(0);
                return Word::Opt {
                    action: Some(o),
                    string: s,
                    explicit,
                    abbrev: true,
                };
            }
            return Word::Ambiguous(found.into_iter().map(|(_, s, _)| s).collect());
        }
    }
    if negative_number(w) || w.contains(' ') {
        return Word::Arg;
    }
    Word::Opt {
        action: None,
        string: w.to_string(),
        explicit: None,
        abbrev: false,
    }
}

/// Where the baseline's deprecation trail sends `flag` (with its `=value` if written so).
fn trail(
    baseline: Option<&Schema>,
    flag: &str,
    value: Option<&str>,
    inline: bool,
) -> Option<String> {
    let b = baseline?;
    let o = match classify(b, flag) {
        Word::Opt {
            action: Some(o), ..
        } => o,
        _ => return None,
    };
    let r = o.replacement.clone()?;
    Some(match value {
        Some(v) if inline && !r.contains('=') => format!("{r}={v}"),
        _ => r,
    })
}

/// Python's `repr` of a string, as argparse quotes values in its messages.
pub fn py_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `int(s)`: surrounding whitespace, a sign, digits with single underscores between.
fn py_int(s: &str) -> Option<i128> {
    let t = s.trim();
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let ok = !body.is_empty()
        && !body.starts_with('_')
        && !body.ends_with('_')
        && !body.contains("__")
        && body.chars().all(|c| c.is_ascii_digit() || c == '_');
    if !ok {
        return None;
    }
    let n: i128 = body.replace('_', "").parse().ok()?;
    Some(if t.starts_with('-') { -n } else { n })
}

/// Python's `float(s)`: also `inf`, `nan`, `1e3`, `.5`, `1_000.5`.
fn py_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let body = t.strip_prefix(['+', '-']).unwrap_or(t).to_ascii_lowercase();
    if matches!(body.as_str(), "inf" | "infinity" | "nan") {
        return Some(0.0);
    }
    // Underscores only between digits.
    let b = body.as_bytes();
    for (i, c) in b.iter().enumerate() {
        if *c == b'_'
            && !(i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            return None;
        }
    }
    let plain = body.replace('_', "");
    let mantissa_ok = plain
        .split(['e'])
        .next()
        .is_some_and(|m| m.chars().any(|c| c.is_ascii_digit()));
    if !mantissa_ok || plain.contains(char::is_alphabetic) && !plain.contains('e') {
        return None;
    }
    plain.parse::<f64>().ok()
}

/// argparse's `_get_values` for one string: the type conversion, then the choices.
fn check_value(o: &Opt, raw: &str) -> Option<(Status, String)> {
    if is_symbolic(raw) {
        return None; // only the real launch knows it
    }
    let name = o.option_strings.join("/");
    let kind = o.kind.as_deref();
    let converted = match kind {
        Some("int") => match py_int(raw) {
            Some(n) => Some(n.to_string()),
            None => {
                return Some((
                    Status::InvalidValue,
                    format!("argument {name}: invalid int value: {}", py_repr(raw)),
                ))
            }
        },
        Some("float") => {
            if py_float(raw).is_none() {
                return Some((
                    Status::InvalidValue,
                    format!("argument {name}: invalid float value: {}", py_repr(raw)),
                ));
            }
            None
        }
        _ => None,
    };
    let choices = o.choices.as_ref()?;
    let numeric = kind == Some("int");
    let hit = match &converted {
        Some(n) => choices
            .iter()
            .any(|c| py_int(c).map(|x| x.to_string()).as_ref() == Some(n)),
        None => choices.iter().any(|c| c == raw),
    };
    if hit {
        return None;
    }
    let shown = |c: &str| {
        if numeric && py_int(c).is_some() {
            c.to_string()
        } else {
            py_repr(c)
        }
    };
    let value = converted.unwrap_or_else(|| py_repr(raw));
    let list: Vec<String> = choices.iter().map(|c| shown(c)).collect();
    Some((
        Status::InvalidChoice,
        format!(
            "argument {name}: invalid choice: {value} (choose from {})",
            list.join(", ")
        ),
    ))
}

/// How many of the following words an option consumes (argparse's `_match_argument` on the
/// pattern of 'A'/'O' words), or its "expected ..." message.
fn consume(o: &Opt, following: &[bool]) -> Result<usize, String> {
    let run = following.iter().take_while(|a| **a).count();
    let name = o.option_strings.join("/");
    let (n, need) = match o.nargs {
        Nargs::Zero => (0, 0),
        Nargs::One => (run.min(1), 1),
        Nargs::Optional => (run.min(1), 0),
        Nargs::ZeroOrMore => (run, 0),
        Nargs::OneOrMore => (run, 1),
        Nargs::Exactly(k) => (run.min(k as usize), k as usize),
    };
    if n < need {
        return Err(format!(
            "argument {name}: {}",
            match o.nargs {
                Nargs::One => "expected one argument".to_string(),
                Nargs::OneOrMore => "expected at least one argument".to_string(),
                Nargs::Exactly(1) => "expected 1 argument".to_string(),
                _ => format!("expected {need} arguments"),
            }
        ));
    }
    Ok(n)
}

/// The verdicts on a launch's flags; the words in flag position that only the shell expands
/// (`$EXTRA_ARGS`): whatever flags they carry are not audited; and argparse's own outcome.
#[derive(Debug, Clone)]
pub struct Audit {
    pub verdicts: Vec<Verdict>,
    pub unexpanded: Vec<String>,
    /// What argparse stops at first, as it prints it after `sglang serve: error: ` (`--help`:
    /// "prints the help and exits 0"); `None` when the launch parses.
    pub error: Option<String>,
}

/// Audit `args` (the arguments after `sglang serve`).
pub fn audit(schema: &Schema, baseline: Option<&Schema>, args: &[String]) -> Audit {
    // argparse classifies every word first; after `--` everything is positional.
    let dashdash = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let words: Vec<Word> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            if i >= dashdash {
                Word::Arg
            } else {
                classify(schema, a)
            }
        })
        .collect();
    let is_value: Vec<bool> = words
        .iter()
        .enumerate()
        .map(|(i, w)| i != dashdash && matches!(w, Word::Arg | Word::Symbolic))
        .collect();
    let mut out = Vec::new();
    let mut unexpanded = Vec::new();
    let mut extras: Vec<String> = Vec::new();
    let mut ambiguous = None;
    let mut first_error: Option<String> = None;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let word = &words[i];
        i += 1;
        if i - 1 == dashdash {
            continue;
        }
        let (action, string, explicit, abbrev) = match word {
            Word::Arg => {
                // Nothing consumed it: argparse's "unrecognized arguments".
                extras.push(arg.clone());
                let mut v = Verdict::new(arg, None);
                v.fail(Status::Unknown, format!("unrecognized arguments: {arg}"));
                out.push(v);
                continue;
            }
            Word::Symbolic => {
                unexpanded.push(arg.clone());
                continue;
            }
            Word::Ambiguous(c) => {
                let (flag, inline) = split_inline(arg);
                let mut v = Verdict::new(&flag, inline.clone());
                let msg = format!("ambiguous option: {arg} could match {}", c.join(", "));
                ambiguous.get_or_insert_with(|| msg.clone());
                v.fail(Status::Ambiguous, msg);
                v.candidates = c.clone();
                // Its value (if separate) belongs to it: skip it so it is not read as a flag.
                if inline.is_none() && is_value.get(i) == Some(&true) {
                    v.value = Some(args[i].clone());
                    i += 1;
                }
                v.replacement = trail(baseline, &flag, v.value.as_deref(), inline.is_some());
                out.push(v);
                continue;
            }
            Word::Opt {
                action,
                string,
                explicit,
                abbrev,
            } => (*action, string, explicit, *abbrev),
        };
        let Some(o) = action else {
            // Not an option of this parser: an extra, and so are the values after it.
            let (flag, inline) = split_inline(arg);
            let mut v = Verdict::new(&flag, inline.clone());
            let mut words_of = vec![arg.clone()];
            if inline.is_none() && is_value.get(i) == Some(&true) && !is_symbolic(&args[i]) {
                v.value = Some(args[i].clone());
                words_of.push(args[i].clone());
                i += 1;
            }
            extras.extend(words_of.iter().cloned());
            let had = baseline.is_some_and(|b| {
                matches!(
                    classify(b, &flag),
                    Word::Opt {
                        action: Some(_),
                        ..
                    }
                )
            });
            v.fail(
                if had {
                    Status::Removed
                } else {
                    Status::Unknown
                },
                format!("unrecognized arguments: {}", words_of.join(" ")),
            );
            v.replacement = trail(baseline, &flag, v.value.as_deref(), inline.is_some());
            out.push(v);
            continue;
        };
        let flag = if explicit.is_some() && !string.starts_with("--") {
            string.clone()
        } else {
            split_inline(arg).0
        };
        let mut v = Verdict::new(&flag, explicit.clone());
        if abbrev {
            v.status = Status::Abbrev;
            v.canonical = Some(o.canonical().to_string());
        } else if flag != o.canonical() && !o.is_help {
            v.status = Status::Alias;
            v.canonical = Some(o.canonical().to_string());
        }
        let name = o.option_strings.join("/");
        // The values it consumes, as argparse would.
        let mut values: Vec<String> = Vec::new();
        let mut error = None;
        match explicit {
            Some(x) => match o.nargs {
                // `--flag=1`, `-hx`: a flag that takes no value.
                Nargs::Zero => {
                    error = Some((
                        Status::UnexpectedValue,
                        format!("argument {name}: ignored explicit argument {}", py_repr(x)),
                    ))
                }
                Nargs::Exactly(k) if k != 1 => {
                    error = Some((
                        Status::MissingValue,
                        format!("argument {name}: expected {k} arguments"),
                    ))
                }
                _ => values.push(x.clone()),
            },
            None => match consume(o, &is_value[i.min(is_value.len())..]) {
                Ok(n) => {
                    values.extend(args[i..i + n].iter().cloned());
                    i += n;
                }
                Err(m) => error = Some((Status::MissingValue, m)),
            },
        }
        if v.value.is_none() && !values.is_empty() {
            v.value = Some(values.join(" "));
        }
        if error.is_none() {
            error = values.iter().find_map(|x| check_value(o, x));
        }
        if error.is_none() && o.is_help {
            error = Some((
                Status::Help,
                format!("{flag}: argparse prints the help and exits 0; the server does not start"),
            ));
        }
        if error.is_none() {
            if let Some(m) = &o.error_message {
                error = Some((Status::Retired, m.clone()));
            }
        }
        match error {
            Some((status, message)) => {
                first_error.get_or_insert_with(|| message.clone());
                v.fail(status, message);
            }
            None if o.deprecated => {
                v.status = Status::Deprecated;
                v.replacement = o.replacement.clone();
            }
            None => {}
        }
        if v.status.fails() && o.deprecated {
            v.replacement = o.replacement.clone();
        }
        out.push(v);
    }
    // argparse's order: an ambiguous word stops it before anything is consumed; then the first
    // error in the order of the words; unrecognized arguments are reported last, all together.
    let error = ambiguous.or(first_error).or_else(|| {
        (!extras.is_empty()).then(|| format!("unrecognized arguments: {}", extras.join(" ")))
    });
    Audit {
        verdicts: out,
        unexpanded,
        error,
    }
}

fn split_inline(arg: &str) -> (String, Option<String>) {
    match arg.split_once('=') {
        Some((f, v)) if arg.starts_with("--") => (f.to_string(), Some(v.to_string())),
        _ => (arg.to_string(), None),
    }
}

/// What a version makes of an `SGLANG_*` variable a recipe sets.
#[derive(Debug, Clone, Serialize)]
pub struct EnvVerdict {
    pub name: String,
    pub value: String,
    /// `ok`, `deprecated`, `unknown` (no version defines it), `removed` (the baseline did), or
    /// `unchecked` (the schema has no list of variables).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// The package file that reads it itself (`os.environ`, `os.getenv`), not through environ.py.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_by: Option<String>,
}

/// Check the `SGLANG_*` variables a recipe sets against `sglang/srt/environ.py`. SGLang ignores
/// a variable it does not define, silently: that is what this finds.
pub fn audit_env(
    schema: &Schema,
    baseline: Option<&Schema>,
    env: &[(String, String)],
) -> Vec<EnvVerdict> {
    let find = |s: &Schema, name: &str| {
        s.env
            .as_ref()
            .map(|vars| vars.iter().find(|v| v.name == name).cloned())
    };
    env.iter()
        .filter(|(k, _)| k.starts_with("SGLANG_"))
        .map(|(name, value)| {
            let (status, replacement) = match find(schema, name) {
                None => ("unchecked", None),
                Some(Some(v)) if v.deprecated => ("deprecated", v.replacement),
                Some(Some(_)) => ("ok", None),
                Some(None) => match baseline.and_then(|b| find(b, name)).flatten() {
                    Some(old) => ("removed", old.replacement),
                    None => ("unknown", None),
                },
            };
            EnvVerdict {
                name: name.clone(),
                value: value.clone(),
                status,
                replacement,
                read_by: None,
            }
        })
        .collect()
}

/// `audit`'s exit status: 0 all fine, 1 the worst is a deprecation (or a variable the version
/// ignores: the launch parses, something is off), 2 the launch would fail.
pub fn exit_status(verdicts: &[Verdict], env: &[EnvVerdict]) -> i32 {
    let env_off = env.iter().any(|e| !matches!(e.status, "ok" | "unchecked"));
    match verdicts.iter().map(|v| v.status).max() {
        Some(s) if s.fails() => 2,
        Some(Status::Deprecated) => 1,
        _ if env_off => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(actions: serde_json::Value) -> Schema {
        Schema::from_json(&json!({"sglang_version": "x", "actions": actions})).unwrap()
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn status_names_are_the_serialised_ones() {
        use Status::*;
        for st in [
            Ok,
            Alias,
            Abbrev,
            Deprecated,
            Ambiguous,
            Unknown,
            Removed,
            InvalidChoice,
            MissingValue,
            UnexpectedValue,
            InvalidValue,
            Retired,
            Help,
        ] {
            assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        }
    }

    #[test]
    fn values_convert_as_python_int_and_float_do() {
        for ok in ["8", " 8 ", "+8", "-1", "8_0", "007"] {
            assert!(py_int(ok).is_some(), "{ok}");
        }
        for bad in ["8x", "8.0", "", "_8", "8__0", "8_", "0x10", "1e3"] {
            assert!(py_int(bad).is_none(), "{bad}");
        }
        for ok in [
            "0.8",
            ".5",
            "-.5",
            "1e-1",
            "1E3",
            "inf",
            "-Infinity",
            "nan",
            "1_0.5",
            " 2 ",
            "8",
        ] {
            assert!(py_float(ok).is_some(), "{ok}");
        }
        for bad in ["0.8x", "", ".", "e3", "1_", "1__0", "in", "0x1p3", "1e"] {
            assert!(py_float(bad).is_none(), "{bad}");
        }
        assert_eq!(py_repr("a"), "'a'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a\tb"), "'a\\tb'");
    }

    #[test]
    fn argparse_decisions_beyond_matching() {
        let s = schema(json!([
            {"option_strings": ["-h", "--help"], "dest": "help", "nargs": 0},
            {"option_strings": ["--tp-size", "--tp"], "dest": "tp", "nargs": null, "type": "int"},
            {"option_strings": ["--flag"], "dest": "flag", "nargs": 0},
            {"option_strings": ["--gone"], "dest": "gone", "nargs": 0, "action": "DeprecatedAction", "error_message": "--gone is no longer supported."},
            {"option_strings": ["--level"], "dest": "level", "nargs": null, "type": "int", "choices": [0, 1]}
        ]));
        let run = |a: &[&str]| audit(&s, None, &args(a));
        let err = |a: &[&str]| run(a).error;
        assert_eq!(
            err(&["--flag=1"]).as_deref(),
            Some("argument --flag: ignored explicit argument '1'")
        );
        assert_eq!(
            err(&["--flag", "yes"]).as_deref(),
            Some("unrecognized arguments: yes")
        );
        assert_eq!(
            err(&["-tp", "8"]).as_deref(),
            Some("unrecognized arguments: -tp 8")
        );
        assert_eq!(
            err(&["--tp", "8x"]).as_deref(),
            Some("argument --tp-size/--tp: invalid int value: '8x'")
        );
        assert_eq!(
            err(&["--level", "5"]).as_deref(),
            Some("argument --level: invalid choice: 5 (choose from 0, 1)")
        );
        assert_eq!(err(&["--level", "01"]), None, "int('01') is 1");
        assert_eq!(
            err(&["--gone"]).as_deref(),
            Some("--gone is no longer supported.")
        );
        assert_eq!(run(&["--gone"]).verdicts[0].status, Status::Retired);
        assert_eq!(run(&["--hel"]).verdicts[0].status, Status::Help);
        // Help stops parsing before unrecognized words are reported; a bad value before it wins.
        assert!(err(&["--nope", "--help"])
            .unwrap()
            .contains("prints the help"));
        assert!(err(&["--tp", "x", "--help"])
            .unwrap()
            .contains("invalid int"));
        assert_eq!(err(&["--tp", "-1"]), None, "a negative number is a value");
        assert_eq!(err(&["--tp", "$TP", "$EXTRA"]), None);
        assert_eq!(run(&["--tp", "$TP", "$EXTRA"]).unexpanded, ["$EXTRA"]);
    }

    #[test]
    fn each_status_from_a_small_parser() {
        let s = schema(json!([
            {"option_strings": ["--ep-size", "--expert-parallel-size", "--ep"], "dest": "ep_size", "nargs": null},
            {"option_strings": ["--mode"], "dest": "mode", "nargs": null, "choices": ["a", "b"]},
            {"option_strings": ["--flag"], "dest": "flag", "nargs": 0},
            {"option_strings": ["--cuda-graph-max-bs-decode"], "dest": "d", "nargs": null},
            {"option_strings": ["--cuda-graph-max-bs-prefill"], "dest": "p", "nargs": null},
            {"option_strings": ["--old"], "dest": "old", "nargs": 0, "action": "DeprecatedStoreTrueAction", "new_flag": "--new"},
            {"option_strings": ["--list"], "dest": "l", "nargs": "+"}
        ]));
        let a = audit(
            &s,
            None,
            &args(&[
                "--ep-size",
                "2",
                "--ep",
                "2",
                "--expert-p",
                "4",
                "--mode",
                "c",
                "--flag",
                "$EXTRA_ARGS",
                "--old",
                "--cuda-graph-max-bs=8",
                "--nope",
                "x",
                "--list",
                "--mode",
            ]),
        );
        assert_eq!(a.unexpanded, ["$EXTRA_ARGS"]);
        let v = a.verdicts;
        let st: Vec<Status> = v.iter().map(|v| v.status).collect();
        use Status::*;
        assert_eq!(
            st,
            [
                Ok,
                Alias,
                Abbrev,
                InvalidChoice,
                Ok,
                Deprecated,
                Ambiguous,
                Unknown,
                MissingValue,
                MissingValue
            ]
        );
        assert_eq!(v[1].canonical.as_deref(), Some("--ep-size"));
        assert_eq!(
            v[3].message.as_deref(),
            Some("argument --mode: invalid choice: 'c' (choose from 'a', 'b')")
        );
        assert_eq!(v[5].replacement.as_deref(), Some("--new"));
        assert_eq!(
            v[6].message.as_deref(),
            Some("ambiguous option: --cuda-graph-max-bs=8 could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill")
        );
        assert_eq!(
            v[7].value.as_deref(),
            Some("x"),
            "the unknown flag's value is not read as a flag"
        );
        assert_eq!(exit_status(&v, &[]), 2);
        assert_eq!(
            exit_status(&audit(&s, None, &args(&["--old"])).verdicts, &[]),
            1
        );
        assert_eq!(
            exit_status(
                &audit(&s, None, &args(&["--ep", "$EP", "--mode", "$MODE"])).verdicts,
                &[]
            ),
            0,
            "symbolic values are not judged"
        );
    }

    #[test]
    fn env_variables_known_deprecated_removed_unknown() {
        let with = |vars: serde_json::Value| {
            Schema::from_json(&json!({"actions": [], "env": vars})).unwrap()
        };
        let now = with(
            json!([{"name": "SGLANG_A"}, {"name": "SGLANG_OLD", "deprecated": true, "replacement": "SGLANG_NEW"}]),
        );
        let before =
            with(json!([{"name": "SGLANG_GONE", "deprecated": true, "replacement": "SGLANG_A"}]));
        let env: Vec<(String, String)> = [
            "SGLANG_A",
            "SGLANG_OLD",
            "SGLANG_GONE",
            "SGLANG_TYPO",
            "CUDA_VISIBLE_DEVICES",
        ]
        .iter()
        .map(|k| (k.to_string(), "1".to_string()))
        .collect();
        let v = audit_env(&now, Some(&before), &env);
        let got: Vec<(&str, &str, Option<&str>)> = v
            .iter()
            .map(|e| (e.name.as_str(), e.status, e.replacement.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("SGLANG_A", "ok", None),
                ("SGLANG_OLD", "deprecated", Some("SGLANG_NEW")),
                ("SGLANG_GONE", "removed", Some("SGLANG_A")),
                ("SGLANG_TYPO", "unknown", None)
            ]
        );
        assert_eq!(exit_status(&[], &v), 1);
        let old_dump = Schema::from_json(&json!({"actions": []})).unwrap();
        assert_eq!(audit_env(&old_dump, None, &env)[0].status, "unchecked");
    }
}
