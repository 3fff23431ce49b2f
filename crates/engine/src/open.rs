//! The one constructor every command uses: an engine for a device and a model.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::engine::{Engine, EngineOptions, StepEngine};
#[cfg(not(feature = "cuda"))]
use crate::error::EngineError;
use crate::error::Result;

/// Where an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    /// An NVIDIA GPU, by ordinal.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!(
                    "unknown device {s:?}: expected cpu, cuda or cuda:<ordinal>"
                )),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Checks, within a second or so, that `device` can be used (for a GPU: the driver and the
/// CUDA libraries load and the device exists), so a command can refuse before it binds a
/// port or reads weights. The error is one sentence saying what is missing.
pub fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(ordinal) => check_cuda(ordinal),
    }
}

#[cfg(feature = "cuda")]
fn check_cuda(ordinal: usize) -> Result<()> {
    crate::cuda::check(ordinal)
}

#[cfg(not(feature = "cuda"))]
fn check_cuda(_ordinal: usize) -> Result<()> {
    Err(no_cuda_build())
}

#[cfg(not(feature = "cuda"))]
fn no_cuda_build() -> EngineError {
    EngineError::Backend(
        "this build has no CUDA engine: rebuild with the `cuda` feature (on by default)".into(),
    )
}

/// Loads the HF model directory `dir` on `device`.
pub fn open(device: Device, dir: &Path, opts: &EngineOptions) -> Result<Box<dyn StepEngine>> {
    match device {
        Device::Cpu => Ok(Box::new(Engine::load_cpu(dir, opts)?)),
        Device::Cuda(ordinal) => open_cuda(ordinal, dir, opts),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize, dir: &Path, opts: &EngineOptions) -> Result<Box<dyn StepEngine>> {
    crate::cuda::open(ordinal, dir, opts)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize, _dir: &Path, _opts: &EngineOptions) -> Result<Box<dyn StepEngine>> {
    Err(no_cuda_build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("CUDA".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert!("tpu".parse::<Device>().unwrap_err().contains("cpu, cuda"));
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    }
}
