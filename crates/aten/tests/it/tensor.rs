//! Tensor semantics: handles and reference counts, creation, views that share storage and see
//! each other's writes, the shared version counter, typed access, copies and conversions.

use aten::{Error, Generator, Tensor, TensorOptions};
use c10_core::{Bool, Device, ScalarType};
use half::{bf16, f16};

type R = aten::Result<()>;

fn t23() -> Tensor {
    Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3]).unwrap()
}

#[test]
fn handle_clone_is_a_reference_count() -> R {
    let a = t23();
    assert_eq!(a.use_count(), 1);
    let b = a.clone();
    assert_eq!((a.use_count(), b.use_count()), (2, 2));
    assert!(a.is_same(&b));
    drop(b);
    assert_eq!(a.use_count(), 1);
    Ok(())
}

#[test]
fn metadata_accessors() -> R {
    let a = t23();
    assert_eq!(
        (a.sizes(), a.strides(), a.storage_offset()),
        (&[2, 3][..], &[3, 1][..], 0)
    );
    assert_eq!(
        (a.dim(), a.numel(), a.nbytes(), a.element_size()),
        (2, 6, 24, 4)
    );
    assert_eq!((a.size(-1)?, a.stride(0)?), (3, 3));
    assert_eq!(a.dtype(), ScalarType::Float);
    assert_eq!(a.device(), Device::cpu());
    assert!(a.is_contiguous());
    assert_eq!(a.storage().nbytes(), 24);
    let s = a.select(0, 1)?;
    assert_eq!(s.data_ptr() as usize - a.data_ptr() as usize, 12);
    assert!(matches!(
        a.size(2),
        Err(Error::DimOutOfRange {
            dim: 2,
            ndim: 2,
            ..
        })
    ));
    Ok(())
}

#[test]
fn creation_values() -> R {
    assert_eq!(
        Tensor::zeros(&[2, 2], TensorOptions::new())?.to_vec::<f32>()?,
        [0.0; 4]
    );
    assert_eq!(
        Tensor::empty(&[3], ScalarType::Long)?.to_vec::<i64>()?,
        [0; 3]
    );
    assert_eq!(
        Tensor::ones(&[3], ScalarType::Double)?.to_vec::<f64>()?,
        [1.0; 3]
    );
    assert_eq!(
        Tensor::full(&[2], 2.75, ScalarType::Int)?.to_vec::<i32>()?,
        [2, 2]
    );
    assert_eq!(
        Tensor::full(&[2], -3.0, ScalarType::Bool)?.to_vec::<Bool>()?,
        [Bool(1); 2]
    );
    assert_eq!(
        Tensor::full(&[1], 1.5, ScalarType::Half)?.to_vec::<f16>()?,
        [f16::from_f32(1.5)]
    );
    assert_eq!(
        Tensor::full(&[1], 0.5, ScalarType::BFloat16)?.to_vec::<bf16>()?,
        [bf16::from_f32(0.5)]
    );
    assert_eq!(
        Tensor::arange(0.0, 1.0, 0.25, ScalarType::Double)?.to_vec::<f64>()?,
        [0.0, 0.25, 0.5, 0.75]
    );
    assert_eq!(
        Tensor::arange(5.0, 0.0, -2.0, ScalarType::Long)?.to_vec::<i64>()?,
        [5, 3, 1]
    );
    // torch.arange(0, 1, 0.3) has ceil(1 / 0.3) = 4 elements.
    assert_eq!(
        Tensor::arange(0.0, 1.0, 0.3, TensorOptions::new())?.numel(),
        4
    );
    assert!(Tensor::arange(0.0, 1.0, 0.0, TensorOptions::new()).is_err());
    assert!(Tensor::arange(0.0, 1.0, -1.0, TensorOptions::new()).is_err());
    let v = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[-1, 2])?;
    assert_eq!((v.sizes(), v.dtype()), (&[3, 2][..], ScalarType::Long));
    assert!(matches!(
        Tensor::from_slice(&[1.0f32; 5], &[2, 3]),
        Err(Error::InvalidShape { numel: 5, .. })
    ));
    assert_eq!(Tensor::scalar(7u8)?.item::<u8>()?, 7);
    assert!(matches!(
        Tensor::zeros(&[2, -1], TensorOptions::new()),
        Err(Error::NegativeSize { size: -1, .. })
    ));
    let like = Tensor::ones_like(&v)?;
    assert_eq!((like.sizes(), like.dtype()), (v.sizes(), ScalarType::Long));
    Ok(())
}

#[test]
fn seeded_random_is_reproducible_and_in_range() -> R {
    let opts = TensorOptions::new();
    let a = Tensor::rand(&[1000], &mut Generator::new(42), opts)?.to_vec::<f32>()?;
    let b = Tensor::rand(&[1000], &mut Generator::new(42), opts)?.to_vec::<f32>()?;
    let c = Tensor::rand(&[1000], &mut Generator::new(43), opts)?.to_vec::<f32>()?;
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05, "uniform mean {mean}");
    let n = Tensor::randn(&[4000], &mut Generator::new(7), ScalarType::Double)?.to_vec::<f64>()?;
    let mean = n.iter().sum::<f64>() / 4000.0;
    let var = n.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 4000.0;
    assert!(
        mean.abs() < 0.06 && (var - 1.0).abs() < 0.08,
        "normal mean {mean} var {var}"
    );
    // The same generator continues its stream.
    let mut g = Generator::new(1);
    let first = Tensor::rand(&[3], &mut g, opts)?.to_vec::<f32>()?;
    let second = Tensor::rand(&[3], &mut g, opts)?.to_vec::<f32>()?;
    assert_ne!(first, second);
    assert!(matches!(
        Tensor::rand(&[2], &mut g, ScalarType::Long),
        Err(Error::UnsupportedDtype {
            op: "rand",
            dtype: ScalarType::Long
        })
    ));
    Ok(())
}

#[test]
fn views_share_storage_and_see_writes() -> R {
    let a = t23();
    let views = [
        a.view(&[3, 2])?,
        a.t()?,
        a.narrow(1, 1, 2)?,
        a.select(0, 1)?,
        a.slice(1, Some(0), None, 2)?,
        a.unsqueeze(0)?,
        a.permute(&[1, 0])?,
        a.flatten(0, -1)?,
        a.as_strided(&[2], &[4], Some(1))?,
        a.select(0, 0)?.expand(&[4, 3])?,
    ];
    for v in &views {
        assert!(v.is_alias_of(&a), "{v:?}");
        assert!(v.version_counter().is_shared_with(a.version_counter()));
    }
    a.select(0, 1)?.fill_(9.0)?; // row 1 of a
    assert_eq!(views[0].to_vec::<f32>()?, [0.0, 1.0, 2.0, 9.0, 9.0, 9.0]);
    assert_eq!(views[1].to_vec::<f32>()?, [0.0, 9.0, 1.0, 9.0, 2.0, 9.0]);
    assert_eq!(views[2].to_vec::<f32>()?, [1.0, 2.0, 9.0, 9.0]);
    assert_eq!(views[3].to_vec::<f32>()?, [9.0, 9.0, 9.0]);
    assert_eq!(views[4].to_vec::<f32>()?, [0.0, 2.0, 9.0, 9.0]);
    assert_eq!(views[8].to_vec::<f32>()?, [1.0, 9.0]);
    // A write through a view lands in the base.
    views[1].select(0, 2)?.add_scalar_(10.0)?; // column 2 of a
    assert_eq!(a.to_vec::<f32>()?, [0.0, 1.0, 12.0, 9.0, 9.0, 19.0]);
    assert_eq!(views[9].to_vec::<f32>()?, [0.0, 1.0, 12.0].repeat(4));
    Ok(())
}

#[test]
fn view_geometry_matches_pytorch() -> R {
    let a = Tensor::arange(0.0, 24.0, 1.0, TensorOptions::new())?.view(&[2, 3, 4])?;
    let p = a.permute(&[2, 0, 1])?;
    assert_eq!((p.sizes(), p.strides()), (&[4, 2, 3][..], &[1, 12, 4][..]));
    let s = a.slice(2, Some(1), Some(-1), 2)?; // a[:, :, 1:-1:2]
    assert_eq!(
        (s.sizes(), s.strides(), s.storage_offset()),
        (&[2, 3, 1][..], &[12, 4, 2][..], 1)
    );
    let s = a.slice(1, Some(-10), Some(10), 1)?; // clamped to the whole dim
    assert_eq!(s.sizes(), [2, 3, 4]);
    let e = a.slice(0, Some(2), Some(1), 1)?;
    assert_eq!(e.sizes(), [0, 3, 4]);
    let n = a.narrow(-1, -3, 2)?;
    assert_eq!((n.sizes(), n.storage_offset()), (&[2, 3, 2][..], 1));
    let u = a.select(1, -1)?.unsqueeze(1)?;
    assert_eq!(
        (u.sizes(), u.strides(), u.storage_offset()),
        (&[2, 1, 4][..], &[12, 4, 1][..], 8)
    );
    let u = a.unsqueeze(-1)?;
    assert_eq!(
        (u.sizes(), u.strides()),
        (&[2, 3, 4, 1][..], &[12, 4, 1, 1][..])
    );
    let sq = Tensor::zeros(&[1, 3, 1], TensorOptions::new())?;
    assert_eq!(sq.squeeze()?.sizes(), [3]);
    assert_eq!(sq.squeeze_dim(0)?.sizes(), [3, 1]);
    assert_eq!(sq.squeeze_dim(1)?.sizes(), [1, 3, 1]);
    let t1 = Tensor::zeros(&[5], TensorOptions::new())?;
    assert_eq!(t1.t()?.sizes(), [5]);
    assert_eq!(a.flatten(1, 2)?.sizes(), [2, 12]);
    assert_eq!(Tensor::scalar(1.0f32)?.flatten(0, -1)?.sizes(), [1]);
    assert_eq!(a.transpose(0, 2)?.strides(), [1, 4, 12]);
    Ok(())
}

#[test]
fn reshape_views_when_possible_and_copies_otherwise() -> R {
    let a = t23();
    let v = a.reshape(&[3, 2])?;
    assert!(v.is_alias_of(&a));
    let t = a.t()?;
    assert!(matches!(t.view(&[6]), Err(Error::ViewIncompatible { .. })));
    let r = t.reshape(&[6])?;
    assert!(!r.is_alias_of(&a));
    assert_eq!(r.to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // flatten of a transposed matrix copies too.
    assert!(!t.flatten(0, 1)?.is_alias_of(&a));
    // An expanded tensor views into more dimensions without a copy.
    let e = Tensor::arange(0.0, 4.0, 1.0, TensorOptions::new())?.expand(&[3, 4])?;
    let v = e.view(&[3, 2, 2])?;
    assert!(v.is_alias_of(&e));
    assert_eq!(v.strides(), [0, 2, 1]);
    Ok(())
}

#[test]
fn version_counter_is_shared_and_bumped_by_in_place_ops() -> R {
    let a = t23();
    let v = a.t()?;
    let b = a.deep_clone()?;
    assert_eq!(a.version(), 0);
    a.add_(&b)?;
    assert_eq!((a.version(), v.version()), (1, 1));
    v.mul_scalar_(2.0)?;
    a.zero_()?;
    a.fill_(1.0)?;
    v.relu_()?;
    a.sub_(&b)?;
    a.copy_(&b)?;
    a.sync_copy_from_cpu(&[0.0f32; 6])?;
    drop(a.as_slice_mut::<f32>()?);
    assert_eq!(a.version(), 9);
    assert_eq!(v.version(), 9);
    // Out-of-place ops, views and reads do not bump; a clone has its own counter.
    let _ = a.add(&b)?;
    let _ = a.view(&[6])?;
    let _ = a.to_vec::<f32>()?;
    assert_eq!(a.version(), 9);
    assert_eq!(b.version(), 0);
    assert!(!b.version_counter().is_shared_with(a.version_counter()));
    // A failed in-place op does not bump.
    assert!(a.add_(&Tensor::zeros(&[4], TensorOptions::new())?).is_err());
    assert_eq!(a.version(), 9);
    Ok(())
}

#[test]
fn in_place_on_itself_and_overlap_rules() -> R {
    let a = t23();
    a.add_(&a)?; // aliasing input and output: no deadlock, doubles
    assert_eq!(a.to_vec::<f32>()?, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    a.mul_(&a.view(&[2, 3])?)?; // full overlap through a view
    assert_eq!(a.to_vec::<f32>()?, [0.0, 4.0, 16.0, 36.0, 64.0, 100.0]);
    let sq = Tensor::arange(0.0, 4.0, 1.0, TensorOptions::new())?.view(&[2, 2])?;
    assert!(matches!(
        sq.add_(&sq.t()?),
        Err(Error::MemoryOverlap { .. })
    ));
    let row = Tensor::zeros(&[3], TensorOptions::new())?.expand(&[2, 3])?;
    assert!(matches!(row.fill_(1.0), Err(Error::MemoryOverlap { .. })));
    // In-place with a broadcast operand and with disjoint parts of one storage.
    let m = Tensor::zeros(&[2, 3], TensorOptions::new())?;
    m.add_(&Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?)?;
    assert_eq!(m.to_vec::<f32>()?, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    m.select(0, 0)?.add_(&m.select(0, 1)?)?;
    assert_eq!(m.to_vec::<f32>()?, [2.0, 4.0, 6.0, 1.0, 2.0, 3.0]);
    Ok(())
}

#[test]
fn typed_access_checks_the_type() -> R {
    let a = t23();
    assert_eq!(
        a.item::<f32>().unwrap_err().to_string(),
        "a Tensor with 6 elements cannot be converted to Scalar"
    );
    assert!(matches!(
        a.to_vec::<f64>(),
        Err(Error::DtypeMismatch {
            expected: ScalarType::Double,
            actual: ScalarType::Float,
            ..
        })
    ));
    assert_eq!(a.select(0, 1)?.select(0, 2)?.item::<f32>()?, 5.0);
    {
        let s = a.as_slice::<f32>()?;
        assert_eq!(&*s, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // Readers do not block each other, even on one thread.
        assert_eq!(
            a.t()?.contiguous()?.to_vec::<f32>()?,
            [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
        let s2 = a.select(0, 1)?;
        assert_eq!(&*s2.as_slice::<f32>()?, &[3.0, 4.0, 5.0]);
    }
    {
        let row = a.narrow(0, 1, 1)?;
        let mut m = row.as_slice_mut::<f32>()?;
        m[0] = -1.0;
    }
    assert_eq!(a.to_vec::<f32>()?[3], -1.0);
    assert!(matches!(
        a.t()?.as_slice::<f32>(),
        Err(Error::NotContiguous { .. })
    ));
    assert!(matches!(
        a.as_slice::<i32>(),
        Err(Error::DtypeMismatch { .. })
    ));
    let b = Tensor::from_vec(vec![Bool(1), Bool(0)], &[2])?;
    assert_eq!(b.dtype(), ScalarType::Bool);
    assert_eq!(b.to_vec::<Bool>()?, [Bool(1), Bool(0)]);
    Ok(())
}

#[test]
fn copy_broadcasts_and_converts() -> R {
    let dst = Tensor::zeros(&[2, 3], ScalarType::Long)?;
    dst.copy_(&Tensor::from_vec(vec![1.9f64, -2.9, 3.5], &[3])?)?;
    assert_eq!(dst.to_vec::<i64>()?, [1, -2, 3, 1, -2, 3]);
    let t = Tensor::zeros(&[3, 2], TensorOptions::new())?;
    t.copy_(&t23().t()?)?;
    assert_eq!(t.to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // Into a strided destination.
    let base = Tensor::zeros(&[2, 4], ScalarType::Int)?;
    base.slice(1, None, None, 2)?
        .copy_(&Tensor::from_vec(vec![7i32, 8, 9, 10], &[2, 2])?)?;
    assert_eq!(base.to_vec::<i32>()?, [7, 0, 8, 0, 9, 0, 10, 0]);
    assert!(matches!(
        base.copy_(&Tensor::zeros(&[3], ScalarType::Int)?),
        Err(Error::ShapeMismatch { .. })
    ));
    // Every dtype pair round-trips small integers.
    let all = [
        ScalarType::Byte,
        ScalarType::Char,
        ScalarType::Short,
        ScalarType::Int,
        ScalarType::Long,
        ScalarType::Half,
        ScalarType::Float,
        ScalarType::Double,
        ScalarType::BFloat16,
    ];
    let src = Tensor::from_vec(vec![0i64, 1, 7, 100], &[4])?;
    for &from in &all {
        for &to in &all {
            let v = src
                .to_dtype(from)?
                .to_dtype(to)?
                .to_dtype(ScalarType::Long)?;
            assert_eq!(v.to_vec::<i64>()?, [0, 1, 7, 100], "{from} -> {to}");
        }
    }
    // Conversions follow C++ casts: truncation toward zero, wrap when narrowing integers,
    // anything non-zero is true.
    let f = Tensor::from_vec(vec![-1.5f32, 0.0, 2.7, 300.0], &[4])?;
    assert_eq!(
        f.to_dtype(ScalarType::Int)?.to_vec::<i32>()?,
        [-1, 0, 2, 300]
    );
    assert_eq!(
        f.to_dtype(ScalarType::Bool)?.to_vec::<Bool>()?,
        [Bool(1), Bool(0), Bool(1), Bool(1)]
    );
    let wide = Tensor::from_vec(vec![300i32, -1], &[2])?;
    assert_eq!(wide.to_dtype(ScalarType::Byte)?.to_vec::<u8>()?, [44, 255]);
    let big = Tensor::from_vec(vec![i64::MAX - 1], &[1])?;
    assert_eq!(big.to_dtype(ScalarType::Long)?.item::<i64>()?, i64::MAX - 1);
    Ok(())
}

#[test]
fn contiguous_and_deep_clone() -> R {
    let a = t23();
    let c = a.contiguous()?;
    assert!(c.is_same(&a));
    let t = a.t()?;
    let tc = t.contiguous()?;
    assert!(!tc.is_alias_of(&a) && tc.is_contiguous());
    // clone() preserves a dense layout's strides (memory_format=preserve) ...
    let k = t.deep_clone()?;
    assert_eq!((k.strides(), k.storage_offset()), (&[1, 3][..], 0));
    assert!(!k.is_alias_of(&a));
    assert_eq!(k.to_vec::<f32>()?, t.to_vec::<f32>()?);
    // ... and makes other layouts contiguous.
    let s = a.slice(1, None, None, 2)?.deep_clone()?;
    assert_eq!((s.sizes(), s.strides()), (&[2, 2][..], &[2, 1][..]));
    assert_eq!(s.to_vec::<f32>()?, [0.0, 2.0, 3.0, 5.0]);
    k.fill_(0.0)?;
    assert_eq!(a.to_vec::<f32>()?[1], 1.0);
    Ok(())
}

#[test]
fn sync_copies_need_exact_sizes() -> R {
    let a = Tensor::zeros(&[2, 2], TensorOptions::new())?;
    a.t()?.sync_copy_from_cpu(&[1.0f32, 2.0, 3.0, 4.0])?;
    assert_eq!(a.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    let mut out = [0f32; 4];
    a.t()?.sync_copy_to_cpu(&mut out)?;
    assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    assert!(matches!(
        a.sync_copy_from_cpu(&[1.0f32; 3]),
        Err(Error::MemorySizeMismatch {
            expected: 16,
            actual: 12,
            ..
        })
    ));
    let mut small = [0f32; 5];
    assert!(matches!(
        a.sync_copy_to_cpu(&mut small),
        Err(Error::MemorySizeMismatch {
            expected: 16,
            actual: 20,
            ..
        })
    ));
    assert!(matches!(
        a.sync_copy_from_cpu(&[1.0f64; 2]),
        Err(Error::DtypeMismatch { .. })
    ));
    Ok(())
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    if c10_cuda_driver::cuda_available() {
        return; // covered by tests/gpu.rs on machines with a GPU
    }
    let a = Tensor::ones(&[2], TensorOptions::new()).unwrap();
    match a.to(Device::cuda(0)) {
        Err(Error::CudaUnavailable { reason }) => assert!(!reason.is_empty()),
        other => panic!("expected CudaUnavailable, got {other:?}"),
    }
    assert!(matches!(
        Tensor::zeros(&[2], Device::cuda(0)),
        Err(Error::CudaUnavailable { .. })
    ));
}

#[test]
fn from_storage_wraps_unique_storages_only() -> R {
    let cpu = c10_core::get_cpu_allocator()?;
    let storage = c10_core::Storage::new(16, cpu.clone(), false)?;
    let shared = storage.clone();
    // SAFETY: the call fails before any byte is read (the storage is shared).
    let err = unsafe { Tensor::from_storage(shared, &[4], &[1], 0, ScalarType::Float) };
    assert!(matches!(err, Err(Error::InvalidArgument { .. })));
    drop(storage);
    let mut fresh = c10_core::Storage::new(16, cpu, false)?;
    fresh
        .try_bytes_mut()
        .unwrap()
        .copy_from_slice(bytemuck::cast_slice(&[1.0f32, 2.0, 3.0, 4.0]));
    // SAFETY: all 16 bytes were just written.
    let t = unsafe { Tensor::from_storage(fresh, &[2], &[2], 1, ScalarType::Float)? };
    assert_eq!(t.to_vec::<f32>()?, [2.0, 4.0]);
    let cpu = c10_core::get_cpu_allocator()?;
    let small = c10_core::Storage::new(8, cpu, false)?;
    // SAFETY: never read: the layout is refused.
    let err = unsafe { Tensor::from_storage(small, &[3], &[1], 0, ScalarType::Float) };
    assert!(matches!(
        err,
        Err(Error::OutOfStorageBounds {
            required: 12,
            available: 8,
            ..
        })
    ));
    Ok(())
}

#[test]
fn threads_share_tensors_safely() -> R {
    let a = Tensor::zeros(&[1000], ScalarType::Long)?;
    let one = Tensor::ones(&[1000], ScalarType::Long)?;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    a.add_(&one).unwrap();
                }
            });
        }
    });
    assert_eq!(a.to_vec::<i64>()?, vec![200; 1000]);
    assert_eq!(a.version(), 200);
    Ok(())
}
