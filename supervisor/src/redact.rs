//! Secrets never leave the process: the one rule for which keys are secret, applied to every
//! JSON object we emit (events, and later metrics labels and reports).
use serde_json::Value;

pub const REDACTED: &str = "<redacted>";

/// `api_key`, `admin_api_key`, and every name ending in `api_key`, `secret`, `password` or `_token`
/// (any case: `hf_token`, `HF_TOKEN`). `max_prefill_tokens`, `tokenizer_path` and `ssl_keyfile`
/// are not secrets.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.ends_with("api_key")
        || n.ends_with("secret")
        || n.ends_with("password")
        || n.ends_with("_token")
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

/// Redact `--api-key VALUE` / `--api-key=VALUE` style secrets in an argv (for the `spawned` event).
pub fn redact_argv(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut hide_next = false;
    for a in argv {
        if hide_next {
            out.push(REDACTED.to_string());
            hide_next = false;
            continue;
        }
        if let Some(flag) = a.strip_prefix("--") {
            let (name, has_value) = match flag.split_once('=') {
                Some((n, _)) => (n, true),
                None => (flag, false),
            };
            if is_secret_name(&name.replace('-', "_")) {
                if has_value {
                    out.push(format!("--{name}={REDACTED}"));
                } else {
                    out.push(a.clone());
                    hide_next = true;
                }
                continue;
            }
        }
        out.push(a.clone());
    }
    out
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
        ] {
            assert!(is_secret_name(s), "{s}");
        }
        for s in [
            "tokenizer_path",
            "max_prefill_tokens",
            "ssl_keyfile",
            "model_path",
            "tokens",
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
}
