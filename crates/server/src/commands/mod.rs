pub mod bench;
pub mod convert;
pub mod generate;
