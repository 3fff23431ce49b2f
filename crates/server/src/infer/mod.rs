//! The pieces of `lmi infer` (see `commands/infer.rs`): the seed-000 input file, prompt
//! rendering with the model's chat template, and the responses file.

pub mod input;
pub mod output;
pub mod prompt;
