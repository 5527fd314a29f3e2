//! A guided tour of `c10-core` for newcomers: devices, the allocator registry, data pointers,
//! shared storages and scalar types. Run it with `cargo run -p c10-core --example tour`.

use c10_core::{
    ALIGNMENT, CpuAllocator, Device, DeviceType, Result, ScalarType, Storage, get_allocator,
};
use std::sync::Arc;

fn main() -> Result<()> {
    println!("== Devices (parsed and printed as PyTorch spells them)");
    for text in ["cpu", "cuda:0", "sim:1"] {
        let device: Device = text.parse()?;
        println!(
            "  {text:<8} -> type {:<4} index {:?}",
            device.device_type(),
            device.index()
        );
    }
    for bad in ["cuda:", "gpu", "cpu:256"] {
        let err = bad.parse::<Device>().unwrap_err();
        println!("  {bad:<8} -> error: {err}");
    }

    println!("\n== Allocators (one registered per device type)");
    let cpu = get_allocator(DeviceType::Cpu)?;
    let data_ptr = cpu.allocate(1000)?;
    println!(
        "  allocated 1000 bytes on {} at {:p}: {}-byte aligned? {}",
        data_ptr.device(),
        data_ptr.get(),
        ALIGNMENT,
        data_ptr.get() as usize % ALIGNMENT == 0
    );
    drop(data_ptr);
    println!("  dropping the DataPtr ran its deleter once and freed the bytes");
    match get_allocator(DeviceType::Cuda) {
        Ok(_) => println!("  a cuda allocator is registered"),
        Err(err) => println!("  cuda: {err}"),
    }

    println!("\n== Storage (bytes shared by handles, freed with the last one)");
    let counting = Arc::new(CpuAllocator::zeroed());
    let mut storage = Storage::new(16, counting.clone(), true)?;
    storage
        .try_bytes_mut()
        .expect("a new storage has one handle")
        .copy_from_slice(b"hello, storage!!");
    println!("  one handle:    use_count = {}", storage.use_count());
    let alias = storage.clone();
    let weak = storage.downgrade();
    println!(
        "  clone + weak:  use_count = {}, weak_count = {}, alias? {}",
        storage.use_count(),
        storage.weak_count(),
        alias.is_alias_of(&storage)
    );
    alias.resize(32)?;
    println!(
        "  resized through the alias: both see {} bytes, allocator holds {} bytes",
        storage.nbytes(),
        counting.allocated_bytes()
    );
    drop(alias);
    drop(storage);
    println!(
        "  all strong handles dropped: weak upgrade -> {:?}, allocator holds {} bytes",
        weak.upgrade().map(|s| s.nbytes()),
        counting.allocated_bytes()
    );

    println!("\n== Scalar types");
    println!("  {:<14} {:<11} {:>5}", "c10 name", "torch name", "bytes");
    for scalar_type in ScalarType::ALL {
        println!(
            "  {:<14} {:<11} {:>5}",
            scalar_type.name(),
            scalar_type.torch_name(),
            scalar_type.item_size()
        );
    }
    Ok(())
}
