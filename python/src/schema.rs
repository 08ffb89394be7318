//! A flag schema: SGLang's argparse actions as dumped from the real parser
//! (`ServerArgs.add_cli_args(ArgumentParser(prog="sglang serve"))`, reference/sglang.md §4).
use serde_json::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{path} is not a flag schema: {why}")]
    Format { path: String, why: String },
    #[error("--sglang {given}: {why}")]
    BadSource { given: String, why: String },
}

/// How many values an option takes (argparse `nargs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nargs {
    One,
    Zero,
    Optional,
    ZeroOrMore,
    OneOrMore,
    Exactly(u64),
}

impl Nargs {
    /// As argparse spells it: null, 0, "?", "*", "+", or a count.
    pub fn as_argparse(self) -> Value {
        match self {
            Nargs::One => Value::Null,
            Nargs::Zero => 0.into(),
            Nargs::Optional => "?".into(),
            Nargs::ZeroOrMore => "*".into(),
            Nargs::OneOrMore => "+".into(),
            Nargs::Exactly(n) => n.into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Opt {
    pub option_strings: Vec<String>,
    pub dest: String,
    pub nargs: Nargs,
    pub choices: Option<Vec<String>>,
    pub deprecated: bool,
    /// Where a deprecated flag points (`new_flag`, or a `--flag` named in its help text).
    pub replacement: Option<String>,
    pub help: Option<String>,
    pub kind: Option<String>,
    /// The argparse action class (`_StoreAction`, `DeprecatedAliasStoreAction`, ...).
    pub action: Option<String>,
    /// What a deprecated store-const flag writes (`const_value`), else argparse's `const`.
    pub const_value: Value,
    pub default: Value,
    /// Fields a static read left as `{"unresolved": source}` (default, choices, type, help).
    pub unresolved: Vec<String>,
    /// What a retired flag (`DeprecatedAction(error_message=...)`) stops the launch with.
    pub error_message: Option<String>,
    /// argparse's own `-h/--help`: prints the help and exits 0.
    pub is_help: bool,
}

impl Opt {
    /// argparse's `-h/--help` action.
    pub fn argparse_help() -> Opt {
        Opt {
            option_strings: vec!["-h".into(), "--help".into()],
            dest: "help".into(),
            nargs: Nargs::Zero,
            choices: None,
            deprecated: false,
            replacement: None,
            help: None,
            kind: None,
            action: Some("_HelpAction".into()),
            const_value: Value::Null,
            default: Value::Null,
            unresolved: Vec::new(),
            error_message: None,
            is_help: true,
        }
    }

    /// The canonical spelling: the first long option string.
    pub fn canonical(&self) -> &str {
        self.option_strings
            .iter()
            .find(|s| s.starts_with("--"))
            .or(self.option_strings.first())
            .map_or("", String::as_str)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Schema {
    pub version: Option<String>,
    pub options: Vec<Opt>,
    /// How it was read: "import", "static", or what a saved dump says.
    pub method: Option<String>,
    /// The variables environ.py defines; `None` when unknown (an old dump, or no environ.py).
    pub env: Option<Vec<EnvVar>>,
    /// argparse's `-h/--help`, first in the parser (kept apart: it is no SGLang option, but it
    /// takes part in argparse's matching).
    pub help: Option<Opt>,
    /// The wheel or tree the schema was read from (for the package's own environment reads).
    pub root: Option<String>,
}

fn replacement_from_help(help: &str) -> Option<String> {
    // "(Deprecated: use --flashinfer-allreduce-fusion-backend=auto) ...", "Use --x instead."
    let lower = help.to_ascii_lowercase();
    let at = lower.find("use ")?;
    help[at + 4..]
        .split_whitespace()
        .next()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_alphanumeric())
                .to_string()
        })
}

/// The flags module (import and static modes), run embedded or in a subprocess of a python3.
pub const FLAGS_PY: &str = include_str!("../py/sglang_flags.py");

/// What a `--sglang SOURCE` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A saved schema.
    Json(String),
    /// A Python interpreter (or a venv's): import its SGLang.
    Interpreter(String),
    /// A `.whl` or an unpacked source / site-packages tree: read its sources, import nothing.
    Static(String),
}

impl Source {
    pub fn parse(source: &str) -> Result<Source, SchemaError> {
        let p = Path::new(source);
        let bad = |why: &str| SchemaError::BadSource {
            given: source.to_string(),
            why: why.to_string(),
        };
        if source.ends_with(".json") {
            return Ok(Source::Json(source.into()));
        }
        if source.ends_with(".whl") {
            return if p.is_file() {
                Ok(Source::Static(source.into()))
            } else {
                Err(bad("no such wheel file"))
            };
        }
        if p.is_dir() {
            let tree = [
                "sglang/srt/server_args.py",
                "python/sglang/srt/server_args.py",
                "srt/server_args.py",
            ];
            if tree.iter().any(|t| p.join(t).is_file()) {
                return Ok(Source::Static(source.into()));
            }
            let venv = p.join("bin/python3");
            if venv.exists() {
                return Ok(Source::Interpreter(venv.to_string_lossy().into_owned()));
            }
            return Err(bad("a directory that is neither a virtual environment (bin/python3) nor an SGLang tree (sglang/srt/server_args.py)"));
        }
        Ok(Source::Interpreter(source.into()))
    }
}

/// An `SGLANG_*` environment variable a version defines (`sglang/srt/environ.py`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub deprecated: bool,
    pub replacement: Option<String>,
}

impl Schema {
    /// A schema from its JSON text (the flags module's output, or a saved dump), with the JSON
    /// itself; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<(Schema, Value), SchemaError> {
        let format = |why: String| SchemaError::Format {
            path: source.into(),
            why,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| format(e.to_string()))?;
        let schema = Self::from_json(&v).map_err(format)?;
        // Every launch flag would then be unknown, and a good launch stopped as a bad one.
        if schema.options.is_empty() {
            return Err(format(
                "no option in it (no action with option_strings); save one with `flags dump`"
                    .into(),
            ));
        }
        Ok((schema, v))
    }

    pub fn from_json(v: &Value) -> Result<Schema, String> {
        let actions = v["actions"]
            .as_array()
            .or_else(|| v["options"].as_array())
            .ok_or("no \"actions\" array")?;
        let mut options = Vec::new();
        let mut help_action = None;
        for a in actions {
            let strings: Vec<String> = a["option_strings"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            if strings.is_empty() {
                continue;
            }
            let nargs = match &a["nargs"] {
                Value::Null => Nargs::One,
                Value::Number(n) if n.as_u64() == Some(0) => Nargs::Zero,
                Value::Number(n) => Nargs::Exactly(n.as_u64().unwrap_or(1)),
                Value::String(s) if s == "?" => Nargs::Optional,
                Value::String(s) if s == "*" => Nargs::ZeroOrMore,
                Value::String(s) if s == "+" => Nargs::OneOrMore,
                _ => Nargs::One,
            };
            let help = a["help"].as_str().map(String::from);
            // Some deprecations are plain store_true actions marked only in their help text.
            let help_says = help.as_deref().is_some_and(|h| {
                let h = h.trim_start();
                h.starts_with("[Deprecated]")
                    || h.starts_with("(Deprecated")
                    || h.starts_with("Deprecated.")
                    || h.starts_with("Removed.")
            });
            let deprecated = a["deprecated"].as_bool().unwrap_or(false)
                || a["deprecated"].is_object()
                || a["action"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("Deprecated"))
                || help_says;
            let replacement = a["new_flag"]
                .as_str()
                .map(String::from)
                .or_else(|| a["deprecated"]["replacement"].as_str().map(String::from))
                .or_else(|| {
                    if deprecated {
                        help.as_deref().and_then(replacement_from_help)
                    } else {
                        None
                    }
                });
            let error_message = match &a["error_message"] {
                Value::Null => None,
                Value::String(m) => Some(m.clone()),
                // Unresolved by a static read: the launch still stops, with a message we lack.
                other => Some(other.to_string()),
            };
            let is_help = a["dest"] == "help";
            let opt = Opt {
                option_strings: strings,
                dest: a["dest"].as_str().unwrap_or("").to_string(),
                nargs,
                choices: a["choices"].as_array().map(|c| {
                    c.iter()
                        .map(|x| x.as_str().map_or_else(|| x.to_string(), String::from))
                        .collect()
                }),
                deprecated,
                replacement,
                help,
                kind: a["type"].as_str().map(String::from),
                action: a["action"].as_str().map(String::from),
                const_value: match &a["const_value"] {
                    Value::Null => a["const"].clone(),
                    v => v.clone(),
                },
                default: a["default"].clone(),
                unresolved: ["default", "choices", "type"]
                    .iter()
                    .filter(|f| a[**f].get("unresolved").is_some())
                    .map(|f| f.to_string())
                    .chain(a.get("help_unresolved").map(|_| "help".to_string()))
                    .collect(),
                error_message,
                is_help,
            };
            if is_help {
                help_action = Some(opt);
            } else {
                options.push(opt);
            }
        }
        let env = v["env"].as_array().map(|vars| {
            vars.iter()
                .filter_map(|e| {
                    Some(EnvVar {
                        name: e["name"].as_str()?.to_string(),
                        deprecated: e["deprecated"].as_bool().unwrap_or(false),
                        replacement: e["replacement"].as_str().map(String::from),
                    })
                })
                .collect()
        });
        Ok(Schema {
            version: v["sglang_version"].as_str().map(String::from),
            options,
            method: v["method"].as_str().map(String::from),
            env,
            // Every SGLang parser has argparse's default help (`add_help=True`), dumped or not.
            help: Some(help_action.unwrap_or_else(Opt::argparse_help)),
            root: v["root"].as_str().map(String::from),
        })
    }

    /// Every action argparse matches against, help first, in the parser's order.
    fn actions(&self) -> impl Iterator<Item = &Opt> {
        self.help.iter().chain(&self.options)
    }

    /// The option that has exactly this option string.
    pub fn exact(&self, flag: &str) -> Option<&Opt> {
        self.actions()
            .find(|o| o.option_strings.iter().any(|s| s == flag))
    }

    /// Option strings that start with `prefix`, in the parser's order (argparse's abbreviation rule).
    pub fn prefixed(&self, prefix: &str) -> Vec<(&Opt, &str)> {
        self.actions()
            .flat_map(|o| {
                o.option_strings
                    .iter()
                    .filter(|s| s.starts_with(prefix))
                    .map(move |s| (o, s.as_str()))
            })
            .collect()
    }
}
