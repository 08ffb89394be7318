//! Every exit status the supervisor's commands use, in one place (README "Exit statuses").
//! `run` otherwise passes the server's own status through (`child::ExitStatus::shell_code`);
//! `wait --events` returns the status of the run's `exited` event; `flags audit` has its own
//! ladder (`sglang_python::audit::exit_status`).

/// `run`: we stopped a live server because of a fatal line (it had not ended itself).
pub const STOPPED_ON_FATAL: i32 = 1;
/// `report`: its input is unusable; `compare`: an input is not a run (a log, an empty file, JSON
/// of another shape), or the two runs are not comparable (without --force).
pub const BAD_INPUT: i32 = 2;
/// `run`: not ready within `--ready-timeout`; `wait`: not ready within `--timeout`.
pub const TIMEOUT: i32 = 124;
/// The supervisor's own failure (bad options, a port in use, a file it cannot write, a spawn
/// that failed): never a status the server itself would give.
pub const SUPERVISOR_FAILED: i32 = 125;
/// `run`: the pre-flight audit refused the server's flags; nothing was launched.
pub const PREFLIGHT_REJECTED: i32 = 126;

/// `run` stopped on a signal it was sent: 128 + its number, as a shell reports it.
pub fn signalled(sig: i32) -> i32 {
    128 + sig
}
