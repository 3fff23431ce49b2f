//! AWS LMI (DJL Serving) schema.

pub mod format;
pub mod params;
pub mod request;

pub use params::{KNOWN_PARAMETERS, ParamReport, parse_parameters};
pub use request::{LmiConfig, LmiInputs, LmiRequest, parse_lmi_request};
