//! The open-file limit: ours raised to the hard limit (the proxy and the metrics listener hold a
//! descriptor per connection, and at the common soft limit of 1,024 a flood of them left none for
//! reading /proc at teardown); every process we start gets the limit it would have had.
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use std::sync::OnceLock;

/// (soft, hard) as we found them.
static ORIGINAL: OnceLock<(u64, u64)> = OnceLock::new();

/// Raise the soft NOFILE limit to the hard one; remember the original for our children.
pub fn raise_nofile() {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let _ = ORIGINAL.set((soft, hard));
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::debug!("cannot raise the open-file limit from {soft} to {hard}: {e}");
        }
    }
}

/// Put the original limit back: between fork and exec of a child (setrlimit is a plain syscall,
/// async-signal-safe).
pub fn restore_nofile_for_child() -> std::io::Result<()> {
    if let Some(&(soft, hard)) = ORIGINAL.get() {
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_and_children_get_the_original_back() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        raise_nofile();
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap().0, hard);
        restore_nofile_for_child().unwrap();
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (soft, hard));
    }
}
