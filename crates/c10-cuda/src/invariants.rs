//! A full consistency check of one allocator's state, for tests and debugging: blocks tile
//! their segments, pools hold exactly the idle blocks, and every statistic equals a recount.

use crate::allocator::DeviceCachingAllocator;
use crate::block::{AddrKey, BlockId, SizeKey};
use crate::device::DeviceMemory;
use crate::stats::{StatArray, StatType};

/// Recounted `current` values of the stats, by pool.
#[derive(Default)]
struct Recount {
    allocation: [i64; 3],
    allocated_bytes: [i64; 3],
    active: [i64; 3],
    active_bytes: [i64; 3],
    requested_bytes: [i64; 3],
    segment: [i64; 3],
    reserved_bytes: [i64; 3],
    inactive_split: [i64; 3],
    inactive_split_bytes: [i64; 3],
    oversize_allocations: i64,
    oversize_segments: i64,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Checks every structural invariant and recounts every statistic from the blocks.
    ///
    /// Checked: blocks of a segment are contiguous and doubly linked; no two idle neighbours
    /// with the same mapping state are left unmerged; the pools hold exactly the idle blocks
    /// under their current keys; the pointer map holds exactly the allocated blocks; reserved
    /// bytes equal the mapped bytes; each stat's `current` equals the recount and none is
    /// negative; `peak >= current`.
    ///
    /// # Errors
    /// A description of the first violation found. Costs O(blocks); meant for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let max_split = self.config.max_split_size_or_max();
        let mut r = Recount::default();
        let mut mapped_bytes = 0usize;
        let mut pool_blocks = 0usize;
        let mut unmapped_blocks = 0usize;
        let mut allocated = 0usize;
        let mut private_reserved: std::collections::BTreeMap<u32, usize> = Default::default();
        let mut private_segments: std::collections::BTreeMap<u32, i64> = Default::default();
        for (id, b) in self.blocks.iter() {
            let pools = [StatType::Aggregate as usize, Self::stat_types(b.small)[1]];
            if let Some(n) = b.next {
                let nb = self.blocks.get(n);
                if nb.prev != Some(id) {
                    return Err(format!("block {:#x}: next's prev link is broken", b.ptr));
                }
                if b.ptr + b.size as u64 != nb.ptr {
                    return Err(format!(
                        "block {:#x}+{} is not followed contiguously by {:#x}",
                        b.ptr, b.size, nb.ptr
                    ));
                }
                if b.is_idle() && nb.is_idle() && b.mapped == nb.mapped {
                    return Err(format!(
                        "idle neighbours {:#x} and {:#x} were not merged",
                        b.ptr, nb.ptr
                    ));
                }
                if nb.small != b.small
                    || nb.stream != b.stream
                    || nb.expandable != b.expandable
                    || nb.pool != b.pool
                {
                    return Err(format!("block {:#x}: neighbour in another pool", b.ptr));
                }
            }
            if let Some(p) = b.prev {
                if self.blocks.get(p).next != Some(id) {
                    return Err(format!("block {:#x}: prev's next link is broken", b.ptr));
                }
            }
            if b.size == 0 || b.size % 512 != 0 {
                return Err(format!("block {:#x} has size {}", b.ptr, b.size));
            }
            if !self.pools.slot_in_use(b.pool) {
                return Err(format!(
                    "block {:#x} names private pool slot {}, which does not exist",
                    b.ptr, b.pool
                ));
            }
            *private_reserved.entry(b.pool).or_default() += if b.mapped { b.size } else { 0 };
            if b.prev.is_none() && b.expandable.is_none() {
                *private_segments.entry(b.pool).or_default() += 1;
            }
            let pool = self.block_pool(b.pool, b.small);
            let in_pool = pool.blocks.contains(&SizeKey::of(id, b));
            let in_unmapped = pool.unmapped.contains(&AddrKey::of(id, b));
            let idle = b.is_idle();
            if b.mapped {
                mapped_bytes += b.size;
                for &t in &pools {
                    r.reserved_bytes[t] += b.size as i64;
                }
                if in_pool != idle || in_unmapped {
                    return Err(format!(
                        "block {:#x}: idle={idle} but in_pool={in_pool} in_unmapped={in_unmapped}",
                        b.ptr
                    ));
                }
            } else if !idle || !in_unmapped || in_pool {
                return Err(format!("unmapped block {:#x} misfiled", b.ptr));
            }
            pool_blocks += usize::from(in_pool);
            unmapped_blocks += usize::from(in_unmapped);
            if b.allocated {
                allocated += 1;
                if self.blocks.allocated.get(b.ptr) != Some(id) {
                    return Err(format!("allocated block {:#x} missing from map", b.ptr));
                }
                for &t in &pools {
                    r.allocation[t] += 1;
                    r.allocated_bytes[t] += b.size as i64;
                }
                if b.size >= max_split {
                    r.oversize_allocations += 1;
                }
            }
            let active = b.allocated || b.event_count > 0 || !b.stream_uses.is_empty();
            if active {
                for &t in &pools {
                    r.active[t] += 1;
                    r.active_bytes[t] += b.size as i64;
                    r.requested_bytes[t] += b.requested_size as i64;
                }
            }
            if idle && b.mapped && b.is_split() && b.expandable.is_none() {
                for &t in &pools {
                    r.inactive_split[t] += 1;
                    r.inactive_split_bytes[t] += b.size as i64;
                }
            }
            if b.prev.is_none() && b.expandable.is_none() {
                let mut size = 0;
                let mut cur: Option<BlockId> = Some(id);
                while let Some(c) = cur {
                    size += self.blocks.get(c).size;
                    cur = self.blocks.get(c).next;
                }
                for &t in &pools {
                    r.segment[t] += 1;
                }
                if size >= max_split {
                    r.oversize_segments += 1;
                }
            }
        }
        let (mut held, mut held_unmapped) = (0, 0);
        for (_, (large, small)) in self.pools.all_block_pools() {
            held += small.blocks.len() + large.blocks.len();
            held_unmapped += small.unmapped.len() + large.unmapped.len();
        }
        for (k, p) in self.pools.iter() {
            let reserved = private_reserved.get(&k).copied().unwrap_or(0);
            let stat = self
                .stats()
                .reserved_bytes_by_private_pools
                .get(&p.id)
                .map_or(0, |a| a[StatType::Aggregate as usize].current);
            if self.pools.slot_of(p.id) == Some(k) && stat != reserved as i64 {
                return Err(format!(
                    "private pool {}: reserved_bytes_by_private_pools {stat} != recount {reserved}",
                    p.id
                ));
            }
            let segments = private_segments.get(&k).copied().unwrap_or(0);
            if !self.config.expandable_segments && p.malloc_count != segments {
                return Err(format!(
                    "private pool {}: cudaMalloc_count {} != its {segments} segments",
                    p.id, p.malloc_count
                ));
            }
        }
        if pool_blocks != held {
            return Err("a pool holds a key of a block that is not idle or not live".into());
        }
        if unmapped_blocks != held_unmapped {
            return Err("an unmapped set holds a stale key".into());
        }
        if allocated != self.blocks.allocated.len() {
            return Err("the pointer map holds pointers of blocks that are not allocated".into());
        }
        if mapped_bytes != self.reserved_bytes() {
            return Err(format!(
                "reserved bytes {} != mapped block bytes {}",
                self.reserved_bytes(),
                mapped_bytes
            ));
        }
        let s = &self.stats();
        let arrays: [(&str, &StatArray, &[i64; 3]); 9] = [
            ("allocation", &s.allocation, &r.allocation),
            ("allocated_bytes", &s.allocated_bytes, &r.allocated_bytes),
            ("active", &s.active, &r.active),
            ("active_bytes", &s.active_bytes, &r.active_bytes),
            ("requested_bytes", &s.requested_bytes, &r.requested_bytes),
            ("segment", &s.segment, &r.segment),
            ("reserved_bytes", &s.reserved_bytes, &r.reserved_bytes),
            ("inactive_split", &s.inactive_split, &r.inactive_split),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &r.inactive_split_bytes,
            ),
        ];
        for (name, stat, want) in arrays {
            for t in StatType::ALL {
                let st = stat[t as usize];
                if st.current != want[t as usize] {
                    return Err(format!(
                        "{name}.{}.current is {} but the blocks say {}",
                        t.key(),
                        st.current,
                        want[t as usize]
                    ));
                }
                if st.current < 0 || st.peak < st.current {
                    return Err(format!(
                        "{name}.{} has current {} peak {}",
                        t.key(),
                        st.current,
                        st.peak
                    ));
                }
            }
        }
        if s.oversize_allocations.current != r.oversize_allocations {
            return Err(format!(
                "oversize_allocations.current is {} but the blocks say {}",
                s.oversize_allocations.current, r.oversize_allocations
            ));
        }
        if s.oversize_segments.current != r.oversize_segments {
            return Err(format!(
                "oversize_segments.current is {} but the blocks say {}",
                s.oversize_segments.current, r.oversize_segments
            ));
        }
        Ok(())
    }
}
