pub mod bench;
pub mod convert;
pub mod generate;
pub mod infer;
pub mod serve;
