//! Test-only CUDA emulation: the `.cu` files of the top-level `kernels/` folder, unmodified,
//! compiled as host C++ (build.rs, `emu/cuda_emu.h`) and run on the CPU with one fiber per CUDA
//! thread (`emu/runtime.cpp`), behind [`lmi_cuda::Device`] as [`EmuDevice`].
//!
//! What it checks that a GPU would not report: a missing `__syncthreads` (run the kernel with
//! [`ThreadOrder::Forward`] and [`ThreadOrder::Reverse`]: the results differ), barriers or warp
//! intrinsics some threads never reach (a launch error, never a hang), reads of memory nothing
//! wrote (allocations and dynamic shared memory are filled with 0xFF: NaN), accesses past an
//! allocation's end (a guard page: the process aborts with the kernel, block, thread and
//! address), argument sizes that do not match the kernel's signature.
//!
//! `LMI_EMU_THREAD_ORDER=reverse` / `LMI_EMU_BLOCK_ORDER=reverse` set the orders of every new
//! device, so a whole test suite can be rerun in the other order.

mod device;
pub mod fake;
mod ffi;
mod gemm;
mod graph;
mod memory;

pub use device::{BlockOrder, EmuDevice, Order, ThreadOrder};
pub use ffi::{KernelInfo, Param, kernels};
pub use graph::EmuGraph;

/// Whether the kernels and the runtime were built with AddressSanitizer
/// (`LMI_EMU_SANITIZE=address` at build time; see the crate's README).
pub const SANITIZED: bool = cfg!(lmi_emu_asan);
