//! One verdict per flag of a launch command, decided the way argparse itself will decide it
//! (exact option string, then a unique prefix — `allow_abbrev` is on in every SGLang version —
//! else "ambiguous option" or "unrecognized arguments"), plus deprecations, choices and missing
//! values. A baseline schema names flags that were removed and where they went.
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
}

/// What argparse resolves `flag` to in `schema`.
enum Match<'a> {
    Exact(&'a Opt),
    Abbrev(&'a Opt),
    Ambiguous(Vec<String>),
    None,
}

fn resolve<'a>(schema: &'a Schema, flag: &str) -> Match<'a> {
    if let Some(o) = schema.exact(flag) {
        return Match::Exact(o);
    }
    let found = schema.prefixed(flag);
    match found.as_slice() {
        [] => Match::None,
        [(o, _)] => Match::Abbrev(o),
        // Several option strings of one action (its aliases) still mean that action.
        [(first, _), rest @ ..] if rest.iter().all(|(o, _)| std::ptr::eq(*o, *first)) => {
            Match::Abbrev(first)
        }
        many => Match::Ambiguous(many.iter().map(|(_, s)| s.to_string()).collect()),
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
    let o = match resolve(b, flag) {
        Match::Exact(o) | Match::Abbrev(o) => o,
        _ => return None,
    };
    let r = o.replacement.clone()?;
    Some(match value {
        Some(v) if inline && !r.contains('=') => format!("{r}={v}"),
        _ => r,
    })
}

/// The verdicts on a launch's flags, and the words in flag position that only the shell expands
/// (`$EXTRA_ARGS`): whatever flags they carry are not audited.
#[derive(Debug, Clone)]
pub struct Audit {
    pub verdicts: Vec<Verdict>,
    pub unexpanded: Vec<String>,
}

/// Audit `args` (the arguments after `sglang serve`).
pub fn audit(schema: &Schema, baseline: Option<&Schema>, args: &[String]) -> Audit {
    let mut out = Vec::new();
    let mut unexpanded = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if !arg.starts_with("--") || arg == "--" {
            // Values were consumed by their flag: what is left here is positional.
            if arg.starts_with('$') {
                unexpanded.push(arg.clone());
            }
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut v = Verdict {
            flag: flag.clone(),
            value: inline.clone(),
            status: Status::Ok,
            canonical: None,
            replacement: None,
            candidates: Vec::new(),
            message: None,
        };
        let opt = match resolve(schema, &flag) {
            Match::Exact(o) => {
                if flag != o.canonical() {
                    v.status = Status::Alias;
                    v.canonical = Some(o.canonical().to_string());
                }
                Some(o)
            }
            Match::Abbrev(o) => {
                v.status = Status::Abbrev;
                v.canonical = Some(o.canonical().to_string());
                Some(o)
            }
            Match::Ambiguous(c) => {
                v.status = Status::Ambiguous;
                v.message = Some(format!(
                    "ambiguous option: {arg} could match {}",
                    c.join(", ")
                ));
                v.candidates = c;
                None
            }
            Match::None => {
                let had = baseline.is_some_and(|b| {
                    !matches!(resolve(b, &flag), Match::None | Match::Ambiguous(_))
                });
                v.status = if had {
                    Status::Removed
                } else {
                    Status::Unknown
                };
                v.message = Some(format!("unrecognized arguments: {arg}"));
                None
            }
        };
        let Some(o) = opt else {
            // Its value (if separate) belongs to it: skip it so it is not read as a flag.
            let value = if inline.is_none() && args.get(i).is_some_and(|n| !n.starts_with("--")) {
                i += 1;
                args.get(i - 1).cloned()
            } else {
                inline.clone()
            };
            v.value = value.clone();
            v.replacement = trail(baseline, &flag, value.as_deref(), inline.is_some());
            out.push(v);
            continue;
        };
        // The values the option consumes, as argparse would.
        let mut values: Vec<String> = inline.iter().cloned().collect();
        let takes_more = |n: Option<&String>| n.is_some_and(|n| !n.starts_with("--"));
        match o.nargs {
            Nargs::Zero => {}
            Nargs::One | Nargs::Exactly(_) if inline.is_none() => {
                let want = if let Nargs::Exactly(n) = o.nargs {
                    n as usize
                } else {
                    1
                };
                while values.len() < want && takes_more(args.get(i)) {
                    values.push(args[i].clone());
                    i += 1;
                }
                if values.len() < want {
                    v.status = Status::MissingValue;
                    v.message = Some(format!(
                        "argument {}: expected one argument",
                        o.option_strings.join("/")
                    ));
                }
            }
            Nargs::OneOrMore | Nargs::ZeroOrMore if inline.is_none() => {
                while takes_more(args.get(i)) {
                    values.push(args[i].clone());
                    i += 1;
                }
                if values.is_empty() && o.nargs == Nargs::OneOrMore {
                    v.status = Status::MissingValue;
                    v.message = Some(format!(
                        "argument {}: expected at least one argument",
                        o.option_strings.join("/")
                    ));
                }
            }
            Nargs::Optional if inline.is_none() && takes_more(args.get(i)) => {
                values.push(args[i].clone());
                i += 1;
            }
            _ => {}
        }
        if v.value.is_none() && !values.is_empty() {
            v.value = Some(values.join(" "));
        }
        if v.status != Status::MissingValue {
            if let Some(choices) = &o.choices {
                // `$VAR` values are symbolic: only the real launch knows them.
                if let Some(bad) = values
                    .iter()
                    .find(|x| !x.starts_with('$') && !choices.contains(x))
                {
                    v.status = Status::InvalidChoice;
                    let quoted: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
                    v.message = Some(format!(
                        "argument {}: invalid choice: '{bad}' (choose from {})",
                        o.option_strings.join("/"),
                        quoted.join(", ")
                    ));
                }
            }
        }
        if o.deprecated && !v.status.fails() {
            v.status = Status::Deprecated;
            v.replacement = o.replacement.clone();
        }
        out.push(v);
    }
    Audit {
        verdicts: out,
        unexpanded,
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
        ] {
            assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        }
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
