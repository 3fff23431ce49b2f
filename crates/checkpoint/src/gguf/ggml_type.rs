//! ggml tensor type ids, their names and block layouts (src: ggml `ggml.h`, `ggml.c` type traits).

use std::fmt;

use crate::quant::QType;

/// A ggml type id as stored in a GGUF tensor info. Kept open (not an enum) so that a file with a
/// type we cannot dequantize still parses, and the error can name the tensor that uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);
    pub const MXFP4: GgmlType = GgmlType(39);

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => "unknown",
        }
    }

    /// (elements per block, bytes per block), for the types whose size we know.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        Some(match self.0 {
            0 => (1, 4),
            1 | 30 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            9 => (32, 36),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            24 => (1, 1),
            25 => (1, 2),
            26 => (1, 4),
            27 | 28 => (1, 8),
            39 => (32, 17),
            _ => return None,
        })
    }

    /// Whether [`crate::gguf::dequant::dequantize`] handles this type.
    pub fn can_dequantize(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q4_K
                | GgmlType::Q6_K
                | GgmlType::MXFP4
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (ggml type {})", self.name(), self.0)
    }
}

/// The block formats a GGUF stores that the engine keeps as they are ([`QType`]).
impl QType {
    pub fn from_ggml(t: GgmlType) -> Option<QType> {
        Some(match t {
            GgmlType::Q8_0 => QType::Q8_0,
            GgmlType::Q4_0 => QType::Q4_0,
            GgmlType::Q4_1 => QType::Q4_1,
            GgmlType::Q4_K => QType::Q4_K,
            GgmlType::Q6_K => QType::Q6_K,
            GgmlType::MXFP4 => QType::MXFP4,
            _ => return None,
        })
    }

    /// The GGUF type with this layout (none for `I8`, which has a per-row scale).
    pub fn ggml(self) -> Option<GgmlType> {
        Some(match self {
            QType::Q8_0 => GgmlType::Q8_0,
            QType::Q4_0 => GgmlType::Q4_0,
            QType::Q4_1 => GgmlType::Q4_1,
            QType::Q4_K => GgmlType::Q4_K,
            QType::Q6_K => GgmlType::Q6_K,
            QType::MXFP4 => GgmlType::MXFP4,
            QType::I8 => return None,
        })
    }
}
