//! SGLang's streamed answers read at the byte level, without parsing every event as JSON: the
//! proxy only needs a few facts per event (does it carry output, the server's token counts, is it
//! the usage-only event), and in server-generated JSON a key pattern such as `"text":` can only
//! be a key (a quote inside a string value is escaped, so `s":` never occurs inside one).
use memchr::memchr_iter;
use memchr::memmem::{Finder, FinderRev};
use std::sync::LazyLock;

/// The keys read, as searchers built once (building one per search cost more than the search).
struct Keys {
    text: Finder<'static>,
    content: Finder<'static>,
    reasoning: Finder<'static>,
    choices: Finder<'static>,
    completion_tokens: LastKey,
    prompt_tokens: LastKey,
    index: LastKey,
}

static KEYS: LazyLock<Keys> = LazyLock::new(|| Keys {
    text: Finder::new(b"\"text\":"),
    content: Finder::new(b"\"content\":"),
    reasoning: Finder::new(b"\"reasoning_content\":"),
    choices: Finder::new(b"\"choices\":"),
    completion_tokens: LastKey::new(b"\"completion_tokens\":"),
    prompt_tokens: LastKey::new(b"\"prompt_tokens\":"),
    index: LastKey::new(b"\"index\":"),
});

/// How far from an event's end its counts are looked for backwards first: SGLang's `meta_info`
/// and `usage` (and a batch's `index`) close the object, a few hundred bytes at most.
const TAIL: usize = 512;

/// Finds the last occurrence of a key. Backwards through the tail, where the counts sit; past it,
/// forwards with memchr's vector prefilter: a key that is absent (`index` outside a batch,
/// `completion_tokens` in an OpenAI chunk without usage) was a reverse Two-Way scan of the whole
/// event, and `/generate` events hold the whole text and token ids so far (18 % of a proxy
/// thread's instructions at 64 tokens, growing with the answer: BENCHMARKS.md).
struct LastKey {
    forward: Finder<'static>,
    backward: FinderRev<'static>,
}

impl LastKey {
    fn new(key: &'static [u8]) -> Self {
        LastKey {
            forward: Finder::new(key),
            backward: FinderRev::new(key),
        }
    }

    fn len(&self) -> usize {
        self.forward.needle().len()
    }

    fn rfind(&self, data: &[u8]) -> Option<usize> {
        let tail = data.len().saturating_sub(TAIL);
        if let Some(at) = self.backward.rfind(&data[tail..]) {
            return Some(tail + at);
        }
        if tail == 0 {
            return None;
        }
        // What is left may still hold one that ends inside the tail. The keys begin with a quote
        // and end with a colon, so two occurrences never overlap: the last found forwards is the
        // last there is.
        let head = (tail + self.len() - 1).min(data.len());
        self.forward.find_iter(&data[..head]).last()
    }
}

/// Which API a stream answers: they differ in where output and counts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/generate`: `text` (cumulative by default), `meta_info.completion_tokens` (cumulative).
    Generate,
    /// `/v1/completions`: `choices[].text`, `usage` when asked.
    Completions,
    /// `/v1/chat/completions`: `choices[].delta.content` or `.reasoning_content`, `usage` when asked.
    Chat,
}

/// What one SSE event says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventInfo {
    /// It carries generated output (non-empty text, content or reasoning content).
    pub output: bool,
    /// The server's completion count so far (cumulative in SGLang's streams).
    pub completion_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
    /// An OpenAI usage-only event (`"choices":[]` with `usage`).
    pub usage_only: bool,
    /// `data: [DONE]`.
    pub done: bool,
    /// The server reported an error in the stream.
    pub error: bool,
    /// Which prompt of a batch `/generate` stream the event answers (its top-level `index`).
    pub index: Option<u64>,
}

impl EventInfo {
    fn merge(&mut self, o: EventInfo) {
        self.output |= o.output;
        self.completion_tokens = o.completion_tokens.or(self.completion_tokens);
        self.prompt_tokens = o.prompt_tokens.or(self.prompt_tokens);
        self.usage_only |= o.usage_only;
        self.done |= o.done;
        self.error |= o.error;
        self.index = o.index.or(self.index);
    }
}

/// The end of the first event in `b`: (end of its content, start of what follows). Events end at
/// a blank line, `\n\n` or `\r\n\r\n`.
pub fn event_end(b: &[u8]) -> Option<(usize, usize)> {
    for i in memchr_iter(b'\n', b) {
        match b.get(i + 1) {
            Some(b'\n') => return Some((i, i + 2)),
            Some(b'\r') if b.get(i + 2) == Some(&b'\n') => return Some((i, i + 3)),
            _ => {}
        }
    }
    None
}

/// Read one event (its bytes without the blank line).
pub fn scan_event(api: Api, event: &[u8]) -> EventInfo {
    let mut info = EventInfo::default();
    let mut rest = event;
    loop {
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        if let Some(data) = line.strip_prefix(b"data:") {
            info.merge(scan_data(api, data.trim_ascii()));
        }
        match next {
            Some(n) => rest = n,
            None => return info,
        }
    }
}

fn scan_data(api: Api, data: &[u8]) -> EventInfo {
    let mut info = EventInfo::default();
    if data == b"[DONE]" {
        info.done = true;
        return info;
    }
    if data.first() != Some(&b'{') {
        return info;
    }
    let body = data[1..].trim_ascii_start();
    info.error = body.starts_with(b"\"error\"")
        || body
            .strip_prefix(b"\"object\"")
            .and_then(|r| r.trim_ascii_start().strip_prefix(b":"))
            .is_some_and(|r| r.trim_ascii_start().starts_with(b"\"error\""));
    let k = &*KEYS;
    info.output = match api {
        Api::Generate | Api::Completions => nonempty_string(data, &k.text),
        Api::Chat => nonempty_string(data, &k.content) || nonempty_string(data, &k.reasoning),
    };
    // Counts sit at the end (meta_info, usage): search backwards.
    info.completion_tokens = number_after_last(data, &k.completion_tokens);
    info.prompt_tokens = number_after_last(data, &k.prompt_tokens);
    if api == Api::Generate {
        // A batch's events say which prompt they answer: SGLang adds `index` last.
        info.index = number_after_last(data, &k.index);
    } else if info.completion_tokens.is_some() {
        info.usage_only = after(data, &k.choices).is_some_and(|v| v.starts_with(b"[]"));
    }
    info
}

/// The bytes after the first `key` and any whitespace.
fn after<'a>(data: &'a [u8], key: &Finder<'_>) -> Option<&'a [u8]> {
    let at = key.find(data)?;
    Some(data[at + key.needle().len()..].trim_ascii_start())
}

fn nonempty_string(data: &[u8], key: &Finder<'_>) -> bool {
    after(data, key).is_some_and(|v| v.len() >= 2 && v[0] == b'"' && v[1] != b'"')
}

fn number_after_last(data: &[u8], key: &LastKey) -> Option<u64> {
    let at = key.rfind(data)?;
    let v = data[at + key.len()..].trim_ascii_start();
    let digits = v.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&v[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_blank_lines_of_either_kind() {
        assert_eq!(event_end(b"data: x\n\ndata: y"), Some((7, 9)));
        assert_eq!(event_end(b"data: x\r\n\r\n"), Some((8, 11)));
        assert_eq!(event_end(b"data: x\n"), None);
    }

    #[test]
    fn generate_events_give_output_and_cumulative_counts() {
        let e = br#"data: {"text":" bof voufaiti","output_ids":[1577,4010],"meta_info":{"id":"7d","finish_reason":null,"prompt_tokens":36,"completion_tokens":2,"cached_tokens":35}}"#;
        let i = scan_event(Api::Generate, e);
        assert!(i.output && !i.usage_only && !i.done);
        assert_eq!((i.completion_tokens, i.prompt_tokens), (Some(2), Some(36)));
        let empty = br#"data: {"text":"","output_ids":[100],"meta_info":{"completion_tokens":3}}"#;
        assert!(!scan_event(Api::Generate, empty).output);
        assert!(scan_event(Api::Generate, b"data: [DONE]").done);
    }

    #[test]
    fn a_key_quoted_inside_generated_text_is_not_a_key() {
        let e = br#"data: {"text":"say \"completion_tokens\": 99","meta_info":{"completion_tokens":4}}"#;
        assert_eq!(scan_event(Api::Generate, e).completion_tokens, Some(4));
        let c = br#"data: {"choices":[{"index":0,"text":"","logprobs":{"x":"\"text\":\"a"}}],"usage":null}"#;
        assert!(!scan_event(Api::Completions, c).output);
    }

    #[test]
    fn openai_events_output_and_the_usage_only_event() {
        let text = br#"data: {"id":"fc","object":"text_completion","choices":[{"index":0,"text":" piv","logprobs":null,"finish_reason":null}],"usage":null}"#;
        let i = scan_event(Api::Completions, text);
        assert!(i.output && i.completion_tokens.is_none());
        let usage = br#"data: {"id":"89","object":"text_completion","created":1,"model":"model","choices":[],"usage":{"prompt_tokens":36,"total_tokens":100,"completion_tokens":64,"reasoning_tokens":0}}"#;
        let u = scan_event(Api::Completions, usage);
        assert!(u.usage_only && !u.output);
        assert_eq!((u.completion_tokens, u.prompt_tokens), (Some(64), Some(36)));
        let continuous = br#"data: {"choices":[{"index":0,"text":"x"}],"usage":{"prompt_tokens":36,"completion_tokens":2,"prompt_tokens_details":null}}"#;
        let c = scan_event(Api::Completions, continuous);
        assert!(c.output && !c.usage_only);
        assert_eq!(c.completion_tokens, Some(2));
    }

    #[test]
    fn chat_reasoning_deltas_are_output_and_the_role_delta_is_not() {
        let role = br#"data: {"choices":[{"index":0,"delta":{"reasoning_content":null,"role":"assistant","content":""},"finish_reason":null}]}"#;
        let reasoning = br#"data: {"choices":[{"index":0,"delta":{"reasoning_content":"Let me","content":null}}]}"#;
        let content = br#"data: {"choices":[{"index":0,"delta":{"reasoning_content":null,"content":" This"}}]}"#;
        let finish = br#"data: {"choices":[{"index":0,"delta":{"reasoning_content":null},"finish_reason":"length"}]}"#;
        let out: Vec<bool> = [&role[..], reasoning, content, finish]
            .iter()
            .map(|e| scan_event(Api::Chat, e).output)
            .collect();
        assert_eq!(out, [false, true, true, false]);
    }

    #[test]
    fn a_batch_generate_event_says_which_prompt_it_answers() {
        let e = br#"data: {"text":" a","output_ids":[5],"meta_info":{"id":"x","prompt_tokens":4,"completion_tokens":1},"index":1}"#;
        assert_eq!(scan_event(Api::Generate, e).index, Some(1));
        let single = br#"data: {"text":" a","meta_info":{"completion_tokens":1}}"#;
        assert_eq!(scan_event(Api::Generate, single).index, None);
    }

    #[test]
    fn the_last_key_is_found_wherever_it_sits_against_the_tail_window() {
        let key = br#""index":"#;
        let last = LastKey::new(key);
        let reference = FinderRev::new(key);
        for len in [0, 5, TAIL - 1, TAIL, TAIL + 1, TAIL + 7, 3 * TAIL] {
            let filler = vec![b'x'; len];
            assert_eq!(last.rfind(&filler), None, "no key in {len} bytes");
            // The key once or twice, at every place around the window's edge.
            for first in (0..len.saturating_sub(key.len())).filter(|&p| {
                p < 40 || p.abs_diff(len.saturating_sub(TAIL)) < key.len() + 2 || p + 40 > len
            }) {
                for second in [None, Some(first + key.len() + 3)] {
                    let mut d = filler.clone();
                    for at in std::iter::once(first).chain(second) {
                        if at + key.len() <= d.len() {
                            d[at..at + key.len()].copy_from_slice(key);
                        }
                    }
                    assert_eq!(
                        last.rfind(&d),
                        reference.rfind(&d),
                        "len {len}, key at {first}, {second:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn counts_far_from_the_end_of_a_long_event_are_still_read() {
        let ids = "1,".repeat(2000);
        let e = format!(
            r#"data: {{"text":"a","meta_info":{{"completion_tokens":7}},"output_ids":[{ids}1]}}"#
        );
        assert_eq!(
            scan_event(Api::Generate, e.as_bytes()).completion_tokens,
            Some(7)
        );
        let batch = format!(
            r#"data: {{"text":"a","output_ids":[{ids}1],"meta_info":{{"completion_tokens":9}},"index":3}}"#
        );
        let i = scan_event(Api::Generate, batch.as_bytes());
        assert_eq!((i.completion_tokens, i.index), (Some(9), Some(3)));
    }

    #[test]
    fn errors_in_the_stream_are_seen() {
        let e = br#"data: {"error": {"message": "aborted", "code": 503}}"#;
        assert!(scan_event(Api::Completions, e).error);
        let o = br#"data: {"object":"error","message":"x"}"#;
        assert!(scan_event(Api::Chat, o).error);
    }
}
