//! The stride rules of `aten::layout` as tables: contiguous strides, contiguity, density, view
//! legality (ATen's `computeStride`), broadcasting, expansion, dim wrapping, `-1` inference,
//! memory overlap, and the strides of new results (`preserve_format`, TensorIterator). Expected
//! values are PyTorch's (`t.stride()`, `t.is_contiguous()`, ...; the result strides from torch
//! 2.15.0).

use aten::layout::{
    Overlap, broadcast_shapes, channels_last_strides, compute_stride, contiguous_strides,
    elementwise_strides, expand_geometry, infer_dense_strides, infer_size,
    is_channels_last_contiguous, is_contiguous, is_non_overlapping_and_dense, overlap,
    preserve_format_strides, wrap_dim,
};
use aten::{Error, Layout, StridedIndex};
use rstest::rstest;

#[rstest]
#[case::three_d(&[2, 3, 4], &[12, 4, 1])]
#[case::scalar(&[], &[])]
#[case::vector(&[5], &[1])]
#[case::zero_size_keeps_outer_strides(&[2, 0, 3], &[3, 3, 1])]
#[case::ones(&[1, 1], &[1, 1])]
fn contiguous_strides_table(#[case] sizes: &[i64], #[case] strides: &[i64]) {
    assert_eq!(contiguous_strides(sizes), strides);
    assert!(is_contiguous(sizes, strides));
}

#[rstest]
#[case::row_major(&[2, 3], &[3, 1], true)]
#[case::transposed(&[2, 3], &[1, 2], false)]
#[case::size_one_any_stride(&[1, 3], &[99, 1], true)]
#[case::trailing_size_one(&[2, 1], &[1, 5], true)]
#[case::empty_any_strides(&[0, 3], &[7, 9], true)]
#[case::expanded(&[3], &[0], false)]
#[case::expanded_single(&[1], &[0], true)]
#[case::scalar(&[], &[], true)]
#[case::row_slice_step_two(&[2, 3], &[6, 1], false)]
fn contiguity_table(#[case] sizes: &[i64], #[case] strides: &[i64], #[case] expected: bool) {
    assert_eq!(is_contiguous(sizes, strides), expected);
    assert_eq!(
        Layout::new(sizes, strides, 0).unwrap().is_contiguous(),
        expected
    );
}

#[rstest]
#[case::transposed(&[2, 3], &[1, 2], true)]
#[case::row_major(&[2, 3], &[3, 1], true)]
#[case::strided_vector(&[3], &[2], false)]
#[case::expanded(&[2, 3], &[0, 1], false)]
#[case::gap(&[2, 2], &[4, 1], false)]
#[case::size_one_any_stride(&[3, 1], &[1, 7], true)]
#[case::permuted_3d(&[4, 2, 3], &[1, 12, 4], true)]
fn non_overlapping_and_dense_table(
    #[case] sizes: &[i64],
    #[case] strides: &[i64],
    #[case] expected: bool,
) {
    assert_eq!(is_non_overlapping_and_dense(sizes, strides), expected);
}

/// `t.view(new)` is legal exactly when `computeStride` returns strides; the strides are
/// PyTorch's.
#[rstest]
#[case::merge_contiguous(&[2, 3, 4], &[12, 4, 1], &[6, 4], Some(vec![4, 1]))]
#[case::flatten_contiguous(&[2, 3, 4], &[12, 4, 1], &[24], Some(vec![1]))]
#[case::split_contiguous(&[2, 3, 4], &[12, 4, 1], &[2, 12], Some(vec![12, 1]))]
#[case::regroup_contiguous(&[2, 3, 4], &[12, 4, 1], &[4, 6], Some(vec![6, 1]))]
#[case::flatten_transposed(&[3, 2], &[1, 3], &[6], None)]
#[case::unsqueeze_transposed(&[3, 2], &[1, 3], &[3, 2, 1], Some(vec![1, 3, 3]))]
#[case::flatten_expanded(&[3, 4], &[0, 1], &[12], None)]
#[case::split_expanded(&[3, 4], &[0, 1], &[3, 2, 2], Some(vec![0, 2, 1]))]
#[case::flatten_row_slice(&[2, 3], &[6, 1], &[6], None)]
#[case::unsqueeze_row_slice(&[2, 3], &[6, 1], &[2, 3, 1], Some(vec![6, 1, 1]))]
#[case::drop_size_one(&[1, 3], &[100, 1], &[3], Some(vec![1]))]
#[case::scalar_to_ones(&[], &[], &[1, 1], Some(vec![1, 1]))]
#[case::empty_restride(&[0, 3], &[3, 1], &[3, 0], Some(vec![1, 1]))]
#[case::empty_same_shape_keeps_strides(&[0, 3], &[5, 2], &[0, 3], Some(vec![5, 2]))]
#[case::merge_transposed_pair(&[4, 2, 3], &[1, 12, 4], &[4, 6], Some(vec![1, 4]))]
#[case::split_across_transposed(&[4, 2, 3], &[1, 12, 4], &[2, 12], None)]
fn view_legality_table(
    #[case] sizes: &[i64],
    #[case] strides: &[i64],
    #[case] new: &[i64],
    #[case] expected: Option<Vec<i64>>,
) {
    assert_eq!(compute_stride(sizes, strides, new), expected);
}

#[rstest]
#[case::trailing(&[2, 3], &[3], &[2, 3])]
#[case::both_ways(&[2, 1], &[1, 3], &[2, 3])]
#[case::numpy_example(&[5, 1, 4], &[3, 1], &[5, 3, 4])]
#[case::scalar(&[], &[2], &[2])]
#[case::zero_wins_over_one(&[0], &[1], &[0])]
#[case::equal(&[4, 4], &[4, 4], &[4, 4])]
fn broadcast_table(#[case] a: &[i64], #[case] b: &[i64], #[case] expected: &[i64]) {
    assert_eq!(broadcast_shapes("add", a, b).unwrap(), expected);
    assert_eq!(broadcast_shapes("add", b, a).unwrap(), expected);
}

#[rstest]
#[case::leading_dim(&[2, 3], &[4, 3], 0, 2, 4)]
#[case::trailing_dim(&[2, 3], &[4], 1, 3, 4)]
fn broadcast_errors(
    #[case] a: &[i64],
    #[case] b: &[i64],
    #[case] dim: usize,
    #[case] size_a: i64,
    #[case] size_b: i64,
) {
    match broadcast_shapes("add", a, b) {
        Err(Error::BroadcastMismatch {
            dim: d,
            lhs_size,
            rhs_size,
            lhs,
            rhs,
            ..
        }) => {
            assert_eq!((d, lhs_size, rhs_size), (dim, size_a, size_b));
            assert_eq!((lhs.as_slice(), rhs.as_slice()), (a, b));
        }
        other => panic!("expected a broadcast mismatch, got {other:?}"),
    }
}

#[rstest]
#[case::new_leading_dim(&[3], &[1], &[2, 3], &[2, 3], &[0, 1])]
#[case::size_one_dim(&[3, 1], &[1, 1], &[3, 4], &[3, 4], &[1, 0])]
#[case::minus_one_keeps(&[2, 3], &[3, 1], &[-1, 3], &[2, 3], &[3, 1])]
#[case::scalar(&[], &[], &[2, 2], &[2, 2], &[0, 0])]
#[case::leading_size_one_of_expanded(&[3], &[1], &[1, 2, 3], &[1, 2, 3], &[0, 0, 1])]
fn expand_table(
    #[case] sizes: &[i64],
    #[case] strides: &[i64],
    #[case] target: &[i64],
    #[case] out_sizes: &[i64],
    #[case] out_strides: &[i64],
) {
    let (s, st) = expand_geometry(sizes, strides, target).unwrap();
    assert_eq!((s.as_slice(), st.as_slice()), (out_sizes, out_strides));
}

#[rstest]
#[case::non_singleton(&[3], &[1], &[4])]
#[case::fewer_dims(&[2, 3], &[3, 1], &[3])]
#[case::minus_one_in_new_dim(&[3], &[1], &[-1, 3])]
fn expand_errors(#[case] sizes: &[i64], #[case] strides: &[i64], #[case] target: &[i64]) {
    assert!(expand_geometry(sizes, strides, target).is_err());
}

#[rstest]
#[case::last(-1, 3, Some(2))]
#[case::first_negative(-3, 3, Some(0))]
#[case::in_range(2, 3, Some(2))]
#[case::past_end(3, 3, None)]
#[case::before_start(-4, 3, None)]
#[case::scalar_zero(0, 0, Some(0))]
#[case::scalar_minus_one(-1, 0, Some(0))]
#[case::scalar_one(1, 0, None)]
fn wrap_dim_table(#[case] dim: i64, #[case] ndim: usize, #[case] expected: Option<usize>) {
    assert_eq!(wrap_dim("op", dim, ndim).ok(), expected);
}

#[rstest]
#[case::infer_last(&[2, -1], 6, Some(vec![2, 3]))]
#[case::infer_zero(&[-1], 0, Some(vec![0]))]
#[case::exact(&[3, 2], 6, Some(vec![3, 2]))]
#[case::ambiguous(&[-1, 0], 0, None)]
#[case::wrong_count(&[2, 2], 5, None)]
#[case::not_divisible(&[-1, 4], 6, None)]
#[case::two_inferred(&[-1, -1], 4, None)]
#[case::below_minus_one(&[-2, 3], 6, None)]
fn infer_size_table(
    #[case] shape: &[i64],
    #[case] numel: usize,
    #[case] expected: Option<Vec<i64>>,
) {
    assert_eq!(infer_size("view", shape, numel).ok(), expected);
}

#[rstest]
#[case::same(Layout::new(&[2, 2], &[2, 1], 0), Layout::new(&[2, 2], &[2, 1], 0), Overlap::Full)]
#[case::transposed_same_range(Layout::new(&[2, 2], &[2, 1], 0), Layout::new(&[2, 2], &[1, 2], 0), Overlap::Partial)]
#[case::disjoint_halves(Layout::new(&[3], &[1], 0), Layout::new(&[3], &[1], 3), Overlap::No)]
#[case::shifted(Layout::new(&[3], &[1], 0), Layout::new(&[3], &[1], 1), Overlap::Partial)]
#[case::expanded(Layout::new(&[3], &[0], 0), Layout::new(&[3], &[1], 0), Overlap::TooHard)]
#[case::empty(Layout::new(&[0], &[1], 0), Layout::new(&[3], &[1], 0), Overlap::No)]
fn overlap_table(
    #[case] a: aten::Result<Layout>,
    #[case] b: aten::Result<Layout>,
    #[case] expected: Overlap,
) {
    assert_eq!(overlap(&a.unwrap(), &b.unwrap()), expected);
}

#[rstest]
#[case::contiguous(&[2, 3], &[3, 1], 0, vec![0, 1, 2, 3, 4, 5])]
#[case::transposed(&[3, 2], &[1, 3], 0, vec![0, 3, 1, 4, 2, 5])]
#[case::offset_and_step(&[2, 2], &[6, 2], 1, vec![1, 3, 7, 9])]
#[case::expanded(&[2, 3], &[0, 1], 4, vec![4, 5, 6, 4, 5, 6])]
#[case::scalar(&[], &[], 7, vec![7])]
#[case::empty(&[2, 0], &[1, 1], 0, vec![])]
fn strided_index_table(
    #[case] sizes: &[i64],
    #[case] strides: &[i64],
    #[case] offset: i64,
    #[case] expected: Vec<i64>,
) {
    let layout = Layout::new(sizes, strides, offset).unwrap();
    assert_eq!(StridedIndex::new(&layout).collect::<Vec<_>>(), expected);
}

#[rstest]
#[case::contiguous(&[2, 3], &[3, 1], 0, 6)]
#[case::offset(&[2, 3], &[3, 1], 4, 10)]
#[case::expanded(&[5, 3], &[0, 1], 0, 3)]
#[case::empty(&[0, 3], &[3, 1], 9, 0)]
#[case::scalar(&[], &[], 2, 3)]
fn required_storage_table(
    #[case] sizes: &[i64],
    #[case] strides: &[i64],
    #[case] offset: i64,
    #[case] expected: u64,
) {
    let layout = Layout::new(sizes, strides, offset).unwrap();
    assert_eq!(layout.required_storage_elements(), expected);
}

#[rstest]
#[case::negative_stride(&[2], &[-1], 0)]
#[case::negative_size(&[-2], &[1], 0)]
#[case::negative_offset(&[2], &[1], -1)]
#[case::rank_mismatch(&[2, 2], &[1], 0)]
fn invalid_layouts(#[case] sizes: &[i64], #[case] strides: &[i64], #[case] offset: i64) {
    assert!(Layout::new(sizes, strides, offset).is_err());
}

/// `clone()` / `to(dtype)` strides (`empty_like(preserve_format)`): dense layouts keep their
/// strides, others get `infer_dense_strides` (torch 2.15.0 `t.clone().stride()`).
#[rstest]
#[case::transposed(&[4, 3], &[1, 4], &[1, 4])]
#[case::sliced_transpose(&[4, 3], &[1, 8], &[1, 4])]
#[case::sliced(&[4, 3], &[6, 2], &[3, 1])]
#[case::size_one_stride_zero(&[3, 1], &[1, 0], &[1, 0])]
#[case::size_one_not_dense(&[3, 1], &[2, 1], &[1, 1])]
#[case::row_of_transpose(&[1, 2], &[1, 3], &[1, 1])]
#[case::expanded(&[3, 2], &[0, 0], &[2, 1])]
#[case::expanded_transposed(&[3, 2], &[0, 3], &[2, 1])]
#[case::empty_permuted(&[2, 3, 0], &[1, 2, 2], &[1, 2, 2])]
#[case::dense_size_one_last(&[2, 2, 1], &[2, 1, 4], &[2, 1, 4])]
fn preserve_format_table(#[case] sizes: &[i64], #[case] strides: &[i64], #[case] out: &[i64]) {
    assert_eq!(preserve_format_strides(sizes, strides), out);
}

/// ATen's `infer_dense_strides` example: stride-0 dimensions do not move.
#[test]
fn infer_dense_strides_keeps_zero_strides_in_place() {
    // (6, 5, 4, 3, 2) / (6, 0, 120, 0, 1): the sorted permutation is (4, 3, 0, 1, 2); torch
    // 2.15.0's `clone()` of that view has strides (6, 36, 180, 2, 1).
    assert_eq!(
        infer_dense_strides(&[6, 5, 4, 3, 2], &[6, 0, 120, 0, 1]),
        [6, 36, 180, 2, 1]
    );
}

#[rstest]
#[case::nchw(&[2, 3, 2, 2], &[12, 4, 2, 1], false)]
#[case::nhwc(&[2, 3, 2, 2], &[12, 1, 6, 3], true)]
#[case::size_one_any_stride(&[2, 3, 1, 2], &[6, 1, 999, 3], true)]
#[case::three_d(&[2, 3, 2], &[6, 1, 3], false)]
fn channels_last_table(#[case] sizes: &[i64], #[case] strides: &[i64], #[case] expected: bool) {
    assert_eq!(is_channels_last_contiguous(sizes, strides), expected);
    if expected {
        assert!(is_channels_last_contiguous(
            sizes,
            &channels_last_strides(sizes)
        ));
    }
}

/// The output strides of elementwise ops (TensorIterator), torch 2.15.0: `exp(x)` (one input)
/// and `x + y` / `x + 1` (the scalar is a 0-d operand).
#[rstest]
#[case::exp_transposed(&[4, 3], vec![(vec![4, 3], vec![1, 4])], &[1, 4])]
#[case::exp_sliced(&[4, 3], vec![(vec![4, 3], vec![6, 2])], &[3, 1])]
#[case::exp_sliced_transpose(&[4, 3], vec![(vec![4, 3], vec![1, 8])], &[1, 4])]
#[case::exp_permuted(&[4, 2, 3], vec![(vec![4, 2, 3], vec![1, 12, 4])], &[1, 12, 4])]
#[case::exp_expanded(&[4, 3], vec![(vec![4, 3], vec![0, 1])], &[3, 1])]
#[case::exp_dense_size_one(&[3, 1], vec![(vec![3, 1], vec![1, 0])], &[1, 1])]
#[case::exp_channels_last_size_one(&[2, 3, 1, 2], vec![(vec![2, 3, 1, 2], vec![6, 1, 999, 3])], &[6, 1, 6, 3])]
#[case::exp_channels_last_n1(&[1, 3, 2, 2], vec![(vec![1, 3, 2, 2], vec![1, 1, 6, 3])], &[12, 1, 6, 3])]
#[case::exp_overlapping(&[2, 3, 4], vec![(vec![2, 3, 4], vec![1, 1, 1])], &[1, 2, 6])]
#[case::exp_empty(&[3, 0], vec![(vec![3, 0], vec![1, 3])], &[1, 1])]
#[case::exp_not_dense_size_one(&[3, 1], vec![(vec![3, 1], vec![2, 1])], &[1, 1])]
#[case::add_scalar_channels_last(&[2, 3, 1, 2], vec![(vec![2, 3, 1, 2], vec![6, 1, 999, 3]), (vec![], vec![])], &[6, 1, 12, 3])]
#[case::add_scalar_empty(&[3, 0], vec![(vec![3, 0], vec![1, 3]), (vec![], vec![])], &[1, 3])]
#[case::add_scalar_empty_3d(&[2, 3, 0], vec![(vec![2, 3, 0], vec![1, 2, 2]), (vec![], vec![])], &[1, 0, 2])]
#[case::transposed_plus_contiguous(&[2, 3], vec![(vec![2, 3], vec![1, 2]), (vec![2, 3], vec![3, 1])], &[1, 2])]
#[case::contiguous_plus_transposed(&[2, 3], vec![(vec![2, 3], vec![3, 1]), (vec![2, 3], vec![1, 2])], &[3, 1])]
#[case::transposed_plus_row(&[4, 3], vec![(vec![4, 3], vec![1, 4]), (vec![3], vec![1])], &[1, 4])]
#[case::column_plus_transposed(&[4, 3], vec![(vec![4, 1], vec![1, 1]), (vec![4, 3], vec![1, 4])], &[1, 4])]
#[case::expanded_plus_transposed(&[4, 3], vec![(vec![4, 3], vec![3, 0]), (vec![4, 3], vec![1, 4])], &[1, 4])]
#[case::column_plus_row(&[4, 3], vec![(vec![4, 1], vec![1, 1]), (vec![1, 3], vec![3, 1])], &[3, 1])]
fn elementwise_strides_table(
    #[case] shape: &[i64],
    #[case] inputs: Vec<(Vec<i64>, Vec<i64>)>,
    #[case] out: &[i64],
) {
    let inputs: Vec<(&[i64], &[i64])> = inputs
        .iter()
        .map(|(sizes, strides)| (sizes.as_slice(), strides.as_slice()))
        .collect();
    assert_eq!(elementwise_strides(shape, &inputs), out);
}
