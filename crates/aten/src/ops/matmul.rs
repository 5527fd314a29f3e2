//! Matrix products: `mm`, `bmm` and `matmul` (with NumPy's 1-d and batch-broadcasting rules), on
//! `matrixmultiply`'s `sgemm`/`dgemm` (the GEMM that ndarray uses), as ATen's `mm`, `bmm`,
//! `matmul`.
//!
//! GEMM takes a row and a column stride per operand, so transposed, sliced and expanded inputs
//! are multiplied in place without a copy; batches (broadcast batch dimensions included, with
//! stride 0) are one GEMM call per matrix. `f32` and `f64` only (ATen's CPU integer matmul has no
//! GEMM behind it; aten refuses with [`Error::UnsupportedDtype`]). Single-threaded.

use crate::error::{Error, Result};
use crate::host::{Access, Dst, Src};
use crate::layout::{self, Layout};
use crate::ops::check_same;
use crate::scalar::dispatch;
use crate::strided_index::for_each_row;
use crate::tensor::Tensor;

/// A type with a GEMM in `matrixmultiply`.
trait Gemm: Copy {
    /// Zero (for products with an empty inner dimension).
    const ZERO: Self;

    /// `C = A · B` for an `m×k` A and a `k×n` B with the given row/column strides (elements).
    ///
    /// # Safety
    /// The three pointers must be valid for every element their sizes and strides reach (A, B
    /// for reads, C for writes), and C's elements must not alias each other or A's and B's.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! impl_gemm {
    ($t:ty, $f:path) => {
        impl Gemm for $t {
            const ZERO: Self = 0.0;

            unsafe fn gemm(
                m: usize,
                k: usize,
                n: usize,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: forwarded from this function's contract, which is matrixmultiply's
                // (alpha = 1, beta = 0: C is only written).
                unsafe { $f(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, 0.0, c, rsc, csc) }
            }
        }
    };
}

impl_gemm!(f32, matrixmultiply::sgemm);
impl_gemm!(f64, matrixmultiply::dgemm);

/// `out[batch] = a[batch] · b[batch]` for layouts `[B..., m, k]`, `[B..., k, n]` and a fresh
/// contiguous `[B..., m, n]` output, all with the same batch sizes.
fn batched_gemm<T: Gemm>(out: &Dst<'_, T>, a: &Src<'_, T>, b: &Src<'_, T>) {
    let (la, lb, lo) = (a.layout(), b.layout(), out.layout());
    let nd = lo.dim();
    assert!(
        nd >= 2 && la.dim() == nd && lb.dim() == nd,
        "batched_gemm: ranks"
    );
    let batch = &lo.sizes()[..nd - 2];
    assert_eq!(&la.sizes()[..nd - 2], batch, "batched_gemm: batch sizes");
    assert_eq!(&lb.sizes()[..nd - 2], batch, "batched_gemm: batch sizes");
    let (m, k, n) = (la.sizes()[nd - 2], la.sizes()[nd - 1], lb.sizes()[nd - 1]);
    assert_eq!(lb.sizes()[nd - 2], k, "batched_gemm: inner sizes");
    assert_eq!(
        (lo.sizes()[nd - 2], lo.sizes()[nd - 1]),
        (m, n),
        "batched_gemm: output sizes"
    );
    if m == 0 || n == 0 || layout::numel(batch) == 0 {
        return;
    }
    if k == 0 {
        out.fill(T::ZERO);
        return;
    }
    let st = |l: &Layout| (l.strides()[nd - 2] as isize, l.strides()[nd - 1] as isize);
    let ((rsa, csa), (rsb, csb), (rsc, csc)) = (st(la), st(lb), st(lo));
    let (pa, pb, pc) = (a.first_element(), b.first_element(), out.first_element());
    for_each_row(
        batch,
        [
            &la.strides()[..nd - 2],
            &lb.strides()[..nd - 2],
            &lo.strides()[..nd - 2],
        ],
        [0, 0, 0],
        |off, len, step| {
            for i in 0..len as i64 {
                let (oa, ob, oc) = (
                    (off[0] + i * step[0]) as isize,
                    (off[1] + i * step[1]) as isize,
                    (off[2] + i * step[2]) as isize,
                );
                // SAFETY: `a`, `b` and `out` were checked and locked by their Access (host.rs):
                // every element their layouts reach is valid, aligned host memory; the batch
                // offsets come from `for_each_row` over their own batch strides, so each matrix
                // pointer plus its row/column strides stays within its layout. The output is a
                // fresh contiguous tensor (distinct storage, no self-overlap), so C aliases
                // neither A, B nor itself.
                unsafe {
                    T::gemm(
                        m as usize,
                        k as usize,
                        n as usize,
                        pa.offset(oa),
                        rsa,
                        csa,
                        pb.offset(ob),
                        rsb,
                        csb,
                        pc.offset(oc),
                        rsc,
                        csc,
                    );
                }
            }
        },
    );
}

/// Multiplies layouts already checked and expanded: `[B..., m, k] · [B..., k, n]`.
fn product(op: &'static str, a: &Tensor, la: Layout, b: &Tensor, lb: Layout) -> Result<Tensor> {
    let nd = la.dim();
    let mut out_shape = la.sizes()[..nd - 2].to_vec();
    out_shape.push(la.sizes()[nd - 2]);
    out_shape.push(lb.sizes()[nd - 1]);
    let out = Tensor::empty_uninit(&out_shape, a.dtype(), a.device())?;
    {
        let access = Access::lock(op, &[a, b], &[&out])?;
        dispatch!(float, op, a.dtype(), |T| {
            let dst = access.dst::<T>(op, &out)?;
            let sa = access.src_as::<T>(op, a, la.clone())?;
            let sb = access.src_as::<T>(op, b, lb.clone())?;
            batched_gemm::<T>(&dst, &sa, &sb);
            Ok(())
        })?;
    }
    Ok(out)
}

impl Tensor {
    /// The matrix product of an `n×k` and a `k×m` matrix, as `torch.mm`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless both are 2-d ("self must be a matrix");
    /// [`Error::ShapeMismatch`] ("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
    /// [`Error::DtypeMismatch`], [`Error::DeviceMismatch`], [`Error::UnsupportedDtype`].
    pub fn mm(&self, other: &Tensor) -> Result<Tensor> {
        check_same("mm", self, other)?;
        for (name, t) in [("self", self), ("mat2", other)] {
            if t.dim() != 2 {
                return Err(Error::InvalidArgument {
                    op: "mm",
                    message: format!("{name} must be a matrix, got a {}-D tensor", t.dim()),
                });
            }
        }
        let (a, b) = (self.sizes(), other.sizes());
        if a[1] != b[0] {
            return Err(Error::ShapeMismatch {
                op: "mm",
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                reason: format!(
                    "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
                    a[0], a[1], b[0], b[1]
                ),
            });
        }
        product(
            "mm",
            self,
            self.layout().clone(),
            other,
            other.layout().clone(),
        )
    }

    /// Batched matrix product of `[b, n, k]` and `[b, k, m]`, as `torch.bmm`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless both are 3-d; [`Error::ShapeMismatch`] for different
    /// batch counts or inner sizes; as [`Tensor::mm`].
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        check_same("bmm", self, other)?;
        for (name, t) in [("batch1", self), ("batch2", other)] {
            if t.dim() != 3 {
                return Err(Error::InvalidArgument {
                    op: "bmm",
                    message: format!("{name} must be a 3D tensor, got a {}-D tensor", t.dim()),
                });
            }
        }
        let (a, b) = (self.sizes(), other.sizes());
        if a[0] != b[0] || a[2] != b[1] {
            return Err(Error::ShapeMismatch {
                op: "bmm",
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                reason: format!(
                    "expected size for first two dimensions of batch2 tensor to be: [{}, {}] but \
                     got: [{}, {}]",
                    a[0], a[2], b[0], b[1]
                ),
            });
        }
        product(
            "bmm",
            self,
            self.layout().clone(),
            other,
            other.layout().clone(),
        )
    }

    /// The matrix product with NumPy's rules, as `torch.matmul`: 1-d·1-d is a dot product (0-d
    /// result); a 1-d left operand is a row vector and a 1-d right operand a column vector
    /// (their extra dimension is removed from the result); with more than 2 dimensions the
    /// leading (batch) dimensions broadcast.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0-d operands; [`Error::ShapeMismatch`] when the inner sizes
    /// differ; [`Error::BroadcastMismatch`] for batch shapes that do not broadcast; as
    /// [`Tensor::mm`].
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        check_same("matmul", self, other)?;
        let (d1, d2) = (self.dim(), other.dim());
        if d1 == 0 || d2 == 0 {
            return Err(Error::InvalidArgument {
                op: "matmul",
                message: format!(
                    "both arguments to matmul need to be at least 1D, but they are {d1}D and {d2}D"
                ),
            });
        }
        let a = if d1 == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if d2 == 1 {
            other.unsqueeze(1)?
        } else {
            other.clone()
        };
        let (sa, sb) = (a.sizes(), b.sizes());
        let (na, nb) = (sa.len(), sb.len());
        if sa[na - 1] != sb[nb - 2] {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                lhs: self.sizes().to_vec(),
                rhs: other.sizes().to_vec(),
                reason: format!(
                    "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
                    sa[na - 2],
                    sa[na - 1],
                    sb[nb - 2],
                    sb[nb - 1]
                ),
            });
        }
        let batch = layout::broadcast_shapes("matmul", &sa[..na - 2], &sb[..nb - 2])?;
        let target = |rows: i64, cols: i64| {
            let mut t = batch.clone();
            t.extend([rows, cols]);
            t
        };
        let expand = |t: &Tensor, shape: Vec<i64>| -> Result<Layout> {
            let (sizes, strides) = layout::expand_geometry(t.sizes(), t.strides(), &shape)?;
            Ok(Layout::from_parts(sizes, strides, t.storage_offset()))
        };
        let la = expand(&a, target(sa[na - 2], sa[na - 1]))?;
        let lb = expand(&b, target(sb[nb - 2], sb[nb - 1]))?;
        let out = product("matmul", &a, la, &b, lb)?;
        // Remove the dimensions that stood in for 1-d operands.
        let mut shape = out.sizes().to_vec();
        if d2 == 1 {
            shape.pop();
        }
        if d1 == 1 {
            shape.remove(shape.len() - 1 - usize::from(d2 != 1));
        }
        out.view(&shape)
    }
}
