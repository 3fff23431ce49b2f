//! The device table LoRA kernels find each row's adapter through: for every (layer,
//! projection) site, one entry per slot, `{A, Bᵀ, rank}` (`LoraSlot` in kernels/lora.cu; rank 0
//! where the slot's adapter leaves the projection alone). A registered adapter takes the lowest
//! free slot and frees it when its registration is dropped; which adapters stay resident is
//! the scheduler's LRU (`max_loras`), so the table grows to the number of adapters loaded at
//! once and is then reused.
//!
//! CUDA graphs record the table's address, the projections launched and the rank bound that
//! sizes the shrink grid, so those only ever grow — the sites any adapter has changed, the
//! largest rank seen (as a power of two), the capacity — and each growth bumps `generation`,
//! which the backend folds into the epoch that invalidates graphs. Filling a free slot with
//! an adapter of a known shape changes only the table's contents, which replays read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lmi_cuda::{DevPtr, Device, ElemType};
use lmi_engine_core::backend::{LoraLayer, LoraSite};
use lmi_engine_core::error::{EngineError, Result};

use super::super::backend::{CudaWeight, lock};
use super::super::memory::{DeviceBox, cuda_err};

/// Bytes of one `LoraSlot` (two pointers, the rank, padding).
const ENTRY_BYTES: usize = 24;
/// Slots of a new table; it doubles when full.
const FIRST_CAPACITY: usize = 8;
/// Smallest rank bound (a whole rank tile of the shrink kernel).
const MIN_RANK_BOUND: usize = 8;
const TARGETS: usize = 7;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    a: u64,
    bt: u64,
    rank: u32,
}

/// What a LoRA launch at one site needs from the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteLaunch {
    /// The site's `LoraSlot` array.
    pub table: DevPtr,
    pub x_width: usize,
    pub n_out: usize,
    /// Largest rank the table has held, a power of two: the shrink grid's rank extent.
    pub rank_bound: usize,
}

pub struct LoraTable<D: Device> {
    dev: Arc<D>,
    layers: usize,
    capacity: usize,
    mem: Option<DeviceBox<D>>,
    /// `[site][capacity]`, mirrored on the device.
    host: Vec<Entry>,
    /// The id registered in each slot.
    occupant: Vec<Option<u64>>,
    ids: HashMap<u64, u32>,
    /// (x_width, n_out) of every site an adapter has changed since the table was created.
    sites: Vec<Option<(usize, usize)>>,
    rank_bound: usize,
    generation: u64,
}

impl<D: Device> LoraTable<D> {
    pub fn new(dev: &Arc<D>) -> Self {
        LoraTable {
            dev: dev.clone(),
            layers: 0,
            capacity: 0,
            mem: None,
            host: Vec::new(),
            occupant: Vec::new(),
            ids: HashMap::new(),
            sites: Vec::new(),
            rank_bound: MIN_RANK_BOUND,
            generation: 0,
        }
    }

    /// Changes whenever a graph captured over the table could launch differently.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn slot_of(&self, id: u64) -> Option<u32> {
        self.ids.get(&id).copied()
    }

    /// The launch of `site`; None when no adapter has ever changed it (nothing to launch).
    pub fn site(&self, site: LoraSite) -> Option<SiteLaunch> {
        let s = self.site_index(site)?;
        let (x_width, n_out) = self.sites[s]?;
        let mem = self.mem.as_ref()?;
        Some(SiteLaunch {
            table: mem.ptr().offset(s * self.capacity * ENTRY_BYTES),
            x_width,
            n_out,
            rank_bound: self.rank_bound,
        })
    }

    /// Whether `slot` holds the pair `(a, bt)` at `site` (a step's groups must be the
    /// registered adapters).
    pub fn holds(&self, site: LoraSite, slot: u32, a: DevPtr, bt: DevPtr) -> bool {
        let Some(s) = self.site_index(site) else {
            return false;
        };
        let slot = slot as usize;
        slot < self.capacity && {
            let e = self.host[s * self.capacity + slot];
            e.rank > 0 && e.a == a.0 && e.bt == bt.0
        }
    }

    fn site_index(&self, site: LoraSite) -> Option<usize> {
        (site.layer < self.layers).then_some(site.layer * TARGETS + site.target as usize)
    }

    /// Puts an adapter's pairs (`[layer][target]`: A `[rank, in]`, Bᵀ `[rank, out]`, bf16)
    /// in a free slot under `id` (replacing the slot `id` named before, which its own
    /// registration still frees) and uploads the table.
    pub fn register(&mut self, id: u64, pairs: &[LoraLayer<'_, CudaWeight<D>>]) -> Result<u32> {
        if self.layers == 0 {
            self.layers = pairs.len();
            self.sites = vec![None; self.layers * TARGETS];
        } else if pairs.len() != self.layers {
            return Err(EngineError::Backend(format!(
                "LoRA adapter {id} has {} layers, the adapters registered before {}",
                pairs.len(),
                self.layers
            )));
        }
        // Check every pair before anything changes.
        let mut entries = Vec::new();
        for (layer, row) in pairs.iter().enumerate() {
            for (t, pair) in row.iter().enumerate() {
                let Some((a, bt)) = pair else { continue };
                let (rank, x_width, n_out) = pair_dims(a, bt).ok_or_else(|| {
                    EngineError::Backend(format!(
                        "LoRA adapter {id}, layer {layer}, target {t}: A {:?} and Bᵀ {:?} are not \
                         bf16 [rank, in] and [rank, out] (upload pairs with upload_lora_pair)",
                        a.shape, bt.shape
                    ))
                })?;
                let s = layer * TARGETS + t;
                if let Some(dims) = self.sites[s]
                    && dims != (x_width, n_out)
                {
                    return Err(EngineError::Backend(format!(
                        "LoRA adapter {id}, layer {layer}, target {t}: a [{x_width} → {n_out}] \
                         pair where registered adapters have [{} → {}]",
                        dims.0, dims.1
                    )));
                }
                let e = Entry {
                    a: a.ptr().0,
                    bt: bt.ptr().0,
                    rank: rank as u32,
                };
                entries.push((s, (x_width, n_out), e));
            }
        }
        let slot = match self.occupant.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.grow()?;
                self.occupant.iter().position(Option::is_none).unwrap_or(0)
            }
        };
        for &(s, dims, e) in &entries {
            if self.sites[s].is_none() {
                self.sites[s] = Some(dims);
                self.generation += 1;
            }
            let bound = (e.rank as usize).next_power_of_two().max(MIN_RANK_BOUND);
            if bound > self.rank_bound {
                self.rank_bound = bound;
                self.generation += 1;
            }
            self.host[s * self.capacity + slot] = e;
        }
        self.occupant[slot] = Some(id);
        self.ids.insert(id, slot as u32);
        if let Err(e) = self.upload() {
            self.clear(slot as u32, id);
            return Err(e);
        }
        Ok(slot as u32)
    }

    /// Frees `slot` (registered under `id`) and uploads the table.
    pub fn release(&mut self, slot: u32, id: u64) {
        self.clear(slot, id);
        if let Err(e) = self.upload() {
            // The slot is free on the host side: no step maps a row to it any more.
            tracing::warn!("clearing LoRA slot {slot} on the device: {e}");
        }
    }

    fn clear(&mut self, slot: u32, id: u64) {
        let slot = slot as usize;
        if slot >= self.capacity {
            return;
        }
        for s in 0..self.sites.len() {
            self.host[s * self.capacity + slot] = Entry::default();
        }
        self.occupant[slot] = None;
        if self.ids.get(&id) == Some(&(slot as u32)) {
            self.ids.remove(&id);
        }
    }

    /// Doubles the slots (a new device table: graphs captured over the old one are stale).
    fn grow(&mut self) -> Result<()> {
        let cap = (2 * self.capacity).max(FIRST_CAPACITY);
        let sites = self.sites.len();
        let mut host = vec![Entry::default(); sites * cap];
        for s in 0..sites {
            host[s * cap..s * cap + self.capacity]
                .copy_from_slice(&self.host[s * self.capacity..(s + 1) * self.capacity]);
        }
        self.mem = Some(DeviceBox::new(&self.dev, sites * cap * ENTRY_BYTES)?);
        self.host = host;
        self.occupant.resize(cap, None);
        self.capacity = cap;
        self.generation += 1;
        Ok(())
    }

    fn upload(&self) -> Result<()> {
        let Some(mem) = &self.mem else { return Ok(()) };
        let mut bytes = Vec::with_capacity(self.host.len() * ENTRY_BYTES);
        for e in &self.host {
            bytes.extend_from_slice(&e.a.to_le_bytes());
            bytes.extend_from_slice(&e.bt.to_le_bytes());
            bytes.extend_from_slice(&e.rank.to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
        }
        self.dev.htod(&bytes, mem.ptr()).map_err(cuda_err)
    }
}

/// (rank, in, out) of a pair uploaded by the CUDA backend, if it is one.
fn pair_dims<D: Device>(a: &CudaWeight<D>, bt: &CudaWeight<D>) -> Option<(usize, usize, usize)> {
    let ok = a.dtype == ElemType::BF16
        && bt.dtype == ElemType::BF16
        && a.shape.len() == 2
        && bt.shape.len() == 2
        && a.shape[0] == bt.shape[0]
        && a.shape[0] > 0;
    ok.then(|| (a.shape[0], a.shape[1], bt.shape[1]))
}

/// An adapter's hold on its slot (what `Backend::register_lora` returns): dropping it frees
/// the slot.
pub struct Registration<D: Device> {
    pub table: Arc<Mutex<LoraTable<D>>>,
    pub slot: u32,
    pub id: u64,
}

impl<D: Device> Drop for Registration<D> {
    fn drop(&mut self) {
        lock(&self.table).release(self.slot, self.id);
    }
}

#[cfg(test)]
mod tests {
    use lmi_cuda_emu::EmuDevice;

    use super::*;
    use crate::CudaBackend;
    use lmi_checkpoint::dtype::DType;
    use lmi_checkpoint::weights::HostTensor;
    use lmi_engine_core::backend::Backend;
    use lmi_engine_core::lora::Target;

    type Pair = (CudaWeight<EmuDevice>, CudaWeight<EmuDevice>);

    fn pair(b: &CudaBackend<EmuDevice>, rank: usize, k: usize, n: usize) -> Pair {
        let t = |r, c| HostTensor::f32(vec![r, c], vec![0.5; r * c]);
        b.upload_lora_pair(t(rank, k), t(n, rank), DType::BF16)
            .unwrap()
    }

    /// One layer with `q` at Q and `down` at Down.
    fn layer<'a>(
        q: Option<&'a Pair>,
        down: Option<&'a Pair>,
    ) -> LoraLayer<'a, CudaWeight<EmuDevice>> {
        let mut l: LoraLayer<'_, CudaWeight<EmuDevice>> = Default::default();
        l[Target::Q as usize] = q.map(|(a, b)| (a, b));
        l[Target::Down as usize] = down.map(|(a, b)| (a, b));
        l
    }

    const Q: LoraSite = LoraSite {
        layer: 0,
        target: Target::Q,
    };
    const DOWN: LoraSite = LoraSite {
        layer: 0,
        target: Target::Down,
    };

    #[test]
    fn slots_are_reused_and_only_growth_moves_the_generation() {
        let dev = Arc::new(EmuDevice::new());
        let b = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        let mut t = LoraTable::new(&dev);
        let (r4, r8, r16) = (
            pair(&b, 4, 64, 32),
            pair(&b, 8, 64, 32),
            pair(&b, 16, 64, 32),
        );
        assert_eq!(t.register(1, &[layer(Some(&r4), None)]).unwrap(), 0);
        let g = t.generation();
        assert!(g > 0);
        let q = t.site(Q).unwrap();
        assert_eq!((q.x_width, q.n_out, q.rank_bound), (64, 32, 8));
        assert_eq!(t.site(DOWN), None, "no adapter changes down_proj yet");

        // Same shapes: a new slot, same generation.
        assert_eq!(t.register(2, &[layer(Some(&r8), None)]).unwrap(), 1);
        assert_eq!(t.generation(), g);
        assert!(t.holds(Q, 1, r8.0.ptr(), r8.1.ptr()));
        assert!(!t.holds(Q, 0, r8.0.ptr(), r8.1.ptr()));

        // A larger rank and a new site move it (graphs launch more).
        let down = pair(&b, 2, 32, 64);
        assert_eq!(t.register(3, &[layer(Some(&r16), Some(&down))]).unwrap(), 2);
        let g = t.generation();
        assert_eq!(t.site(Q).unwrap().rank_bound, 16);
        assert_eq!(t.site(DOWN).unwrap().n_out, 64);

        // A freed slot is taken by the next adapter; bounds never shrink.
        t.release(1, 2);
        assert_eq!(t.slot_of(2), None);
        assert_eq!(t.register(4, &[layer(Some(&r4), None)]).unwrap(), 1);
        t.release(2, 3);
        assert_eq!(t.generation(), g);
        assert_eq!(t.site(Q).unwrap().rank_bound, 16);
        assert!(t.site(DOWN).is_some());

        // Replacing an id: the old registration's release leaves the new slot mapped.
        assert_eq!(t.register(1, &[layer(Some(&r8), None)]).unwrap(), 2);
        t.release(0, 1);
        assert_eq!(t.slot_of(1), Some(2));

        // Growing past the capacity moves the table (and the generation).
        let before = t.site(Q).unwrap().table;
        for id in 10..17 {
            t.register(id, &[layer(Some(&r4), None)]).unwrap();
        }
        assert!(t.generation() > g);
        assert_ne!(t.site(Q).unwrap().table, before);
        assert_eq!(t.slot_of(16), Some(8));

        // Pairs that do not fit the registered shapes are refused, naming them.
        let wide = pair(&b, 4, 128, 32);
        let e = t.register(20, &[layer(Some(&wide), None)]).unwrap_err();
        assert!(e.to_string().contains("[128 → 32]"), "{e}");
        let e = t
            .register(21, &[layer(None, None), layer(None, None)])
            .unwrap_err();
        assert!(e.to_string().contains("2 layers"), "{e}");
    }
}
