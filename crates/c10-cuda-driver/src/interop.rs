//! cudarc interop: borrowed, typed views of a [`DeviceBuffer`] on a cudarc stream that cudarc's
//! kernel launches (`launch_builder().arg(&view)`) and copies (`memcpy_htod`, `memcpy_dtov`, ...)
//! accept, through its `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and `PushKernelArg` traits.
//!
//! The allocator's rule is PyTorch's: a block may be reused, without synchronization, by the next
//! request on its allocation stream once it is freed, so work on any *other* stream must be
//! recorded (`record_stream`). A view is made for one stream and does that when it is made:
//! when the view's stream is not the buffer's allocation stream, the stream is registered with
//! the [`CudaDevice`], made to wait for the work queued so far on the allocation stream, and
//! recorded on the block. Launch on the view's stream (`view.stream().launch_builder(..)`).
//! A cudarc call that hands the view a different stream (`device_ptr(other)`) makes that stream
//! wait for the view's stream and synchronizes it once the call has queued its work, so nothing
//! on it can outlive the block either.
//!
//! As in PyTorch, ordering work between two non-allocation streams that use the same block is
//! the caller's job (cudarc's own `CudaSlice` events are not involved).

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{
    CudaStream, DevicePtr as CudarcDevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg,
    SyncOnDrop, sys,
};

use c10_cuda::DeviceBuffer;
use c10_cuda::device::{DeviceError, StreamId};
use c10_cuda::{Error, Result};

use super::{CudaDevice, driver, handle_id};

/// A shared, typed view of a whole [`DeviceBuffer`] on a cudarc stream: `size / size_of::<T>()`
/// elements of `T` (trailing bytes that do not make a whole element are not part of it).
///
/// Made by [`CudaBufferViews::view`]; it borrows the buffer, so the block cannot be freed while the
/// view exists.
#[derive(Debug)]
pub struct BufferView<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _buffer: PhantomData<&'a [T]>,
}

/// An exclusive, typed view of a whole [`DeviceBuffer`] on a cudarc stream, for kernels and
/// copies that write to it. Made by [`CudaBufferViews::view_mut`].
#[derive(Debug)]
pub struct BufferViewMut<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _buffer: PhantomData<&'a mut [T]>,
}

/// The cudarc views of a [`DeviceBuffer`] on a [`CudaDevice`] (`buf.view(&stream)`,
/// `buf.view_mut(&stream)`; bring the trait into scope with `use c10_cuda_driver::CudaBufferViews;`).
pub trait CudaBufferViews {
    /// A shared view of the buffer as elements of `T`, for work queued on `stream` (a cudarc
    /// stream of the buffer's device). When `stream` is not the allocation stream, it is
    /// registered with the device ([`CudaDevice::register_stream`]), made to wait for the
    /// allocation stream (`cuEventRecord` + `cuStreamWaitEvent`) and recorded on the block
    /// ([`DeviceBuffer::record_stream`]).
    ///
    /// # Errors
    /// [`Error::Device`] with [`DeviceError::Invalid`] when `T` is zero-sized or `stream`
    /// belongs to another device's context; a driver failure of the wait.
    fn view<T>(&self, stream: &Arc<CudaStream>) -> Result<BufferView<'_, T>>;

    /// An exclusive view of the buffer as elements of `T`, for work queued on `stream`; the
    /// same stream rules as [`CudaBufferViews::view`].
    ///
    /// # Errors
    /// As [`CudaBufferViews::view`].
    ///
    /// # Example
    /// A cudarc kernel launch writing one of our blocks:
    /// ```no_run
    /// use std::sync::Arc;
    ///
    /// use c10_cuda::config::AllocatorConfig;
    /// use c10_cuda::device::StreamId;
    /// use c10_cuda::{CachingAllocator, DeviceBuffer};
    /// use c10_cuda_driver::{CudaBufferViews, CudaDevice};
    /// use cudarc::driver::{LaunchConfig, PushKernelArg};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let device = CudaDevice::new(0)?;
    /// let ctx = Arc::clone(device.context());
    /// let front = Arc::new(CachingAllocator::new(vec![device], AllocatorConfig::default())?);
    /// let stream = ctx.default_stream();
    /// // `extern "C" __global__ void fill(float *y, float v, unsigned n)`, compiled ahead
    /// // (`nvcc --ptx`) or at run time with `cudarc::nvrtc::compile_ptx`.
    /// let module = ctx.load_module(cudarc::nvrtc::Ptx::from_file("fill.ptx"))?;
    /// let fill = module.load_function("fill")?;
    /// let n = 1024u32;
    /// let mut buf = DeviceBuffer::new(&front, 0, n as usize * 4, StreamId::DEFAULT)?;
    /// let mut y = buf.view_mut::<f32>(&stream)?;
    /// let mut launch = stream.launch_builder(&fill);
    /// launch.arg(&mut y).arg(&1.5f32).arg(&n);
    /// // SAFETY: the arguments match fill's parameters; `y` holds n floats.
    /// unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
    /// assert_eq!(stream.clone_dtoh(&y)?, vec![1.5f32; n as usize]);
    /// // Dropping `buf` (after `y`) returns the block to the caching allocator.
    /// # Ok(()) }
    /// ```
    fn view_mut<T>(&mut self, stream: &Arc<CudaStream>) -> Result<BufferViewMut<'_, T>>;
}

impl CudaBufferViews for DeviceBuffer<CudaDevice> {
    fn view<T>(&self, stream: &Arc<CudaStream>) -> Result<BufferView<'_, T>> {
        let len = prepare::<T>(self, stream)?;
        Ok(BufferView {
            ptr: self.ptr(),
            len,
            stream: Arc::clone(stream),
            _buffer: PhantomData,
        })
    }

    fn view_mut<T>(&mut self, stream: &Arc<CudaStream>) -> Result<BufferViewMut<'_, T>> {
        let len = prepare::<T>(self, stream)?;
        Ok(BufferViewMut {
            ptr: self.ptr(),
            len,
            stream: Arc::clone(stream),
            _buffer: PhantomData,
        })
    }
}

/// The element count of a view of `T`, after the stream rules of [`CudaBufferViews::view`].
fn prepare<T>(buf: &DeviceBuffer<CudaDevice>, stream: &Arc<CudaStream>) -> Result<usize> {
    let elem = std::mem::size_of::<T>();
    if elem == 0 {
        return Err(Error::Device(DeviceError::Invalid {
            what: "view element type (zero-sized)",
            value: 0,
        }));
    }
    let id = StreamId(handle_id(stream.cu_stream()));
    let other = id != buf.stream() && !buf.is_empty();
    let allocation_stream = buf.front().with_device(buf.device(), |a| {
        let device = a.device();
        device.register_stream(stream)?;
        if other {
            device.stream(buf.stream()).map(Some)
        } else {
            Ok(None)
        }
    })??;
    if let Some(allocation_stream) = allocation_stream {
        stream
            .join(&allocation_stream)
            .map_err(driver("cuStreamWaitEvent"))?;
        buf.record_stream(id)?;
    }
    Ok(buf.size() / elem)
}

/// The accessors both views share.
macro_rules! view_accessors {
    ($view:ident) => {
        impl<T> $view<'_, T> {
            /// The number of elements of `T`.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view has no element.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The stream the view was made for: launch on it.
            pub fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }

            /// The device address (`CUdeviceptr`) of the first element.
            pub fn device_address(&self) -> sys::CUdeviceptr {
                self.ptr
            }
        }

        impl<T> DeviceSlice<T> for $view<'_, T> {
            fn len(&self) -> usize {
                self.len
            }

            fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }
        }

        impl<T> CudarcDevicePtr<T> for $view<'_, T> {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a CudaStream,
            ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
                (self.ptr, order_on(&self.stream, stream))
            }
        }
    };
}

view_accessors!(BufferView);
view_accessors!(BufferViewMut);

/// What a cudarc call on `other` must do before and after using a view made for `own`: nothing
/// on the view's own stream; on any other stream, wait for `own` first and synchronize once the
/// call has queued its work (so no work on `other` outlives the view's borrow of the block).
fn order_on<'a>(own: &CudaStream, other: &'a CudaStream) -> SyncOnDrop<'a> {
    if own.cu_stream() == other.cu_stream() {
        return SyncOnDrop::Record(None);
    }
    other.context().record_err(other.join(own));
    SyncOnDrop::Sync(Some(other))
}

impl<T> DevicePtrMut<T> for BufferViewMut<'_, T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, order_on(&self.stream, stream))
    }
}

// SAFETY: the argument pushed is a reference to the view's `CUdeviceptr` field, a `u64` (which
// cudarc's own `DeviceRepr` impl passes the same way), borrowed for `'b`, which outlives the
// launch builder `'a`; the address is a live block of at least `len * size_of::<T>()` bytes for
// as long as the view borrows its buffer.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b BufferView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b BufferView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&BufferView` above (a kernel that only reads a view made for writing).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b BufferViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b BufferViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&BufferView` above; the exclusive borrow of the view (and through it of the
// buffer) lasts for `'b`, so no other view of the block exists while the kernel is queued.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut BufferViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut BufferViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}
