//! What changed between two versions' flags: option strings added and removed, newly deprecated
//! flags with their replacement, and changed defaults, choices, arity or type.
use crate::schema::{Opt, Schema};
use serde_json::{json, Value};

fn by_string(s: &Schema) -> std::collections::BTreeMap<&str, &Opt> {
    s.options
        .iter()
        .flat_map(|o| o.option_strings.iter().map(move |x| (x.as_str(), o)))
        .collect()
}

fn sorted(c: &Option<Vec<String>>) -> Option<Vec<String>> {
    c.clone().map(|mut v| {
        v.sort();
        v
    })
}

pub fn diff(from: &Schema, to: &Schema) -> Value {
    let (a, b) = (by_string(from), by_string(to));
    let added: Vec<&str> = b.keys().filter(|k| !a.contains_key(*k)).copied().collect();
    let removed: Vec<&str> = a.keys().filter(|k| !b.contains_key(*k)).copied().collect();
    let mut deprecated = Vec::new();
    let mut changed = Vec::new();
    for o in &to.options {
        let flag = o.canonical();
        let old = a.get(flag);
        if o.deprecated && !old.is_some_and(|p| p.deprecated) {
            deprecated.push(json!({"flag": flag, "replacement": o.replacement}));
        }
        let Some(p) = old else { continue };
        let fields: [(&str, Value, Value); 4] = [
            ("default", p.default.clone(), o.default.clone()),
            // Choices come from sets in some versions: their order means nothing.
            (
                "choices",
                json!(sorted(&p.choices)),
                json!(sorted(&o.choices)),
            ),
            ("nargs", p.nargs.as_argparse(), o.nargs.as_argparse()),
            ("type", json!(p.kind), json!(o.kind)),
        ];
        for (field, x, y) in fields {
            // A value a static read could not evaluate is no evidence of a change.
            let unknown = |o: &Opt| o.unresolved.iter().any(|u| u == field);
            if x != y && !unknown(p) && !unknown(o) {
                changed.push(json!({"flag": flag, "field": field, "from": x, "to": y}));
            }
        }
    }
    json!({"from": from.version, "to": to.version, "added": added, "removed": removed, "deprecated": deprecated, "changed": changed})
}
