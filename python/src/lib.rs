//! SGLang's launch flags as data: a flag schema (today read from a saved argparse dump; the
//! embedded-Python introspection that produces one from a real install, wheel or source tree is
//! issue #3), the audit of a launch command against it with argparse's own matching rules, the
//! diff of two versions, and the extraction of the launch command from a bash recipe.
pub mod audit;
pub mod diff;
pub mod recipe;
pub mod schema;
