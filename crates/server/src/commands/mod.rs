pub mod convert;
pub mod generate;
pub mod infer;
pub mod quantize;
pub mod serve;
