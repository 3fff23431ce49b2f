//! Captured work: what [`lmi_cuda::Device::begin_capture`] records instead of running, with
//! every argument by value, replayed in order by [`lmi_cuda::Device::replay`]. Buffers are
//! referenced by address, so a replay reads whatever they hold then (as a CUDA graph does).

use lmi_cuda::{Arg, DevPtr, Function, Gemm, LaunchConfig};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    Launch {
        f: Function,
        cfg: LaunchConfig,
        args: Vec<Arg>,
    },
    Gemm(Gemm),
    MemsetZero {
        dst: DevPtr,
        bytes: usize,
    },
    Dtod {
        src: DevPtr,
        dst: DevPtr,
        bytes: usize,
    },
}

/// A captured sequence of work for [`crate::EmuDevice`].
#[derive(Debug, Clone)]
pub struct EmuGraph {
    pub(crate) device: u64,
    pub(crate) ops: Vec<Op>,
}

impl EmuGraph {
    /// Recorded operations (launches, products, memsets, device copies).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Recorded kernel launches.
    pub fn launches(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op, Op::Launch { .. }))
            .count()
    }
}

/// An open capture. `invalid` is set by work that is illegal while capturing (CUDA invalidates
/// the capture too), so `end_capture` fails even if the caller ignored the first error.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    pub(crate) ops: Vec<Op>,
    pub(crate) invalid: Option<String>,
}
