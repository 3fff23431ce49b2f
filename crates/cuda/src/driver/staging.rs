//! Where small host-to-device copies go in the pinned staging buffer.
//!
//! Copies from pinned memory are truly asynchronous, so [`crate::Device::htod`] copies the
//! caller's bytes into the staging buffer and returns at once. The invariant: every byte
//! handed out since the last stream synchronization may still be read by a copy in flight,
//! so space is only reused after one. When a step's copies fill the buffer, the device
//! synchronizes the stream and starts again at offset 0 ([`Slot::AfterSync`]); every
//! synchronization (`synchronize`, `dtoh`, a large direct copy) also rewinds it.

/// Start of every slot: keeps DMA transfers aligned.
const ALIGN: usize = 64;

/// Where a copy of some bytes goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Free space at this offset.
    At(usize),
    /// The buffer is full of copies possibly in flight: synchronize the stream, then use
    /// this offset (0).
    AfterSync(usize),
}

/// Bump allocation over the staging buffer, rewound after each synchronization.
#[derive(Debug)]
pub struct StagingRing {
    capacity: usize,
    used: usize,
}

impl StagingRing {
    pub fn new(capacity: usize) -> Self {
        StagingRing { capacity, used: 0 }
    }

    /// A slot of `len` bytes, or `None` if `len` exceeds the whole buffer.
    pub fn reserve(&mut self, len: usize) -> Option<Slot> {
        if len > self.capacity {
            return None;
        }
        let start = self.used.next_multiple_of(ALIGN);
        if start + len <= self.capacity {
            self.used = start + len;
            return Some(Slot::At(start));
        }
        self.used = len;
        Some(Slot::AfterSync(0))
    }

    /// Every copy issued so far has completed (the stream was just synchronized).
    pub fn rewind(&mut self) {
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_until_the_buffer_fills() {
        let mut r = StagingRing::new(256);
        assert_eq!(r.reserve(10), Some(Slot::At(0)));
        assert_eq!(r.reserve(100), Some(Slot::At(64)));
        assert_eq!(r.reserve(64), Some(Slot::At(192)));
        // Full: the caller must synchronize before reusing the start.
        assert_eq!(r.reserve(1), Some(Slot::AfterSync(0)));
        assert_eq!(r.reserve(1), Some(Slot::At(64)));
        assert_eq!(r.reserve(257), None);
    }

    #[test]
    fn a_synchronization_rewinds() {
        let mut r = StagingRing::new(128);
        assert_eq!(r.reserve(100), Some(Slot::At(0)));
        r.rewind();
        assert_eq!(r.reserve(128), Some(Slot::At(0)));
        assert_eq!(r.reserve(1), Some(Slot::AfterSync(0)));
    }
}
