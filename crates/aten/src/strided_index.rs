//! Iteration over non-contiguous layouts: [`StridedIndex`] (element offsets one by one, as
//! candle's `StridedIndex`) and [`for_each_row`] (innermost rows of several operands at once,
//! after merging dimensions that are contiguous in every operand, as ATen's `TensorIterator`
//! `coalesce_dimensions`).

use crate::layout::Layout;

/// The storage offsets (in elements) of a layout's elements in row-major index order, as
/// candle's `StridedIndex`.
///
/// ```
/// use aten::{Layout, StridedIndex};
/// let t = Layout::new(&[2, 3], &[1, 2], 0)?; // a transposed 3x2 matrix
/// assert_eq!(StridedIndex::new(&t).collect::<Vec<_>>(), [0, 2, 4, 1, 3, 5]);
/// # Ok::<(), aten::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct StridedIndex<'a> {
    next: Option<i64>,
    index: Vec<i64>,
    layout: &'a Layout,
}

impl<'a> StridedIndex<'a> {
    /// An iterator over `layout`'s element offsets (none for an empty layout, one for a 0-d one).
    pub fn new(layout: &'a Layout) -> Self {
        let next = (layout.numel() > 0).then_some(layout.storage_offset());
        StridedIndex {
            next,
            index: vec![0; layout.dim()],
            layout,
        }
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = i64;

    fn next(&mut self) -> Option<i64> {
        let current = self.next?;
        let sizes = self.layout.sizes();
        let strides = self.layout.strides();
        let mut offset = current;
        let mut done = true;
        for d in (0..sizes.len()).rev() {
            if self.index[d] + 1 < sizes[d] {
                self.index[d] += 1;
                offset += strides[d];
                done = false;
                break;
            }
            offset -= self.index[d] * strides[d];
            self.index[d] = 0;
        }
        self.next = (!done).then_some(offset);
        Some(current)
    }
}

/// One merged dimension: its size and each operand's stride.
type Dim<const N: usize> = (i64, [i64; N]);

/// Drops size-1 dimensions and merges neighbours that are contiguous with each other in every
/// operand (outer stride == inner stride * inner size), keeping row-major order. Returns `None`
/// when some size is 0 (nothing to visit).
fn coalesce<const N: usize>(sizes: &[i64], strides: [&[i64]; N]) -> Option<Vec<Dim<N>>> {
    let mut dims: Vec<Dim<N>> = Vec::with_capacity(sizes.len());
    for (d, &size) in sizes.iter().enumerate() {
        if size == 0 {
            return None;
        }
        if size == 1 {
            continue;
        }
        let s: [i64; N] = std::array::from_fn(|k| strides[k][d]);
        if let Some(last) = dims.last_mut() {
            // `last` is the outer neighbour of dimension d.
            if (0..N).all(|k| last.1[k] == s[k] * size) {
                last.0 *= size;
                last.1 = s;
                continue;
            }
        }
        dims.push((size, s));
    }
    Some(dims)
}

/// Calls `f(offsets, len, inner_strides)` once per innermost row of `N` operands that share
/// `sizes` but have their own strides and start offsets (all in elements). `offsets[k]` is
/// operand `k`'s storage offset of the row's first element and `inner_strides[k]` its step along
/// the row; rows come in row-major order of the outer indices. Dimensions contiguous in every
/// operand are merged first, so fully contiguous operands give a single row of `numel`
/// elements. A 0-d shape gives one row of length 1; an empty one gives none.
///
/// # Panics
/// If a strides slice is shorter than `sizes` (an internal bug: callers pass layouts of one
/// shape).
pub fn for_each_row<const N: usize>(
    sizes: &[i64],
    strides: [&[i64]; N],
    start: [i64; N],
    mut f: impl FnMut([i64; N], usize, [i64; N]),
) {
    for s in &strides {
        assert_eq!(
            s.len(),
            sizes.len(),
            "for_each_row: strides of another rank"
        );
    }
    let Some(dims) = coalesce(sizes, strides) else {
        return;
    };
    let Some(&(inner_len, inner_strides)) = dims.last() else {
        f(start, 1, [0; N]);
        return;
    };
    let outer = &dims[..dims.len() - 1];
    let mut index = vec![0i64; outer.len()];
    let mut offsets = start;
    loop {
        f(offsets, inner_len as usize, inner_strides);
        // Advance the outer multi-index (odometer), updating the offsets incrementally.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            let (size, s) = outer[d];
            if index[d] + 1 < size {
                index[d] += 1;
                for k in 0..N {
                    offsets[k] += s[k];
                }
                break;
            }
            for k in 0..N {
                offsets[k] -= index[d] * s[k];
            }
            index[d] = 0;
        }
    }
}
