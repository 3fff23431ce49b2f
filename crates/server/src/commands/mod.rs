pub mod convert;
pub mod fetch;
pub mod generate;
pub mod infer;
pub mod quantize;
pub mod serve;
