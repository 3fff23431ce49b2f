//! Kernel arguments laid out for `cuLaunchKernel`, which takes an array of pointers, one to
//! each parameter's value.

use std::ffi::c_void;

use crate::device::Arg;
use crate::error::{CudaError, Result};

/// More than any kernel here takes; `cuLaunchKernel` allows about 4 KiB of parameters.
pub const MAX_KERNEL_ARGS: usize = 64;

// A 4-byte parameter is read from the first 4 bytes of its 8-byte slot.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "kernel arguments assume little-endian"
);

/// Each argument's value in its own 8-byte slot (little-endian, so a 4-byte parameter is the
/// slot's first 4 bytes, as [`Arg::to_bits`] promises).
pub struct KernelParams {
    values: [u64; MAX_KERNEL_ARGS],
    len: usize,
}

impl KernelParams {
    pub fn new(args: &[Arg]) -> Result<Self> {
        if args.len() > MAX_KERNEL_ARGS {
            return Err(CudaError::Invalid(format!(
                "{} kernel arguments; at most {MAX_KERNEL_ARGS} are supported",
                args.len()
            )));
        }
        let mut values = [0u64; MAX_KERNEL_ARGS];
        for (slot, arg) in values.iter_mut().zip(args) {
            *slot = arg.to_bits();
        }
        Ok(KernelParams {
            values,
            len: args.len(),
        })
    }

    /// The pointer array `cuLaunchKernel` reads: the first [`KernelParams::len`] entries point
    /// into `self`, so they are valid while `self` is neither moved nor dropped.
    pub fn pointers(&mut self) -> [*mut c_void; MAX_KERNEL_ARGS] {
        let mut ptrs = [std::ptr::null_mut(); MAX_KERNEL_ARGS];
        for (p, v) in ptrs.iter_mut().zip(&mut self.values[..self.len]) {
            *p = (v as *mut u64).cast();
        }
        ptrs
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DevPtr;

    /// The bytes a kernel parameter of `arg`'s type holds.
    fn expected(arg: &Arg) -> Vec<u8> {
        match *arg {
            Arg::Ptr(p) => p.0.to_le_bytes().to_vec(),
            Arg::U32(v) => v.to_le_bytes().to_vec(),
            Arg::I32(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
            Arg::U64(v) => v.to_le_bytes().to_vec(),
            Arg::F64(v) => v.to_le_bytes().to_vec(),
        }
    }

    #[test]
    fn each_pointer_reads_its_argument_bytes() {
        let args = [
            Arg::Ptr(DevPtr(0x7f00_1234_5678)),
            Arg::U32(0xdead_beef),
            Arg::I32(-3),
            Arg::F32(-1.5),
            Arg::U64(u64::MAX - 1),
            Arg::F64(std::f64::consts::PI),
        ];
        let mut params = KernelParams::new(&args).expect("params");
        assert_eq!(params.len(), args.len());
        let ptrs = params.pointers();
        for (arg, p) in args.iter().zip(ptrs) {
            // SAFETY: `p` points to an 8-byte slot of `params`, alive and unmoved here.
            let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), arg.size()) };
            assert_eq!(bytes, expected(arg), "{arg:?}");
        }
        assert!(ptrs[args.len()..].iter().all(|p| p.is_null()));
        // Distinct slots: no two parameters alias.
        assert_ne!(ptrs[0], ptrs[1]);
    }

    #[test]
    fn no_arguments_and_too_many() {
        assert_eq!(KernelParams::new(&[]).expect("empty").len(), 0);
        let many = vec![Arg::U32(0); MAX_KERNEL_ARGS + 1];
        assert!(matches!(
            KernelParams::new(&many),
            Err(CudaError::Invalid(_))
        ));
    }
}
