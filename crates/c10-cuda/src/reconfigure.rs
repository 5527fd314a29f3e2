//! Changing the configuration of an allocator that holds no memory (PyTorch's
//! `torch.cuda.memory._set_allocator_settings`, restricted).

use crate::allocator::{DeviceCachingAllocator, fit_to_device};
use crate::config::AllocatorConfig;
use crate::device::DeviceMemory;
use crate::error::{Error, Result};

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Whether the allocator holds any block: allocated, cached, pending, or an unmapped part
    /// of an expandable segment.
    pub fn holds_memory(&self) -> bool {
        self.blocks.iter().next().is_some()
    }

    /// Replaces the configuration, as PyTorch's `_set_allocator_settings` (and
    /// `CUDAAllocatorConfig::setAllocatorSettings`) does, and as [`Self::new`] applies one:
    /// expandable segments fall back to regular ones on a device without virtual memory
    /// management, `per_process_memory_fraction` sets the memory fraction (its absence clears
    /// one), and [`Self::warnings`] become those of the new configuration.
    ///
    /// Unlike PyTorch, which applies new settings at once to an allocator holding memory (so
    /// that blocks made under the old rules, e.g. an oversize threshold, are counted under the
    /// new ones), this refuses while any block exists: free every allocation and call
    /// [`Self::empty_cache`] first.
    ///
    /// # Errors
    /// [`Error::Config`] when `config` does not validate; [`Error::ConfigInUse`] while the
    /// allocator holds memory (nothing changes); [`Error::Device`] when the device cannot report
    /// its memory for the fraction.
    pub fn set_config(&mut self, mut config: AllocatorConfig) -> Result<()> {
        config.validate()?;
        if self.holds_memory() {
            return Err(Error::ConfigInUse {
                device: self.device.index(),
                reserved: self.reserved_bytes(),
                blocks: self.blocks.iter().count(),
            });
        }
        self.warnings = fit_to_device(&mut config, &self.device);
        let fraction = config.per_process_memory_fraction;
        self.accounting.kept_mut().max_split_size = config.max_split_size.map(|v| v as u64);
        self.max_split = config.max_split_size_or_max();
        self.config = config;
        let applied = match fraction {
            Some(f) => self.set_memory_fraction(f),
            None => {
                self.accounting.allowed_memory_maximum = None;
                Ok(())
            }
        };
        self.refresh_plain();
        applied
    }
}
