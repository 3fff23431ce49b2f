//! GGUF import: a reader for the file format, dequantization of the block types small Llama
//! GGUFs use, and conversion into a plain HF checkpoint directory (weights with llama.cpp's
//! Q/K permutation undone, config.json, tokenizer.json built from the GGUF vocabulary).

pub mod convert;
pub mod dequant;
pub mod gemma4;
pub mod ggml_type;
pub mod hparams;
pub mod hybrid;
pub mod layout;
pub mod mla;
pub mod pretokenizers;
pub mod reader;
pub mod sigmoe;
pub mod tensor_names;
pub mod tokenizer;
pub mod writer;

pub use convert::convert_gguf;
pub use ggml_type::GgmlType;
pub use reader::{GgufFile, GgufValue, TensorInfo};
