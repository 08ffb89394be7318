//! The pre-flight audit: the server's flags checked against the SGLang it would import, before
//! anything starts (a refused launch exits 126). The audit itself is `flags::preflight`.
use crate::cli::RunArgs;
use anyhow::Result;
use serde_json::Value;

/// What the pre-flight found: whether to refuse the launch (exit 126), and its `preflight` event.
pub struct Preflight {
    pub reject: bool,
    pub event: Value,
}

/// Audit the flags of every launch in COMMAND before anything starts (flags.rs).
pub fn preflight(args: &RunArgs) -> Result<Option<Preflight>> {
    if args.no_preflight {
        return Ok(None);
    }
    let found = crate::flags::preflight(&args.command, args.flags_schema.as_deref())?;
    Ok(found.map(|(reject, event)| Preflight { reject, event }))
}
