//! The one constructor every command uses: an engine for a device and a model.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use lmi_engine_core::DType;
#[cfg(not(feature = "cuda"))]
use lmi_engine_core::EngineError;
use lmi_engine_core::Result;
use lmi_engine_core::encoder::EncoderEngine;
use lmi_engine_core::engine::{Engine, EngineOptions, StepEngine};
use lmi_engine_cpu::CpuBackend;

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

impl Device {
    /// The weight dtype `auto` means on this device for the model in `dir` (a GGUF's when
    /// `gguf`): on the CPU a GGUF's blocks as stored, and an encoder's (BERT, XLM-R)
    /// checkpoint dtype, None (its f32 panel kernels are as fast as bf16's there, and exact);
    /// bf16 otherwise (the CUDA engine keeps every matrix in bf16).
    pub fn auto_dtype(self, dir: &std::path::Path, gguf: bool) -> Option<DType> {
        let encoder = || {
            lmi_checkpoint::ModelConfig::from_file(&dir.join("config.json"))
                .is_ok_and(|c| c.architecture.is_encoder())
        };
        match self {
            Device::Cpu if gguf || encoder() => None,
            _ => Some(DType::BF16),
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
    lmi_engine_cuda::check(ordinal)
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

/// Loads the HF model directory `dir` on `device`: an encoder (BERT, XLM-RoBERTa) on the
/// encoder engine, any other model on the decoder engine.
pub fn open(device: Device, dir: &Path, opts: &EngineOptions) -> Result<Box<dyn StepEngine>> {
    let encoder = is_encoder(dir)?;
    match device {
        Device::Cpu if encoder => Ok(Box::new(load_cpu_encoder(dir, opts)?)),
        Device::Cpu => Ok(Box::new(load_cpu(dir, opts)?)),
        Device::Cuda(ordinal) => open_cuda(ordinal, dir, opts, encoder),
    }
}

/// Whether `dir/config.json` names an encoder architecture (a config that does not parse is
/// left to the loader, whose error names the fault).
fn is_encoder(dir: &Path) -> Result<bool> {
    let path = dir.join("config.json");
    Ok(match path.exists() {
        true => lmi_checkpoint::ModelConfig::from_file(&path)
            .map(|c| c.architecture.is_encoder())
            .unwrap_or(false),
        false => false,
    })
}

/// Loads the HF model directory `dir` on the CPU backend, as the engine itself (tests and
/// diagnostics that read logits: [`Engine::forward_logits`]).
pub fn load_cpu(dir: &Path, opts: &EngineOptions) -> Result<Engine<CpuBackend>> {
    Engine::load(CpuBackend::new(), dir, opts)
}

/// Loads the encoder in `dir` (BERT, XLM-RoBERTa) on the CPU backend, as the engine itself.
pub fn load_cpu_encoder(dir: &Path, opts: &EngineOptions) -> Result<EncoderEngine<CpuBackend>> {
    EncoderEngine::load(CpuBackend::new(), dir, opts)
}

#[cfg(feature = "cuda")]
fn open_cuda(
    ordinal: usize,
    dir: &Path,
    opts: &EngineOptions,
    encoder: bool,
) -> Result<Box<dyn StepEngine>> {
    if !encoder {
        return lmi_engine_cuda::open(ordinal, dir, opts);
    }
    let dev = lmi_cuda::CudaDevice::open(ordinal).map_err(|e| {
        lmi_engine_core::EngineError::Backend(format!("CUDA device {ordinal}: {e}"))
    })?;
    let backend = lmi_engine_cuda::CudaBackend::new(std::sync::Arc::new(dev))?;
    Ok(Box::new(EncoderEngine::load(backend, dir, opts)?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    _ordinal: usize,
    _dir: &Path,
    _opts: &EngineOptions,
    _encoder: bool,
) -> Result<Box<dyn StepEngine>> {
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

    #[test]
    fn auto_dtype_keeps_gguf_blocks_and_encoders_only_on_the_cpu() {
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let (decoder, encoder) = (
            fixtures.join("hybrid/qwen3_5"),
            fixtures.join("embed/bert_mean"),
        );
        assert_eq!(Device::Cpu.auto_dtype(&decoder, true), None);
        assert_eq!(Device::Cpu.auto_dtype(&decoder, false), Some(DType::BF16));
        assert_eq!(Device::Cpu.auto_dtype(&encoder, false), None);
        assert_eq!(
            Device::Cuda(0).auto_dtype(&decoder, true),
            Some(DType::BF16)
        );
        assert_eq!(
            Device::Cuda(0).auto_dtype(&encoder, false),
            Some(DType::BF16)
        );
    }
}
