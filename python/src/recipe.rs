//! The SGLang launch inside a bash recipe: `python3 -m sglang.launch_server ...` or
//! `sglang serve ...`, over line continuations, with quotes, `--flag=value` and `--flag value`;
//! `$VAR` values are kept symbolic; the command ends at a redirection, pipe, `&`, `;` or `&&`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The arguments after the launcher (`--model-path`, ...).
    pub args: Vec<String>,
    /// `NAME=value` assignments in front of the command and `export NAME=value` lines before it.
    pub env: Vec<(String, String)>,
    /// 1-based line where the launch starts.
    pub line: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecipeError {
    #[error("no SGLang launch in the recipe (looked for `python3 -m sglang.launch_server` and `sglang serve`)")]
    NotFound,
    #[error("line {line}: unterminated {quote} in the launch command")]
    Unterminated { line: usize, quote: char },
}

/// Shell words of one logical line; operators come back as their own words.
fn words(s: &str, line: usize) -> Result<Vec<String>, RecipeError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                has = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => return Err(RecipeError::Unterminated { line, quote: '\'' }),
                    }
                }
            }
            '"' => {
                has = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => {
                            if let Some(x) = chars.next() {
                                cur.push(x);
                            }
                        }
                        Some(x) => cur.push(x),
                        None => return Err(RecipeError::Unterminated { line, quote: '"' }),
                    }
                }
            }
            '\\' => {
                if let Some(x) = chars.next() {
                    cur.push(x);
                    has = true;
                }
            }
            // `$((ISL + OSL))`, `$(cmd args)`, `${X:-a b}`: one word, spaces and all.
            '$' if matches!(chars.peek(), Some('(' | '{')) => {
                has = true;
                cur.push('$');
                let mut depth = 0usize;
                for x in chars.by_ref() {
                    cur.push(x);
                    match x {
                        '(' | '{' => depth += 1,
                        ')' | '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                if depth != 0 {
                    return Err(RecipeError::Unterminated { line, quote: '(' });
                }
            }
            '#' if !has => break,
            c if c.is_whitespace() => {
                if has {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            '|' | '&' | ';' | '<' | '>' => {
                // `2>&1`: the digit belongs to the redirection.
                if has && !(cur.chars().all(|d| d.is_ascii_digit()) && (c == '>' || c == '<')) {
                    out.push(std::mem::take(&mut cur));
                }
                cur.clear();
                has = false;
                out.push(c.to_string());
            }
            c => {
                cur.push(c);
                has = true;
            }
        }
    }
    if has {
        out.push(cur);
    }
    Ok(out)
}

fn is_assignment(w: &str) -> Option<(String, String)> {
    let (k, v) = w.split_once('=')?;
    (!k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !k.starts_with(|c: char| c.is_ascii_digit()))
    .then(|| (k.to_string(), v.to_string()))
}

/// Find the first launch in `text`.
pub fn extract(text: &str) -> Result<Launch, RecipeError> {
    // Join continuation lines, remembering where each logical line starts.
    let mut logical: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let (start, mut acc) = pending.take().unwrap_or((i + 1, String::new()));
        if let Some(body) = raw.strip_suffix('\\') {
            acc.push_str(body);
            acc.push(' ');
            pending = Some((start, acc));
        } else {
            acc.push_str(raw);
            logical.push((start, acc));
        }
    }
    if let Some(p) = pending {
        logical.push(p);
    }
    let mut exported = Vec::new();
    for (line, l) in &logical {
        let w = words(l, *line)?;
        if w.first().map(String::as_str) == Some("export") {
            exported.extend(w[1..].iter().filter_map(|x| is_assignment(x)));
            continue;
        }
        let mut i = 0;
        let mut env = Vec::new();
        while i < w.len() {
            // Skip launcher prefixes: env assignments, `nohup`, `exec`, `env`, `time`.
            if let Some(a) = is_assignment(&w[i]) {
                env.push(a);
                i += 1;
                continue;
            }
            if matches!(w[i].as_str(), "nohup" | "exec" | "env" | "time" | "numactl") {
                i += 1;
                continue;
            }
            break;
        }
        let rest = &w[i..];
        let start = if rest.len() >= 3
            && rest[0].starts_with("python")
            && rest[1] == "-m"
            && rest[2] == "sglang.launch_server"
        {
            Some(3)
        } else if rest.len() >= 2 && rest[0].ends_with("sglang") && rest[1] == "serve" {
            Some(2)
        } else {
            None
        };
        let Some(s) = start else { continue };
        let args: Vec<String> = rest[s..]
            .iter()
            .take_while(|x| !matches!(x.as_str(), "|" | "&" | ";" | "<" | ">"))
            .cloned()
            .collect();
        let mut all_env = exported.clone();
        all_env.extend(env);
        return Ok(Launch {
            args,
            env: all_env,
            line: *line,
        });
    }
    Err(RecipeError::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_a_typical_inferencex_launch() {
        let recipe = r#"#!/usr/bin/env bash
export SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=180
MODEL=/models/qwen
python3 -m sglang.launch_server --model-path $MODEL --tp 8 \
    --mem-fraction-static=0.8 --attention-backend "flashinfer" \
    --cuda-graph-max-bs 128 --api-key 'sk x' > $SERVER_LOG 2>&1 &
SERVER_PID=$!
"#;
        let l = extract(recipe).unwrap();
        assert_eq!(l.line, 4);
        assert_eq!(
            l.args,
            [
                "--model-path",
                "$MODEL",
                "--tp",
                "8",
                "--mem-fraction-static=0.8",
                "--attention-backend",
                "flashinfer",
                "--cuda-graph-max-bs",
                "128",
                "--api-key",
                "sk x"
            ]
        );
        assert_eq!(
            l.env,
            [(
                "SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT".to_string(),
                "180".to_string()
            )]
        );
    }

    #[test]
    fn sglang_serve_with_env_prefix_and_pipes() {
        let l =
            extract("SGLANG_LOG_MS=1 sglang serve --model-path m --port 8000 | tee log\n").unwrap();
        assert_eq!(l.args, ["--model-path", "m", "--port", "8000"]);
        assert_eq!(l.env, [("SGLANG_LOG_MS".to_string(), "1".to_string())]);
        assert_eq!(extract("echo hi\n"), Err(RecipeError::NotFound));
        assert!(matches!(
            extract("python3 -m sglang.launch_server --model-path 'x\n"),
            Err(RecipeError::Unterminated { .. })
        ));
    }

    #[test]
    fn substitutions_with_spaces_stay_one_word() {
        let l = extract(
            "python3 -m sglang.launch_server --context-length $((ISL + OSL + 20)) --model \"${MODEL:-a b}\" --x $(nproc --all) $EXTRA_ARGS\n",
        )
        .unwrap();
        assert_eq!(
            l.args,
            [
                "--context-length",
                "$((ISL + OSL + 20))",
                "--model",
                "${MODEL:-a b}",
                "--x",
                "$(nproc --all)",
                "$EXTRA_ARGS"
            ]
        );
        assert!(matches!(
            extract("python3 -m sglang.launch_server --x $((1 + 2)\n"),
            Err(RecipeError::Unterminated { .. })
        ));
    }
}
