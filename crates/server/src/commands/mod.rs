pub mod bench;
pub mod bench_http;
pub mod bench_lora;
pub mod bench_structured;
pub mod convert;
pub mod generate;
pub mod infer;
pub mod serve;
