//! Device memory the backend owns: RAII allocations, and the step arena every activation
//! buffer of a forward pass comes from.

use std::sync::Arc;

use lmi_cuda::{DevPtr, Device};

use lmi_engine_core::error::{EngineError, Result};

pub(crate) fn cuda_err(e: lmi_cuda::CudaError) -> EngineError {
    EngineError::Backend(e.to_string())
}

/// One device allocation, freed on drop.
pub struct DeviceBox<D: Device> {
    dev: Arc<D>,
    ptr: DevPtr,
    bytes: usize,
}

impl<D: Device> DeviceBox<D> {
    pub fn new(dev: &Arc<D>, bytes: usize) -> Result<Self> {
        let ptr = dev.alloc(bytes.max(1)).map_err(|e| {
            EngineError::Backend(format!(
                "cannot allocate {} MiB on the device: {e}",
                bytes >> 20
            ))
        })?;
        Ok(DeviceBox {
            dev: dev.clone(),
            ptr,
            bytes,
        })
    }

    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<D: Device> Drop for DeviceBox<D> {
    fn drop(&mut self) {
        self.dev.free(self.ptr);
    }
}

/// Alignment of arena buffers (what cudaMalloc guarantees; vector loads need 16).
const ALIGN: usize = 256;

/// A bump allocator reset at the start of every forward pass. The same sequence of buffer
/// sizes gets the same addresses every step, which is what lets a captured CUDA graph replay
/// with new data. When a step needs more than the arena holds, a further chunk is added; at
/// the next reset the chunks are merged into one of their total size, and `epoch` changes
/// (graphs captured over the old addresses are then stale).
pub struct Arena<D: Device> {
    dev: Arc<D>,
    chunks: Vec<DeviceBox<D>>,
    /// Bytes used in the last chunk.
    offset: usize,
    epoch: u64,
    /// Set after the load-time warm-up sized the arena for the largest step: growing later
    /// allocates inside a step, which the memory sizing did not count (logged).
    sized: bool,
}

impl<D: Device> Arena<D> {
    pub fn new(dev: &Arc<D>) -> Self {
        Arena {
            dev: dev.clone(),
            chunks: Vec::new(),
            offset: 0,
            epoch: 0,
            sized: false,
        }
    }

    /// The warm-up has run the largest step: merges what it grew into one chunk, and from now
    /// on growth is reported.
    pub fn seal(&mut self) -> Result<()> {
        self.reset()?;
        self.sized = true;
        Ok(())
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Starts a new step: every buffer handed out before is free again.
    pub fn reset(&mut self) -> Result<()> {
        if self.chunks.len() > 1 {
            let total: usize = self.chunks.iter().map(|c| c.bytes()).sum();
            self.chunks.clear();
            self.chunks.push(DeviceBox::new(&self.dev, total)?);
            self.epoch += 1;
        }
        self.offset = 0;
        Ok(())
    }

    /// Where the arena stands (restored after a graph replay, whose buffers the replay used
    /// without allocating them).
    pub fn mark(&self) -> (usize, usize) {
        (self.chunks.len(), self.offset)
    }

    pub fn restore(&mut self, mark: (usize, usize)) {
        if mark.0 == self.chunks.len() {
            self.offset = mark.1;
        }
    }

    pub fn alloc(&mut self, bytes: usize) -> Result<DevPtr> {
        let bytes = bytes.max(1).next_multiple_of(ALIGN);
        if let Some(last) = self.chunks.last()
            && self.offset + bytes <= last.bytes()
        {
            let p = last.ptr().offset(self.offset);
            self.offset += bytes;
            return Ok(p);
        }
        let have: usize = self.chunks.iter().map(|c| c.bytes()).sum();
        let size = (2 * have).max(bytes).max(64 << 20);
        if self.sized {
            tracing::warn!(
                "a step needs more than the {} MiB of activations the load-time warm-up \
                 measured: {} MiB more allocated now (the KV cache sizing did not count them)",
                have >> 20,
                size >> 20
            );
        }
        let chunk = DeviceBox::new(&self.dev, size)?;
        let p = chunk.ptr();
        self.chunks.push(chunk);
        self.offset = bytes;
        Ok(p)
    }
}
