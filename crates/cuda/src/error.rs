/// Every failure of the device layer. Messages say what to install or change.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library is not installed or not found.
    #[error("{0}")]
    Unavailable(String),
    #[error("NVRTC could not compile {file} for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("no kernel named {0:?} in kernels/")]
    UnknownKernel(String),
    #[error("{0}")]
    Invalid(String),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;
