//! sglang-supervisor: runs an SGLang server as a supervised child. The binary's `main` is thin;
//! everything lives here so benchmarks and tests reach the same code.
pub mod bench;
pub mod child;
pub mod cli;
pub mod compare;
pub mod events;
pub mod flags;
pub mod gpu;
pub mod html;
pub mod lifecycle;
pub mod logs;
pub mod pyjson;
pub mod redact;
pub mod report;
pub mod sentinel;
pub mod server_series;
pub mod startup;
pub mod wait;
