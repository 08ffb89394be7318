//! SGLang's launch flags as data: a flag schema read from a real install (import mode), from a
//! wheel or source tree (static mode, Python's `ast`, nothing imported) or from a saved dump; the
//! audit of a launch command against it with argparse's own matching rules; the diff of two
//! versions; the extraction of the launch command from a bash recipe.
pub mod audit;
pub mod diff;
#[cfg(feature = "embedded-python")]
pub mod embedded;
pub mod recipe;
pub mod schema;
