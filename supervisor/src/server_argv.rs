//! A few of SGLang's flags read from the server's command line, spelled any way its argparse
//! takes them: `--port 8000`, `--port=8000`, or an unambiguous prefix (`--po 8000`:
//! `allow_abbrev` is on in every SGLang version). The command may be a wrapper's (`uv run --
//! python3 -m sglang.launch_server …`, `numactl … --`), so a `--` ends nothing: SGLang takes no
//! positional words, and where a wrapper has a flag of the same name the server's, given later,
//! is the one kept.

/// One of SGLang's flags and the shortest prefix its argparse resolves to it.
pub struct Flag {
    name: &'static str,
    shortest: usize,
}

impl Flag {
    /// `shortest` is the shortest prefix of `name` that starts no other flag of SGLang
    /// 0.5.14-0.5.23 (`../shared/fixtures/flags`); a shorter one is "ambiguous" to argparse.
    const fn new(name: &'static str, shortest: &'static str) -> Flag {
        Flag {
            name,
            shortest: shortest.len(),
        }
    }

    fn spelled(&self, word: &str) -> bool {
        word.len() >= self.shortest && self.name.starts_with(word)
    }
}

pub const HOST: Flag = Flag::new("--host", "--ho");
pub const PORT: Flag = Flag::new("--port", "--po");
pub const API_KEY: Flag = Flag::new("--api-key", "--ap");
pub const ADMIN_API_KEY: Flag = Flag::new("--admin-api-key", "--ad");
pub const NNODES: Flag = Flag::new("--nnodes", "--nn");
pub const NODE_RANK: Flag = Flag::new("--node-rank", "--nod");
pub const TOKENIZER_WORKER_NUM: Flag = Flag::new("--tokenizer-worker-num", "--tokenizer-w");
pub const CONFIG: Flag = Flag::new("--config", "--conf");

/// Every value `argv` gives `flag`, in order (argparse keeps the last). A flag with no word
/// after it gives none.
pub fn values<'a, S: AsRef<str>>(argv: &'a [S], flag: &'a Flag) -> impl Iterator<Item = &'a str> {
    let mut words = argv.iter().map(AsRef::as_ref);
    std::iter::from_fn(move || loop {
        let word = words.next()?;
        let (spelling, inline) = match word.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (word, None),
        };
        if flag.spelled(spelling) {
            return inline.or_else(|| words.next());
        }
    })
}

/// The value argparse keeps for `flag`: the last one given.
pub fn last<'a, S: AsRef<str>>(argv: &'a [S], flag: &'a Flag) -> Option<&'a str> {
    values(argv, flag).last()
}

/// [`last`] as a number, spaces around it allowed as Python's `int()` allows them.
pub fn last_number<T: std::str::FromStr, S: AsRef<str>>(argv: &[S], flag: &Flag) -> Option<T> {
    last(argv, flag)?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_read_in_every_spelling_argparse_takes_and_the_last_wins() {
        let argv = [
            "python3",
            "-m",
            "sglang.launch_server",
            "--port",
            "1",
            "--port=2",
            "--po",
            "3",
            "--po=4",
        ];
        assert_eq!(
            values(&argv, &PORT).collect::<Vec<_>>(),
            ["1", "2", "3", "4"]
        );
        assert_eq!(last(&argv, &PORT), Some("4"));
        assert_eq!(
            last(&["--tokenizer-w", "2"], &TOKENIZER_WORKER_NUM),
            Some("2")
        );
    }

    #[test]
    fn ambiguous_prefixes_and_other_flags_are_not_read_and_a_wrappers_double_dash_ends_nothing() {
        // `--p` starts --port and --page-size: argparse refuses it, so it says nothing.
        assert_eq!(last(&["--p", "1"], &PORT), None);
        assert_eq!(last(&["--ports", "1"], &PORT), None);
        assert_eq!(
            last(&["--tokenizer-path", "t"], &TOKENIZER_WORKER_NUM),
            None
        );
        assert_eq!(
            last(&["uv", "run", "--", "python3", "--port", "2"], &PORT),
            Some("2")
        );
        // a flag with nothing after it gives nothing
        assert_eq!(last(&["--port"], &PORT), None);
    }
}
