//! Secrets never leave the process: the one rule for which keys are secret, applied to every
//! JSON object we emit (events, and later metrics labels and reports).
use serde_json::Value;

pub const REDACTED: &str = "<redacted>";

/// By pattern, any case: `*_TOKEN`, `*_KEY`, `*SECRET*`, `*PASSWORD*`, `*_PAT` (`HF_TOKEN`,
/// `api_key`, `AWS_SECRET_ACCESS_KEY`, `GITHUB_PAT`, `ssl_keyfile_password`). Figures named per
/// token (`joules_per_output_token`, `bucket_time_to_first_token`), `max_prefill_tokens`,
/// `tokenizer_path` and `ssl_keyfile` are not secrets.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let figure = n.contains("per_") || n.ends_with("first_token");
    n.contains("secret")
        || n.contains("password")
        || n.ends_with("_key")
        || n.ends_with("_pat")
        || (n.ends_with("_token") && !figure)
        || n == "token"
}

/// Replace secret values (recursively) with `"<redacted>"`. `null` stays `null`: "unset" is not a secret.
pub fn redact_value(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                if is_secret_name(k) && !val.is_null() {
                    *val = Value::String(REDACTED.into());
                } else {
                    redact_value(val);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_value),
        _ => {}
    }
}

/// What a word of an argv is to secrets: the value after `--api-key`, or `--api-key=VALUE`.
enum Word<'a> {
    Plain,
    /// `--NAME=VALUE` with a secret NAME.
    Inline(&'a str, &'a str),
    /// The word after a bare secret flag.
    Value,
}

/// Each word of `argv` with what it is: the one reading of secret flags in an argv.
fn words(argv: &[String]) -> impl Iterator<Item = (&String, Word<'_>)> {
    let mut next_is_value = false;
    argv.iter().map(move |a| {
        if std::mem::take(&mut next_is_value) {
            return (a, Word::Value);
        }
        let secret = |name: &str| is_secret_name(&name.replace('-', "_"));
        let word = match a.strip_prefix("--").map(|f| f.split_once('=').ok_or(f)) {
            Some(Ok((name, value))) if secret(name) => Word::Inline(name, value),
            Some(Err(name)) if secret(name) => {
                next_is_value = true;
                Word::Plain
            }
            _ => Word::Plain,
        };
        (a, word)
    })
}

/// Redact `--api-key VALUE` / `--api-key=VALUE` style secrets in an argv (for the `spawned` event).
pub fn redact_argv(argv: &[String]) -> Vec<String> {
    words(argv)
        .map(|(a, w)| match w {
            Word::Plain => a.clone(),
            Word::Inline(name, _) => format!("--{name}={REDACTED}"),
            Word::Value => REDACTED.to_string(),
        })
        .collect()
}

/// The secret *values* of a run: what follows a secret flag in the child's argv (`--api-key X`,
/// `--admin-api-key=X`) and the values of secret-named environment variables (`HF_TOKEN`). Names
/// are redacted where a key is known (JSON); these values are found and replaced anywhere else a
/// secret could travel: free text such as a traceback quoted in an event, and with `--redact-log`
/// the log file and the terminal copy.
#[derive(Clone, Default)]
pub struct Secrets {
    values: Vec<Vec<u8>>,
    finder: Option<aho_corasick::AhoCorasick>,
}

/// Shorter values are not treated as secrets: replacing every `1` in a log helps nobody.
const MIN_SECRET_LEN: usize = 4;

impl Secrets {
    pub fn from_run(argv: &[String], env: impl Iterator<Item = (String, String)>) -> Secrets {
        let mut values: Vec<String> = words(argv)
            .filter_map(|(a, w)| match w {
                Word::Plain => None,
                Word::Inline(_, v) => Some(v.to_string()),
                Word::Value => Some(a.clone()),
            })
            .collect();
        values.extend(env.filter(|(k, _)| is_secret_name(k)).map(|(_, v)| v));
        values.retain(|v| v.len() >= MIN_SECRET_LEN);
        // Also as they appear inside a JSON string.
        let escaped: Vec<String> = values
            .iter()
            .filter_map(|v| {
                let e = serde_json::to_string(v).ok()?;
                let e = e[1..e.len() - 1].to_string();
                (e != *v).then_some(e)
            })
            .collect();
        values.extend(escaped);
        values.sort();
        values.dedup();
        let values: Vec<Vec<u8>> = values.into_iter().map(String::into_bytes).collect();
        let finder = (!values.is_empty())
            .then(|| {
                aho_corasick::AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                    .build(&values)
                    .ok()
            })
            .flatten();
        Secrets { values, finder }
    }

    pub fn is_empty(&self) -> bool {
        self.finder.is_none()
    }

    /// `bytes` with every secret value replaced by `<redacted>` (borrowed when there is none).
    pub fn redact<'a>(&self, bytes: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        let Some(f) = &self.finder else {
            return bytes.into();
        };
        if !f.is_match(bytes) {
            return bytes.into();
        }
        let mut out = Vec::with_capacity(bytes.len());
        f.replace_all_with_bytes(bytes, &mut out, |_, _, dst| {
            dst.extend_from_slice(REDACTED.as_bytes());
            true
        });
        out.into()
    }

    /// The longest tail of `bytes` that could be the start of a secret split across two reads.
    fn open_prefix(&self, bytes: &[u8]) -> usize {
        let longest = self.values.iter().map(Vec::len).max().unwrap_or(0);
        (1..longest.min(bytes.len() + 1))
            .rev()
            .find(|&k| {
                let tail = &bytes[bytes.len() - k..];
                self.values
                    .iter()
                    .any(|v| v.len() > k && v.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

/// Redaction of a byte stream read in chunks: a secret split across two reads is still found.
/// Bytes that might begin a secret are held back until the next chunk (or [`finish`]).
///
/// [`finish`]: StreamRedactor::finish
pub struct StreamRedactor {
    secrets: Secrets,
    held: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(secrets: Secrets) -> Self {
        StreamRedactor {
            secrets,
            held: Vec::new(),
        }
    }

    /// The redacted bytes that can be released now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        let out = self.secrets.redact(&buf).into_owned();
        let keep = self.secrets.open_prefix(&out);
        self.held = out[out.len() - keep..].to_vec();
        let mut out = out;
        out.truncate(out.len() - keep);
        out
    }

    /// What is still held, at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_names_follow_the_contract() {
        for s in [
            "api_key",
            "admin_api_key",
            "hf_token",
            "HF_TOKEN",
            "ssl_keyfile_password",
            "client_secret",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "GITHUB_PAT",
            "OPENAI_API_KEY",
            "WANDB_KEY",
            "DB_PASSWORD_FILE",
            "MY_SECRET_VALUE",
        ] {
            assert!(is_secret_name(s), "{s}");
        }
        for s in [
            "tokenizer_path",
            "max_prefill_tokens",
            "ssl_keyfile",
            "model_path",
            "tokens",
            "joules_per_output_token",
            "bucket_time_to_first_token",
            "kt_max_deferred_experts_per_token",
            "ssl_keyfile",
            "PATH",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert!(!is_secret_name(s), "{s}");
        }
    }

    #[test]
    fn redacts_nested_values_but_keeps_nulls() {
        let mut v = json!({"api_key": "sk-1", "admin_api_key": null, "nested": {"hf_token": "hf_x"},
                           "list": [{"password": 3}], "max_prefill_tokens": 16384});
        redact_value(&mut v);
        assert_eq!(
            v,
            json!({"api_key": "<redacted>", "admin_api_key": null, "nested": {"hf_token": "<redacted>"},
                             "list": [{"password": "<redacted>"}], "max_prefill_tokens": 16384})
        );
    }

    #[test]
    fn redacts_argv_in_both_flag_forms() {
        let argv: Vec<String> = [
            "python3",
            "--api-key",
            "sk-1",
            "--admin-api-key=sk-2",
            "--port",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            redact_argv(&argv),
            [
                "python3",
                "--api-key",
                "<redacted>",
                "--admin-api-key=<redacted>",
                "--port",
                "1"
            ]
        );
    }

    #[test]
    fn secret_values_come_from_argv_and_env_and_are_found_in_free_text() {
        let argv: Vec<String> = [
            "python3",
            "--api-key",
            "sk-live-1",
            "--admin-api-key=adm\"in99",
            "--tp",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let env = [
            ("HF_TOKEN".to_string(), "hf_abcdef".to_string()),
            ("PATH".into(), "/usr/bin".into()),
            ("X_TOKEN".into(), "1".into()),
        ];
        let s = Secrets::from_run(&argv, env.into_iter());
        let text =
            br#"Traceback: api_key='sk-live-1' token hf_abcdef {"k":"adm\"in99"} /usr/bin 1"#;
        assert_eq!(
            &*s.redact(text),
            br#"Traceback: api_key='<redacted>' token <redacted> {"k":"<redacted>"} /usr/bin 1"#
        );
        assert!(Secrets::from_run(&[], std::iter::empty()).is_empty());
    }

    #[test]
    fn a_secret_split_across_reads_is_still_redacted() {
        let argv = vec!["--api-key".to_string(), "sk-0123456789".to_string()];
        let secrets = Secrets::from_run(&argv, std::iter::empty());
        let input = b"line one\nkey=sk-0123456789 and sk-01234 partial\nsk-0123456789".to_vec();
        // Every split point, and one byte at a time.
        for cut in 0..input.len() {
            let mut r = StreamRedactor::new(secrets.clone());
            let mut out = r.feed(&input[..cut]);
            out.extend(r.feed(&input[cut..]));
            out.extend(r.finish());
            assert_eq!(
                out,
                b"line one\nkey=<redacted> and sk-01234 partial\n<redacted>".to_vec(),
                "cut at {cut}"
            );
        }
        let mut r = StreamRedactor::new(secrets);
        let mut out: Vec<u8> = input.iter().flat_map(|b| r.feed(&[*b])).collect();
        out.extend(r.finish());
        assert_eq!(
            out,
            b"line one\nkey=<redacted> and sk-01234 partial\n<redacted>".to_vec()
        );
    }
}
