//! The child's output: framing and tee (`tee`), SGLang line parsing (`parse`), and the reader of
//! the Python literals in the `server_args=` line (`pyliteral`).
pub mod parse;
pub mod pyliteral;
pub mod tee;
