//! The SGLang launches inside a bash recipe. The script is read as bash reads it — quotes and
//! `$(...)` across lines, line continuations, comments, here-documents — into commands; a command
//! is a launch where `PY -m sglang.launch_server` or `sglang serve` appears in it, whatever runs
//! in front (`numactl …`, `srun …`, `timeout N`, `env A=B`, `nohup`, `exec`, `then`, …), with any
//! interpreter (`python3`, `"$SGLANG_PYTHON"`, `/opt/venv/bin/python3`). A launch kept in a bash
//! array (`cmd=(python3 -m …)`, `cmd+=(…)`, run as `"${cmd[@]}"`) or a string (`CMD="python3 -m
//! …"`, run as `$CMD`, `eval "$CMD"` or `bash -c "$CMD"`) is read where it runs. Every launch is
//! found (if/else branches: one each). `$VAR` arguments are kept symbolic; the command ends at a
//! redirection, pipe, `&`, `;`, `&&` or `)`. A variable holding a launch that is never seen to run
//! is an error naming its line: a launch seen but not read is never reported as fine.
use std::collections::BTreeMap;

/// One SGLang launch: the typed value other readers (`--nnodes`, `--node-rank`) start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The interpreter (`python3`, `$SGLANG_PYTHON`) or the `sglang` script, as written.
    pub program: String,
    /// The arguments after the launcher (`--model-path`, ...).
    pub args: Vec<String>,
    /// `NAME=value` assignments in front of the command and `export NAME=value` lines before it.
    pub env: Vec<(String, String)>,
    /// 1-based line where the launch runs (for a kept command: where it is run, not built).
    pub line: usize,
}

impl Launch {
    /// The launcher words (`python3 -m sglang.launch_server`, `sglang serve`).
    pub fn launcher(&self) -> [&str; 3] {
        if self.program.rsplit('/').next() == Some("sglang") {
            [self.program.as_str(), "serve", ""]
        } else {
            [self.program.as_str(), "-m", "sglang.launch_server"]
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecipeError {
    #[error("no SGLang launch in the recipe (looked for `PY -m sglang.launch_server` and `sglang serve`, also kept in a bash array or string)")]
    NotFound,
    #[error(
        "line {line}: unterminated {quote} (opened there; the launches after it cannot be read)"
    )]
    Unterminated { line: usize, quote: char },
    #[error("line {line}: {why}")]
    Unreadable { line: usize, why: String },
}

/// A shell word: its text with quotes removed (`$VAR` kept as written), and whether any of it
/// was quoted (a quoted `"$X"` stays one word; an unquoted `$X` splits).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Word {
    text: String,
    quoted: bool,
    line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(Word),
    /// `name=(...)` / `name+=(...)`.
    Array {
        name: String,
        append: bool,
        items: Vec<Word>,
        line: usize,
    },
    /// `;`, `&`, `|`, `&&`, `||`, newline, `(`, `)`, a redirection: ends a command.
    Op(String),
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    /// Here-document delimiters seen on this line (`<<EOF`, `<<-EOF`): bodies follow it.
    heredocs: Vec<(String, bool)>,
    /// How deep in nested arrays (`a=(b=(...))`) this lexer reads: bounded, so no input
    /// exhausts the stack.
    depth: usize,
}

/// Nested arrays deeper than this are not a recipe.
const MAX_DEPTH: usize = 8;
/// A command whose variables expand to more alternatives than this is cut there.
const MAX_ALTERNATIVES: usize = 64;

impl Lexer<'_> {
    fn next_char(&mut self) -> Option<char> {
        let c = self.chars.next();
        if c == Some('\n') {
            self.line += 1;
        }
        c
    }

    fn unterminated(&self, line: usize, quote: char) -> RecipeError {
        RecipeError::Unterminated { line, quote }
    }

    /// The inside of `'...'`, after the opening quote.
    fn single(&mut self, out: &mut String, opened: usize) -> Result<(), RecipeError> {
        loop {
            match self.next_char() {
                Some('\'') => return Ok(()),
                Some(c) => out.push(c),
                None => return Err(self.unterminated(opened, '\'')),
            }
        }
    }

    /// The inside of `"..."`, after the opening quote (`\⏎` joins lines, `$(...)` may hold quotes).
    fn double(&mut self, out: &mut String, opened: usize) -> Result<(), RecipeError> {
        loop {
            match self.next_char() {
                Some('"') => return Ok(()),
                Some('\\') => match self.next_char() {
                    Some('\n') => {}
                    Some(c @ ('"' | '\\' | '$' | '`')) => out.push(c),
                    Some(c) => {
                        out.push('\\');
                        out.push(c);
                    }
                    None => return Err(self.unterminated(opened, '"')),
                },
                Some('$') if matches!(self.chars.peek(), Some('(' | '{')) => {
                    out.push('$');
                    self.substitution(out)?;
                }
                Some('`') => {
                    out.push('`');
                    self.backquote(out)?;
                }
                Some(c) => out.push(c),
                None => return Err(self.unterminated(opened, '"')),
            }
        }
    }

    /// `$(...)`, `$((...))`, `${...}` kept whole, spaces, quotes and lines included.
    fn substitution(&mut self, out: &mut String) -> Result<(), RecipeError> {
        let opened = self.line;
        let mut depth = 0usize;
        while let Some(c) = self.next_char() {
            match c {
                '\'' if depth > 0 => {
                    out.push('\'');
                    self.single(out, self.line)?;
                    out.push('\'');
                    continue;
                }
                '"' if depth > 0 => {
                    out.push('"');
                    self.double(out, self.line)?;
                    out.push('"');
                    continue;
                }
                '\\' => {
                    out.push('\\');
                    if let Some(n) = self.next_char() {
                        out.push(n);
                    }
                    continue;
                }
                _ => {}
            }
            out.push(c);
            match c {
                '(' | '{' => depth += 1,
                ')' | '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(self.unterminated(opened, '('))
    }

    fn backquote(&mut self, out: &mut String) -> Result<(), RecipeError> {
        let opened = self.line;
        loop {
            match self.next_char() {
                Some('`') => {
                    out.push('`');
                    return Ok(());
                }
                Some('\\') => {
                    if let Some(n) = self.next_char() {
                        out.push('\\');
                        out.push(n);
                    }
                }
                Some(c) => out.push(c),
                None => return Err(self.unterminated(opened, '`')),
            }
        }
    }

    /// After a newline: skip the bodies of the here-documents opened on the line just ended.
    fn skip_heredocs(&mut self) {
        for (delim, strip_tabs) in std::mem::take(&mut self.heredocs) {
            loop {
                let mut l = String::new();
                let mut any = false;
                while let Some(c) = self.next_char() {
                    any = true;
                    if c == '\n' {
                        break;
                    }
                    l.push(c);
                }
                let l = if strip_tabs {
                    l.trim_start_matches('\t')
                } else {
                    &l
                };
                if !any || l == delim {
                    break;
                }
            }
        }
    }

    /// The delimiter word after `<<` / `<<-` (quotes removed).
    fn heredoc_delimiter(&mut self) -> Result<(), RecipeError> {
        let strip_tabs = self.chars.peek() == Some(&'-');
        if strip_tabs {
            self.next_char();
        }
        while matches!(self.chars.peek(), Some(' ' | '\t')) {
            self.next_char();
        }
        let mut d = String::new();
        while let Some(&c) = self.chars.peek() {
            match c {
                '\'' => {
                    self.next_char();
                    self.single(&mut d, self.line)?;
                }
                '"' => {
                    self.next_char();
                    self.double(&mut d, self.line)?;
                }
                c if c.is_whitespace() || ";|&<>()".contains(c) => break,
                c => {
                    self.next_char();
                    d.push(c);
                }
            }
        }
        self.heredocs.push((d, strip_tabs));
        Ok(())
    }

    fn tokens(mut self) -> Result<Vec<Token>, RecipeError> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        let mut has = false;
        let mut start = self.line;
        macro_rules! flush {
            () => {
                if has {
                    out.push(Token::Word(Word {
                        text: std::mem::take(&mut cur),
                        quoted,
                        line: start,
                    }));
                    has = false;
                    quoted = false;
                }
            };
        }
        while let Some(c) = self.next_char() {
            if !has {
                start = self.line - usize::from(c == '\n');
            }
            match c {
                '\'' => {
                    has = true;
                    quoted = true;
                    self.single(&mut cur, self.line)?;
                }
                '"' => {
                    has = true;
                    quoted = true;
                    self.double(&mut cur, self.line)?;
                }
                '`' => {
                    has = true;
                    cur.push('`');
                    self.backquote(&mut cur)?;
                }
                '\\' => match self.next_char() {
                    Some('\n') | None => {}
                    Some(x) => {
                        cur.push(x);
                        has = true;
                    }
                },
                '$' if matches!(self.chars.peek(), Some('(' | '{')) => {
                    has = true;
                    cur.push('$');
                    self.substitution(&mut cur)?;
                }
                '#' if !has => {
                    while let Some(&n) = self.chars.peek() {
                        if n == '\n' {
                            break;
                        }
                        self.next_char();
                    }
                }
                '(' if has && !quoted && (cur.ends_with('=')) => {
                    // `name=(` / `name+=(`: an array, to its `)`.
                    let line = start;
                    let lhs = std::mem::take(&mut cur);
                    has = false;
                    let (name, append) = match lhs.strip_suffix("+=") {
                        Some(n) => (n.to_string(), true),
                        None => (lhs.trim_end_matches('=').to_string(), false),
                    };
                    let items = self.array_items(line)?;
                    out.push(Token::Array {
                        name,
                        append,
                        items,
                        line,
                    });
                }
                '\n' => {
                    flush!();
                    out.push(Token::Op("\n".into()));
                    self.skip_heredocs();
                }
                c if c.is_whitespace() => flush!(),
                '|' | '&' | ';' | '<' | '>' | '(' | ')' => {
                    // `2>&1`: the digit belongs to the redirection.
                    let fd = has && !quoted && cur.chars().all(|d| d.is_ascii_digit());
                    if fd && (c == '>' || c == '<') {
                        cur.clear();
                        has = false;
                    }
                    flush!();
                    let mut op = c.to_string();
                    if let Some(&n) = self.chars.peek() {
                        if (n == c && c != '(' && c != ')') || (c == '>' && n == '&') {
                            op.push(n);
                            self.next_char();
                        }
                    }
                    if op == "<<" {
                        if self.chars.peek() == Some(&'<') {
                            self.next_char(); // `<<<` here-string: its word follows
                        } else {
                            self.heredoc_delimiter()?;
                        }
                    }
                    out.push(Token::Op(op));
                }
                c => {
                    cur.push(c);
                    has = true;
                }
            }
        }
        if has {
            out.push(Token::Word(Word {
                text: cur,
                quoted,
                line: start,
            }));
        }
        Ok(out)
    }

    /// The words of `name=( ... )`, over lines and comments.
    fn array_items(&mut self, opened: usize) -> Result<Vec<Word>, RecipeError> {
        let mut inner = String::new();
        let mut depth = 1usize;
        loop {
            let Some(c) = self.next_char() else {
                return Err(self.unterminated(opened, '('));
            };
            match c {
                '\'' => {
                    inner.push('\'');
                    self.single(&mut inner, self.line)?;
                    inner.push('\'');
                }
                '"' => {
                    // Re-quoted for the second pass; what is inside was already unescaped.
                    let mut s = String::new();
                    self.double(&mut s, self.line)?;
                    inner.push('\'');
                    inner.push_str(&s.replace('\'', "'\\''"));
                    inner.push('\'');
                }
                '\\' => {
                    inner.push('\\');
                    if let Some(n) = self.next_char() {
                        inner.push(n);
                    }
                }
                '$' if matches!(self.chars.peek(), Some('(' | '{')) => {
                    inner.push('$');
                    self.substitution(&mut inner)?;
                }
                '(' => {
                    depth += 1;
                    inner.push(c);
                }
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                    inner.push(c);
                }
                c => inner.push(c),
            }
        }
        if self.depth >= MAX_DEPTH {
            return Err(RecipeError::Unreadable {
                line: opened,
                why: format!("arrays nested deeper than {MAX_DEPTH}"),
            });
        }
        // Lines inside the array keep their numbers.
        let words = lex_nested(&inner, opened, self.depth + 1)?;
        Ok(words
            .into_iter()
            .filter_map(|t| match t {
                Token::Word(w) if !w.text.is_empty() || w.quoted => Some(w),
                _ => None,
            })
            .collect())
    }
}

fn lex(text: &str, first_line: usize) -> Result<Vec<Token>, RecipeError> {
    lex_nested(text, first_line, 0)
}

fn lex_nested(text: &str, first_line: usize, depth: usize) -> Result<Vec<Token>, RecipeError> {
    Lexer {
        chars: text.chars().peekable(),
        line: first_line,
        heredocs: Vec::new(),
        depth,
    }
    .tokens()
}

fn is_assignment(w: &str) -> Option<(String, String)> {
    assignment(w).map(|(k, v, _)| (k, v))
}

/// `NAME=value` or `NAME+=value` (the flag: an append).
fn assignment(w: &str) -> Option<(String, String, bool)> {
    let (k, v) = w.split_once('=')?;
    let (k, append) = match k.strip_suffix('+') {
        Some(k) => (k, true),
        None => (k, false),
    };
    (!k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !k.starts_with(|c: char| c.is_ascii_digit()))
    .then(|| (k.to_string(), v.to_string(), append))
}

/// Shell keywords and builtins that may stand before a command or an assignment.
const LEADING: [&str; 12] = [
    "then", "do", "else", "{", "!", "export", "declare", "local", "readonly", "typeset", "time",
    "elif",
];

/// Commands that only print their words: a launch written there does not run.
fn prints_only(words: &[String]) -> bool {
    let first = words
        .iter()
        .find(|w| !LEADING.contains(&w.as_str()) && is_assignment(w).is_none());
    first.is_some_and(|w| {
        matches!(
            w.as_str(),
            "echo" | "printf" | "logger" | ":" | "log" | "info"
        )
    })
}

/// The variable a whole word expands: `$X`, `${X}`, `${X[@]}`, `${X[*]}`.
fn variable_of(w: &str) -> Option<&str> {
    let name = if let Some(b) = w.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        b.strip_suffix("[@]")
            .or_else(|| b.strip_suffix("[*]"))
            .unwrap_or(b)
    } else {
        w.strip_prefix('$')?
    };
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(name)
}

/// Where `PY -m sglang.launch_server` / `sglang serve` starts in `words`: (program index, first
/// argument index).
fn launch_at(words: &[String]) -> Option<(usize, usize)> {
    for (k, w) in words.iter().enumerate() {
        if w == "-m" && words.get(k + 1).map(String::as_str) == Some("sglang.launch_server") {
            // The interpreter: the nearest word before that is not one of its options (`-u`).
            let p = words[..k].iter().rposition(|x| !x.starts_with('-'))?;
            return Some((p, k + 2));
        }
        if w.rsplit('/').next() == Some("sglang")
            && words.get(k + 1).map(String::as_str) == Some("serve")
        {
            return Some((k, k + 2));
        }
    }
    None
}

/// A variable's definitions, in the order of the script: each plain assignment starts another
/// possible value (if/else branches), each append (`+=`, `X="$X ..."`) extends them all.
#[derive(Debug, Clone, Default)]
struct Var {
    /// (line, words as assigned, append?, array?)
    defs: Vec<(usize, Vec<String>, bool, bool)>,
    /// Whether any definition mentions sglang (else it cannot hold a launch).
    mentions_sglang: bool,
}

impl Var {
    /// Its possible values at `line`: each a list of words (a string: one word).
    fn values(&self, line: usize) -> Vec<(Vec<String>, bool)> {
        // The definitions are in script order. Only those before `line` count, and of those only
        // from the MAX_ALTERNATIVES-th last plain one on: every value begun earlier is pushed out
        // by the later ones. So a use costs its own values, not the whole history of the variable.
        let before = self.defs.partition_point(|(l, ..)| *l < line);
        let mut from = 0;
        let mut plain = 0;
        for (k, (_, _, append, _)) in self.defs[..before].iter().enumerate().rev() {
            if !*append {
                plain += 1;
                if plain == MAX_ALTERNATIVES {
                    from = k;
                    break;
                }
            }
        }
        let mut alts: Vec<(Vec<String>, bool)> = Vec::new();
        for (_, words, append, array) in &self.defs[from..before] {
            if *append && !alts.is_empty() {
                for (a, _) in &mut alts {
                    if *array {
                        a.extend(words.iter().cloned());
                    } else if let Some(last) = a.last_mut() {
                        last.push_str(&words.concat());
                    }
                }
            } else {
                if alts.len() == MAX_ALTERNATIVES {
                    alts.remove(0);
                }
                alts.push((words.clone(), *array));
            }
        }
        alts
    }
}

/// The script's commands: words between operators (assignments and arrays included).
fn commands(tokens: Vec<Token>) -> Vec<Vec<Token>> {
    let mut out = vec![Vec::new()];
    for t in tokens {
        match t {
            Token::Op(_) => out.push(Vec::new()),
            t => {
                if let Some(last) = out.last_mut() {
                    last.push(t);
                }
            }
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// Every launch in `text`, in the order of the script.
pub fn launches(text: &str) -> Result<Vec<Launch>, RecipeError> {
    let tokens = lex(text, 1)?;
    let cmds = commands(tokens);
    // Pass 1: the variables (plain, exported, declared, arrays), with their lines.
    let mut vars: BTreeMap<String, Var> = BTreeMap::new();
    let mut exported: Vec<(usize, String, String)> = Vec::new();
    for cmd in &cmds {
        let mut words = cmd.iter().peekable();
        let mut is_export = false;
        let mut declaring = false;
        let mut leading = true;
        while let Some(t) = words.next() {
            match t {
                Token::Array {
                    name,
                    append,
                    items,
                    line,
                } => {
                    let items = items.iter().map(|w| w.text.clone()).collect();
                    vars.entry(name.clone())
                        .or_default()
                        .defs
                        .push((*line, items, *append, true));
                }
                Token::Word(w) if leading => {
                    if LEADING.contains(&w.text.as_str()) {
                        is_export |= w.text == "export";
                        declaring |= w.text != "export" && w.text.len() > 4;
                        continue;
                    }
                    if w.text.starts_with('-') && (is_export || declaring) {
                        continue;
                    }
                    let Some((k, v, plus)) = assignment(&w.text) else {
                        leading = false;
                        continue;
                    };
                    // Assignments only stick when nothing runs after them (`A=B cmd`: cmd's env).
                    let standalone = words.peek().is_none_or(|n| {
                        matches!(n, Token::Word(x) if is_assignment(&x.text).is_some())
                            || matches!(n, Token::Array { .. })
                    });
                    if !standalone && !is_export {
                        continue;
                    }
                    let self_ref = [format!("${k}"), format!("${{{k}}}")];
                    let (append, v) = match self_ref.iter().find_map(|r| v.strip_prefix(r)) {
                        Some(rest) => (true, rest.to_string()),
                        None => (plus, v),
                    };
                    if is_export {
                        exported.push((w.line, k.clone(), v.clone()));
                    }
                    vars.entry(k)
                        .or_default()
                        .defs
                        .push((w.line, vec![v], append, false));
                }
                _ => leading = false,
            }
        }
    }
    for v in vars.values_mut() {
        v.mentions_sglang = v
            .defs
            .iter()
            .any(|(_, words, ..)| words.iter().any(|s| s.contains("sglang")));
    }
    // Pass 2: the commands that run a launch, directly or through a variable.
    let mut found = Vec::new();
    let mut ran: std::collections::BTreeSet<String> = Default::default();
    for cmd in &cmds {
        let words: Vec<&Word> = cmd
            .iter()
            .filter_map(|t| match t {
                Token::Word(w) => Some(w),
                _ => None,
            })
            .collect();
        let Some(first) = words.first() else { continue };
        let line = first.line;
        for alt in expansions(&words, &vars, line, &mut ran) {
            let Some((p, a)) = launch_at(&alt) else {
                continue;
            };
            if prints_only(&alt) {
                continue;
            }
            let env = exported
                .iter()
                .filter(|(l, _, _)| *l < line)
                .map(|(_, k, v)| (k.clone(), v.clone()))
                .chain(alt[..p].iter().filter_map(|w| is_assignment(w)))
                .collect();
            found.push(Launch {
                program: alt[p].clone(),
                args: alt[a..].to_vec(),
                env,
                line,
            });
        }
    }
    // A launch kept in a variable that never runs where this reader sees it: not read.
    for (name, var) in &vars {
        if ran.contains(name) {
            continue;
        }
        for (line, words, _, array) in &var.defs {
            let words = if *array {
                words.clone()
            } else {
                words.iter().flat_map(|w| split_string(w)).collect()
            };
            if launch_at(&words).is_some() {
                return Err(RecipeError::Unreadable {
                    line: *line,
                    why: format!("`{name}` holds an SGLang launch that is never run where this reader can follow it (run it as `\"${{{name}[@]}}\"`, `${name}`, `eval \"${name}\"` or `bash -c \"${name}\"`)"),
                });
            }
        }
    }
    if found.is_empty() {
        return Err(RecipeError::NotFound);
    }
    Ok(found)
}

/// A string variable's value as the words a shell command would see.
fn split_string(v: &str) -> Vec<String> {
    match lex(v, 1) {
        Ok(t) => commands(t)
            .into_iter()
            .next()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| match t {
                Token::Word(w) => Some(w.text),
                _ => None,
            })
            .collect(),
        // Not valid shell on its own (a stray quote): its words, up to an operator.
        Err(_) => v
            .split_whitespace()
            .take_while(|w| !w.starts_with(['|', '&', ';', '<', '>']))
            .map(String::from)
            .collect(),
    }
}

/// The command's words with the variables that hold commands expanded: `"${cmd[@]}"` (an
/// array), `$CMD` unquoted (a string, split), `eval "$CMD"` / `bash -c "..."` (read again as
/// shell). One list per possible value (a variable set in both branches of an if: both).
fn expansions(
    words: &[&Word],
    vars: &BTreeMap<String, Var>,
    line: usize,
    ran: &mut std::collections::BTreeSet<String>,
) -> Vec<Vec<String>> {
    let mut alts: Vec<Vec<String>> = vec![Vec::new()];
    let mut reparse_next = false;
    for w in words {
        let prev_reparse = std::mem::take(&mut reparse_next);
        let mut pieces: Vec<Vec<String>> = vec![vec![w.text.clone()]];
        let var = variable_of(&w.text).and_then(|n| vars.get(n).map(|v| (n, v)));
        // Only a variable that mentions sglang somewhere can hold a launch: the others (most
        // of them) are not expanded.
        let var = var.filter(|(_, v)| v.mentions_sglang);
        if let Some((name, v)) = var {
            let values = v.values(line);
            // `"${cmd[*]}"` is one word (for printing); `"${cmd[@]}"` runs it.
            let array_use = w.text.ends_with("[@]}") || (w.text.ends_with("[*]}") && !w.quoted);
            let usable: Vec<Vec<String>> = values
                .iter()
                .filter_map(|(val, is_array)| {
                    if *is_array && (array_use || !w.quoted) {
                        Some(val.clone())
                    } else if !*is_array && (!w.quoted || prev_reparse) {
                        Some(val.iter().flat_map(|s| split_string(s)).collect())
                    } else {
                        None
                    }
                })
                .collect();
            if !usable.is_empty() && usable.iter().any(|u| launch_at(u).is_some()) {
                ran.insert(name.to_string());
                pieces = usable;
            }
        } else if prev_reparse {
            let inner = split_string(&w.text);
            if launch_at(&inner).is_some() {
                pieces = vec![inner];
            }
        }
        if w.text == "eval" || (w.text == "-c" && alts[0].last().is_some_and(|l| l.ends_with("sh")))
        {
            reparse_next = true;
        }
        // One value (nearly every word): appended in place, so a long command costs its length,
        // not a copy of all its words so far per word. Several: one list per combination.
        if let [only] = pieces.as_slice() {
            for a in &mut alts {
                a.extend(only.iter().cloned());
            }
        } else {
            alts = alts
                .iter()
                .flat_map(|a| {
                    pieces.iter().map(move |p| {
                        let mut n = a.clone();
                        n.extend(p.iter().cloned());
                        n
                    })
                })
                .take(MAX_ALTERNATIVES)
                .collect();
        }
    }
    // A launch's arguments end at the command's end; `eval`/`bash -c` pieces end there too.
    alts
}

/// The launch in an argv (`run`'s COMMAND), behind whatever runs it: the shell already expanded
/// its variables, so its words are the launch's own.
pub fn launch_in_argv(argv: &[String]) -> Option<Launch> {
    let (p, a) = launch_at(argv)?;
    Some(Launch {
        program: argv[p].clone(),
        args: argv[a..].to_vec(),
        env: argv[..p].iter().filter_map(|w| is_assignment(w)).collect(),
        line: 0,
    })
}

/// The first launch in `text` (`flags audit` reads them all: [`launches`]).
pub fn extract(text: &str) -> Result<Launch, RecipeError> {
    launches(text).map(|mut l| l.remove(0))
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
        assert_eq!(l.program, "python3");
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
        assert_eq!(
            extract("python3 -m sglang.launch_server --model-path 'x\n"),
            Err(RecipeError::Unterminated {
                line: 1,
                quote: '\''
            })
        );
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

    fn args_of(l: &Launch) -> Vec<&str> {
        l.args.iter().map(String::as_str).collect()
    }

    #[test]
    fn launches_behind_any_prefix_and_any_interpreter() {
        for (script, program) in [
            (
                "\"$SGLANG_PYTHON\" -m sglang.launch_server --tp 8\n",
                "$SGLANG_PYTHON",
            ),
            ("$PY -u -m sglang.launch_server --tp 8\n", "$PY"),
            (
                "/opt/venv/bin/python3 -m sglang.launch_server --tp 8\n",
                "/opt/venv/bin/python3",
            ),
            (
                "numactl --cpunodebind=0 --membind=0 python3 -m sglang.launch_server --tp 8 &\n",
                "python3",
            ),
            (
                "srun --nodes=1 --ntasks=1 python3 -m sglang.launch_server --tp 8\n",
                "python3",
            ),
            (
                "timeout 3600 python3 -m sglang.launch_server --tp 8\n",
                "python3",
            ),
            (
                "env A=B CUDA_VISIBLE_DEVICES=0 python3 -m sglang.launch_server --tp 8\n",
                "python3",
            ),
            (
                "exec nohup python -m sglang.launch_server --tp 8\n",
                "python",
            ),
        ] {
            let l = launches(script).unwrap();
            assert_eq!(l.len(), 1, "{script}");
            assert_eq!(
                (l[0].program.as_str(), args_of(&l[0])),
                (program, vec!["--tp", "8"]),
                "{script}"
            );
        }
        let l = extract("env A=B python3 -m sglang.launch_server --tp 8\n").unwrap();
        assert_eq!(l.env, [("A".to_string(), "B".to_string())]);
    }

    #[test]
    fn a_launch_built_in_an_array_is_read_where_it_runs() {
        let script = r#"M=/models/x
cmd=(python3 -m sglang.launch_server
     --model-path "$M"   # the weights
     --tp 8)
if [ -n "$EP" ]; then
  cmd+=(--ep-size "$EP")
fi
echo "${cmd[*]}"
"${cmd[@]}" > log 2>&1 &
"#;
        let l = launches(script).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].line, 9);
        assert_eq!(
            args_of(&l[0]),
            ["--model-path", "$M", "--tp", "8", "--ep-size", "$EP"]
        );
    }

    #[test]
    fn a_launch_kept_in_a_string_is_read_where_it_runs() {
        for run in ["$CMD &", "eval \"$CMD\"", "bash -c \"$CMD\"", "eval $CMD"] {
            let script = format!(
                "CMD=\"python3 -m sglang.launch_server --tp 8\"\nCMD=\"$CMD --port 30000\"\nCMD+=\" --host 0.0.0.0\"\n{run}\n"
            );
            let l = launches(&script).unwrap();
            assert_eq!(l.len(), 1, "{run}");
            assert_eq!(l[0].line, 4, "{run}");
            assert_eq!(
                args_of(&l[0]),
                ["--tp", "8", "--port", "30000", "--host", "0.0.0.0"],
                "{run}"
            );
        }
        // Kept but never run where the reader can see it: an error naming where it was built.
        let err =
            launches("CMD=\"python3 -m sglang.launch_server --tp 8\"\nrun_it CMD\n").unwrap_err();
        assert!(
            matches!(err, RecipeError::Unreadable { line: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn every_launch_of_an_if_else_is_found() {
        let script = "if [ \"$MODE\" = pd ]; then\n  python3 -m sglang.launch_server --tp 4 &\nelse\n  python3 -m sglang.launch_server --tp 8 &\nfi\n";
        let l = launches(script).unwrap();
        assert_eq!(l.iter().map(|l| l.line).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(args_of(&l[1]), ["--tp", "8"]);
    }

    #[test]
    fn multi_line_strings_and_heredocs_before_the_launch_are_read_through() {
        let script = r#"NOTE='first line
it'"'"'s the second'
GPU=$(python3 -c '
import torch
print(torch.cuda.device_count())
')
cat > cfg.yaml <<EOF
don't: "stop here
EOF
python3 -m sglang.launch_server --tp "$GPU" --api-key 'k'
"#;
        let l = launches(script).unwrap();
        assert_eq!(l[0].line, 10);
        assert_eq!(args_of(&l[0]), ["--tp", "$GPU", "--api-key", "k"]);
        // An unterminated quote is reported where it opened, not at the end of the file.
        let err =
            launches("echo ok\nX='never closed\npython3 -m sglang.launch_server\n").unwrap_err();
        assert_eq!(
            err,
            RecipeError::Unterminated {
                line: 2,
                quote: '\''
            }
        );
    }

    #[test]
    fn mentions_that_are_not_launches_are_not_launches() {
        let script = "pkill -f sglang.launch_server\necho \"python3 -m sglang.launch_server\"\n# python3 -m sglang.launch_server --tp 1\npython3 -m sglang.launch_server --tp 2\n";
        let l = launches(script).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(args_of(&l[0]), ["--tp", "2"]);
    }

    #[test]
    fn a_recipe_of_100k_words_parses_in_well_under_a_second() {
        // One launch with 100k words after it (continued lines, quoted values, a `$VAR` or two),
        // then a launch kept in a variable and run: every word is read once.
        let mut recipe =
            String::from("export HF_HOME=/cache\nMODEL=/m\npython3 -m sglang.launch_server");
        for i in 0..50_000 {
            recipe.push_str(&format!(" --opt-{i} \"v {i}\""));
            if i % 8 == 0 {
                recipe.push_str(" \\\n   ");
            }
        }
        recipe.push_str(" --model-path $MODEL > log 2>&1 &\n");
        recipe.push_str("CMD=(python3 -m sglang.launch_server --tp 8)\n\"${CMD[@]}\"\n");
        let t = std::time::Instant::now();
        let l = launches(&recipe).unwrap();
        let took = t.elapsed();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].args.len(), 100_002);
        assert_eq!(l[0].args[..2], ["--opt-0", "v 0"]);
        assert_eq!(
            l[0].args[99_998..],
            ["--opt-49999", "v 49999", "--model-path", "$MODEL"]
        );
        assert_eq!(l[0].env, [("HF_HOME".to_string(), "/cache".to_string())]);
        assert_eq!(args_of(&l[1]), ["--tp", "8"]);
        assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
    }

    #[test]
    fn a_recipe_of_100k_words_of_assignments_and_uses_parses_in_well_under_a_second() {
        // Many definitions of one variable and many uses: a use reads the definitions that can
        // still count (the last 64 alternatives), not the variable's whole history.
        let mut recipe = String::new();
        for i in 0..25_000 {
            recipe.push_str(&format!("A=v{i}\necho $A\n"));
        }
        for i in 0..25_000 {
            recipe.push_str(&format!(
                "CMD=\"python3 -m sglang.launch_server --port {i}\"\n"
            ));
        }
        recipe.push_str("$CMD\npython3 -m sglang.launch_server --tp $A\n");
        let t = std::time::Instant::now();
        let l = launches(&recipe).unwrap();
        let took = t.elapsed();
        assert_eq!(
            l.len(),
            65,
            "the last 64 values of CMD, then the direct launch"
        );
        assert_eq!(args_of(&l[0]), ["--port", "24936"]);
        assert_eq!(args_of(&l[63]), ["--port", "24999"]);
        assert_eq!(args_of(&l[64]), ["--tp", "$A"]);
        assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
    }
}
