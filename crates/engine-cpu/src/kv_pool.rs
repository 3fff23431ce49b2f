//! Every layer's K and V pools as disjoint ranges of one allocation.
//!
//! mimalloc backs large allocations with transparent huge pages, and a pool allocated on its
//! own ends inside its last 2 MiB page: with SmolLM2's 1 GiB cache (60 pools of 17.9 MB) that
//! left 69 MiB resident that held nothing. Contiguous pools share their boundary pages.

use std::sync::Arc;

use lmi_engine_core::error::{EngineError, Result};

/// One pool: `len` elements of a slab no other pool overlaps.
pub struct KvPool<T> {
    /// Keeps the allocation alive; never read through (the pointer below is).
    _slab: Arc<Vec<T>>,
    ptr: *mut T,
    len: usize,
}

// SAFETY: a pool is the only way to its range, and its range is disjoint from every other
// pool's, so a pool is as thread-safe as a `Vec<T>` of its own.
unsafe impl<T: Send> Send for KvPool<T> {}
unsafe impl<T: Sync> Sync for KvPool<T> {}

impl<T: Copy + Default> KvPool<T> {
    /// `count` zeroed pools of `len` elements each, in one allocation.
    pub fn zeroed(count: usize, len: usize) -> Result<Vec<KvPool<T>>> {
        let total = count
            .checked_mul(len)
            .ok_or_else(|| EngineError::Backend("KV cache size overflows".into()))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(total).map_err(|_| {
            EngineError::Backend(format!(
                "cannot allocate {} MiB for the KV cache ({count} pools of {len} elements)",
                (total * std::mem::size_of::<T>()) >> 20,
            ))
        })?;
        buf.resize(total, T::default());
        let base = buf.as_mut_ptr();
        let slab = Arc::new(buf);
        Ok((0..count)
            .map(|i| KvPool {
                _slab: slab.clone(),
                // SAFETY: i·len + len ≤ total, inside the allocation.
                ptr: unsafe { base.add(i * len) },
                len,
            })
            .collect())
    }
}

impl<T> std::ops::Deref for KvPool<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the range lies in the slab, which `_slab` keeps alive, and is this pool's.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T> std::ops::DerefMut for KvPool<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`; `&mut self` makes this the only reference to the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_zeroed_disjoint_and_outlive_each_other() {
        let mut pools = KvPool::<u16>::zeroed(3, 5).unwrap();
        assert!(
            pools
                .iter()
                .all(|p| p.len() == 5 && p.iter().all(|&v| v == 0))
        );
        for (i, p) in pools.iter_mut().enumerate() {
            p.fill(i as u16 + 1);
        }
        let last = pools.pop().unwrap();
        drop(pools);
        assert_eq!(&*last, &[3; 5]);
    }

    #[test]
    fn an_impossible_size_is_an_error() {
        assert!(KvPool::<u16>::zeroed(usize::MAX, 2).is_err());
        assert!(KvPool::<u16>::zeroed(1 << 20, 1 << 40).is_err());
    }
}
