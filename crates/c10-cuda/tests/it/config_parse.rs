//! `AllocatorConfig`: good and bad configuration strings, canonical printing, the
//! `roundup_power2_divisions` interval rule, warnings, snapshot settings and the environment.

use std::ffi::OsString;

use c10_cuda::TorchVersion;
use c10_cuda::config::{
    ALLOWED_KEYS, AllocatorConfig, Backend, ConfigError, ConfigWarning, MIB, SettingValue,
};
use rstest::rstest;

fn cfg() -> AllocatorConfig {
    AllocatorConfig::default()
}

/// Divisions from runs: `runs(&[(4, 9), (2, 1), (1, 6)])` = nine 4s, one 2, six 1s.
fn runs(parts: &[(usize, usize)]) -> [usize; 16] {
    let v: Vec<usize> = parts
        .iter()
        .flat_map(|&(value, n)| std::iter::repeat_n(value, n))
        .collect();
    v.try_into().expect("runs must cover exactly 16 intervals")
}

#[test]
fn default_is_pytorch_default() {
    let d = cfg();
    assert_eq!(d.max_split_size, None);
    assert_eq!(d.max_non_split_rounding, 20 * MIB);
    assert_eq!(d.roundup_power2_divisions, [0; 16]);
    assert_eq!(d.garbage_collection_threshold, 0.0);
    assert!(!d.expandable_segments);
    assert_eq!(d.per_process_memory_fraction, None);
    assert_eq!(d.backend, Backend::Native);
    assert!(!d.release_lock_on_cudamalloc);
    assert!(!d.pinned_use_cuda_host_register);
    assert_eq!(d.pinned_num_register_threads, 1);
    assert_eq!(d.pinned_reserve_segment_size_mb, 0);
    assert!(!d.pinned_use_background_threads);
    assert!(!d.graph_capture_record_stream_reuse);
    assert_eq!(d.max_split_size_or_max(), usize::MAX);
    assert!(!d.gc_enabled());
    assert_eq!(d.validate(), Ok(()));
    assert!(d.validate_warnings().is_empty());
    assert_eq!(d.to_string(), "");
}

#[rstest]
#[case::empty("", cfg())]
#[case::only_whitespace("  \t ", cfg())]
#[case::split("max_split_size_mb:128", AllocatorConfig::builder().max_split_size(128 * MIB).build().unwrap())]
#[case::split_minimum("max_split_size_mb:20", AllocatorConfig::builder().max_split_size(20 * MIB).build().unwrap())]
#[case::split_clamped(
    "max_split_size_mb:18446744073709551615",
    AllocatorConfig::builder().max_split_size(usize::MAX / MIB * MIB).build().unwrap()
)]
#[case::non_split("max_non_split_rounding_mb:40", AllocatorConfig::builder().max_non_split_rounding(40 * MIB).build().unwrap())]
#[case::gc("garbage_collection_threshold:0.6", AllocatorConfig::builder().garbage_collection_threshold(0.6).build().unwrap())]
#[case::gc_leading_dot("garbage_collection_threshold:.25", AllocatorConfig::builder().garbage_collection_threshold(0.25).build().unwrap())]
#[case::expandable("expandable_segments:True", AllocatorConfig::builder().expandable_segments(true).build().unwrap())]
#[case::expandable_false("expandable_segments:False", cfg())]
#[case::whitespace(
    "  max_split_size_mb : 256 ,\texpandable_segments :True ",
    AllocatorConfig::builder().max_split_size(256 * MIB).expandable_segments(true).build().unwrap()
)]
#[case::trailing_comma("expandable_segments:True,", AllocatorConfig::builder().expandable_segments(true).build().unwrap())]
#[case::trailing_comma_space("expandable_segments:True , ", AllocatorConfig::builder().expandable_segments(true).build().unwrap())]
#[case::repeated_last_wins(
    "max_split_size_mb:128,expandable_segments:True,max_split_size_mb:256,expandable_segments:False",
    AllocatorConfig::builder().max_split_size(256 * MIB).build().unwrap()
)]
#[case::roundup_single("roundup_power2_divisions:4", AllocatorConfig::builder().roundup_power2_divisions([4; 16]).build().unwrap())]
#[case::roundup_single_zero("roundup_power2_divisions:0", cfg())]
#[case::roundup_list(
    "roundup_power2_divisions:[256:4,512:2,>:1]",
    AllocatorConfig::builder()
        .roundup_power2_divisions(runs(&[(4, 9), (2, 1), (1, 6)]))
        .build()
        .unwrap()
)]
#[case::roundup_list_spaces(
    "roundup_power2_divisions:[ 1 : 8 , 2:4 , >: 2 ]",
    AllocatorConfig::builder()
        .roundup_power2_divisions(runs(&[(8, 1), (4, 1), (2, 14)]))
        .build()
        .unwrap()
)]
#[case::roundup_list_without_fill(
    "roundup_power2_divisions:[64:8,128:0,256:2]",
    AllocatorConfig::builder()
        .roundup_power2_divisions(runs(&[(8, 7), (0, 1), (2, 1), (0, 7)]))
        .build()
        .unwrap()
)]
// torch 2.15 (checked with torch-oracle): without a key before it, `>` fills every interval
// after the first; the one below 2 MiB keeps 0.
#[case::roundup_list_only_fill("roundup_power2_divisions:[>:8]", AllocatorConfig::builder().roundup_power2_divisions([0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]).build().unwrap())]
#[case::roundup_list_key_clamped(
    "roundup_power2_divisions:[65536:2]",
    AllocatorConfig::builder().roundup_power2_divisions([2; 16]).build().unwrap()
)]
#[case::roundup_list_trailing_comma(
    "roundup_power2_divisions:[1024:4,]",
    AllocatorConfig::builder().roundup_power2_divisions(runs(&[(4, 11), (0, 5)])).build().unwrap()
)]
#[case::roundup_list_empty("roundup_power2_divisions:[]", cfg())]
#[case::roundup_repeated_starts_fresh(
    "roundup_power2_divisions:4,roundup_power2_divisions:[256:2]",
    AllocatorConfig::builder().roundup_power2_divisions(runs(&[(2, 9), (0, 7)])).build().unwrap()
)]
#[case::pytorch_own_test_string(
    "max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,\
     roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],expandable_segments:True,\
     pinned_use_background_threads:True",
    AllocatorConfig::builder()
        .max_split_size(40 * MIB)
        .max_non_split_rounding(30 * MIB)
        .garbage_collection_threshold(0.5)
        .roundup_power2_divisions(runs(&[(8, 7), (2, 1), (4, 1), (2, 1), (4, 1), (1, 5)]))
        .expandable_segments(true)
        .pinned_use_background_threads(true)
        .build()
        .unwrap()
)]
#[case::fraction("per_process_memory_fraction:0.5", AllocatorConfig::builder().per_process_memory_fraction(0.5).build().unwrap())]
#[case::fraction_one("per_process_memory_fraction:1", AllocatorConfig::builder().per_process_memory_fraction(1.0).build().unwrap())]
#[case::backend_async("backend:cudaMallocAsync", AllocatorConfig::builder().backend(Backend::CudaMallocAsync).build().unwrap())]
#[case::backend_native("backend:native", cfg())]
#[case::pinned_knobs(
    "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8,\
     pinned_reserve_segment_size_mb:64,pinned_use_background_threads:True,graph_capture_record_stream_reuse:True",
    AllocatorConfig::builder()
        .release_lock_on_cudamalloc(true)
        .pinned_use_cuda_host_register(true)
        .pinned_num_register_threads(8)
        .pinned_reserve_segment_size_mb(64)
        .pinned_use_background_threads(true)
        .graph_capture_record_stream_reuse(true)
        .build()
        .unwrap()
)]
#[case::pinned_threads_max("pinned_num_register_threads:128", AllocatorConfig::builder().pinned_num_register_threads(128).build().unwrap())]
#[case::hip_aliases(
    "release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True",
    AllocatorConfig::builder()
        .release_lock_on_cudamalloc(true)
        .pinned_use_cuda_host_register(true)
        .build()
        .unwrap()
)]
#[case::all_knobs(
    "backend:native,max_split_size_mb:512,max_non_split_rounding_mb:64,roundup_power2_divisions:[1:1,>:4],\
     garbage_collection_threshold:0.8,expandable_segments:True,per_process_memory_fraction:0.75,\
     release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:4,\
     pinned_reserve_segment_size_mb:1,pinned_use_background_threads:True,graph_capture_record_stream_reuse:True",
    AllocatorConfig::builder()
        .max_split_size(512 * MIB)
        .max_non_split_rounding(64 * MIB)
        .roundup_power2_divisions(runs(&[(1, 1), (4, 15)]))
        .garbage_collection_threshold(0.8)
        .expandable_segments(true)
        .per_process_memory_fraction(0.75)
        .backend(Backend::Native)
        .release_lock_on_cudamalloc(true)
        .pinned_use_cuda_host_register(true)
        .pinned_num_register_threads(4)
        .pinned_reserve_segment_size_mb(1)
        .pinned_use_background_threads(true)
        .graph_capture_record_stream_reuse(true)
        .build()
        .unwrap()
)]
fn good_strings(#[case] input: &str, #[case] expected: AllocatorConfig) {
    let parsed = AllocatorConfig::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
    assert_eq!(parsed, expected, "{input:?}");
    assert_eq!(input.parse::<AllocatorConfig>(), Ok(expected.clone()));
    assert_eq!(parsed.validate(), Ok(()));
    let canonical = parsed.to_string();
    assert_eq!(
        AllocatorConfig::parse(&canonical),
        Ok(parsed),
        "canonical {canonical:?}"
    );
}

/// The `>` fill starts after the last key (torch 2.15). torch 2.7 started it at the last key, so
/// there `[256:4,512:2,>:1]` gave the 512 MiB interval 1 division, not 2.
#[test]
fn roundup_fill_does_not_overwrite_last_key() {
    let c = AllocatorConfig::parse("roundup_power2_divisions:[256:4,512:2,>:1]").unwrap();
    assert_eq!(c.roundup_power2_divisions_for(MIB), 4);
    assert_eq!(c.roundup_power2_divisions_for(256 * MIB), 4);
    assert_eq!(c.roundup_power2_divisions_for(511 * MIB), 4);
    assert_eq!(
        c.roundup_power2_divisions_for(512 * MIB),
        2,
        "torch 2.7's rule would give 1"
    );
    let old = AllocatorConfig::parse_for(
        "roundup_power2_divisions:[256:4,512:2,>:1]",
        TorchVersion::V2_7,
    )
    .unwrap();
    assert_eq!(old.roundup_power2_divisions_for(512 * MIB), 1);
    assert_eq!(c.roundup_power2_divisions_for(1023 * MIB), 2);
    assert_eq!(c.roundup_power2_divisions_for(1024 * MIB), 1);
    assert_eq!(c.roundup_power2_divisions_for(usize::MAX), 1);
}

/// How each torch version reads the same strings (each row checked with torch-oracle: the block
/// a request of `size` bytes gets, i.e. `round_size`): 2.7 starts the `>` fill at the last key's
/// own interval (index 0 without a key), 2.15 at the next one.
#[rstest]
#[case::gt_alone_2_7("[>:2]", TorchVersion::V2_7, 4608, 6144)]
#[case::gt_alone_2_15("[>:2]", TorchVersion::V2_15, 4608, 4608)]
#[case::gt_alone_2_7_below_2mib("[>:2]", TorchVersion::V2_7, 1_600_000, 2 * MIB)]
#[case::gt_alone_2_15_below_2mib("[>:2]", TorchVersion::V2_15, 1_600_000, 1_600_000)]
#[case::gt_after_first_interval_2_7("[1:4,>:2]", TorchVersion::V2_7, 4608, 6144)]
#[case::gt_after_first_interval_2_15("[1:4,>:2]", TorchVersion::V2_15, 4608, 5120)]
#[case::gt_after_second_interval_2_7("[2:4,>:2]", TorchVersion::V2_7, 3_500_000, 4 * MIB)]
#[case::gt_after_second_interval_2_15("[2:4,>:2]", TorchVersion::V2_15, 3_500_000, 3_670_016)]
#[case::same_below_the_key("[2:4,>:2]", TorchVersion::V2_7, 1_600_000, 1_835_008)]
fn roundup_list_per_version(
    #[case] list: &str,
    #[case] version: TorchVersion,
    #[case] size: usize,
    #[case] block: usize,
) {
    let c =
        AllocatorConfig::parse_for(&format!("roundup_power2_divisions:{list}"), version).unwrap();
    assert_eq!(c10_cuda::sizes::round_size(size, &c), block);
}

/// Keys and bounds that differ between versions (torch-oracle: torch 2.7.1 aborts at start-up
/// on the rejected ones, with "must be > 20" or "Unrecognized CachingAllocator option").
#[rstest]
#[case::split_20_on_2_7("max_split_size_mb:20", TorchVersion::V2_7, false)]
#[case::split_20_on_2_15("max_split_size_mb:20", TorchVersion::V2_15, true)]
#[case::split_21_on_2_7("max_split_size_mb:21", TorchVersion::V2_7, true)]
#[case::rounding_20_on_2_7("max_non_split_rounding_mb:20", TorchVersion::V2_7, false)]
#[case::rounding_20_on_2_15("max_non_split_rounding_mb:20", TorchVersion::V2_15, true)]
#[case::rounding_19_on_2_15("max_non_split_rounding_mb:19", TorchVersion::V2_15, false)]
#[case::fraction_key_on_2_7("per_process_memory_fraction:0.5", TorchVersion::V2_7, false)]
#[case::fraction_key_on_2_15("per_process_memory_fraction:0.5", TorchVersion::V2_15, true)]
#[case::catch_all_on_2_7("pinned_free_catch_all:True", TorchVersion::V2_7, false)]
#[case::catch_all_on_2_15("pinned_free_catch_all:True", TorchVersion::V2_15, true)]
#[case::catch_all_not_a_bool("pinned_free_catch_all:yes", TorchVersion::V2_15, false)]
fn keys_per_version(#[case] input: &str, #[case] version: TorchVersion, #[case] ok: bool) {
    let got = AllocatorConfig::parse_for(input, version);
    assert_eq!(got.is_ok(), ok, "{input} under {version}: {got:?}");
    if let Err(e) = got {
        let key = input.split(':').next().unwrap();
        assert!(e.to_string().contains(key), "{e}");
    }
}

#[rstest]
#[case::empty("", "")]
#[case::defaults_dropped(
    "expandable_segments:False,backend:native,pinned_num_register_threads:1",
    ""
)]
#[case::fixed_order(
    " expandable_segments : True , max_split_size_mb:128",
    "max_split_size_mb:128,expandable_segments:True"
)]
#[case::roundup_list(
    "roundup_power2_divisions:[256:4,512:2,>:1]",
    "roundup_power2_divisions:[256:4,512:2,>:1]"
)]
#[case::roundup_all_equal("roundup_power2_divisions:[1:4,>:4]", "roundup_power2_divisions:4")]
#[case::roundup_gt_only("roundup_power2_divisions:[>:4]", "roundup_power2_divisions:[1:0,>:4]")]
#[case::roundup_clamped_key("roundup_power2_divisions:[32768:2]", "roundup_power2_divisions:2")]
#[case::roundup_no_fill(
    "roundup_power2_divisions:[1:2,2:4]",
    "roundup_power2_divisions:[1:2,2:4]"
)]
#[case::roundup_pytorch(
    "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]",
    "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]"
)]
#[case::roundup_redundant_keys(
    "roundup_power2_divisions:[64:8,128:8,>:8]",
    "roundup_power2_divisions:8"
)]
#[case::alias("release_lock_on_hipmalloc:True", "release_lock_on_cudamalloc:True")]
#[case::floats(
    "per_process_memory_fraction:1.0,garbage_collection_threshold:.5",
    "garbage_collection_threshold:0.5,per_process_memory_fraction:1"
)]
#[case::backend(
    "pinned_num_register_threads:2,backend:cudaMallocAsync",
    "backend:cudaMallocAsync,pinned_num_register_threads:2"
)]
fn canonical_strings(#[case] input: &str, #[case] canonical: &str) {
    let c = AllocatorConfig::parse(input).unwrap();
    assert_eq!(c.to_string(), canonical);
    assert_eq!(AllocatorConfig::parse(canonical), Ok(c));
}

/// What a bad input must produce.
#[derive(Debug)]
enum Want {
    Unknown(&'static str),
    Invalid(&'static str, &'static str),
    Syntax(usize),
}

#[rstest]
#[case::unknown_key("foo:1", Want::Unknown("foo"))]
#[case::unknown_newer_pytorch_key(
    "large_segment_size_mb:64",
    Want::Unknown("large_segment_size_mb")
)]
#[case::equals_instead_of_colon("max_split_size_mb=128", Want::Unknown("max_split_size_mb=128"))]
#[case::space_instead_of_colon(
    "expandable_segments True",
    Want::Unknown("expandable_segments True")
)]
#[case::split_too_small("max_split_size_mb:19", Want::Invalid("max_split_size_mb", "19"))]
#[case::split_zero("max_split_size_mb:0", Want::Invalid("max_split_size_mb", "0"))]
#[case::split_not_a_number("max_split_size_mb:abc", Want::Invalid("max_split_size_mb", "abc"))]
#[case::split_negative("max_split_size_mb:-128", Want::Invalid("max_split_size_mb", "-128"))]
#[case::split_with_unit("max_split_size_mb:128MB", Want::Invalid("max_split_size_mb", "128MB"))]
#[case::split_inner_space("max_split_size_mb:1 28", Want::Invalid("max_split_size_mb", "1 28"))]
#[case::split_overflow(
    "max_split_size_mb:99999999999999999999999",
    Want::Invalid("max_split_size_mb", "99999999999999999999999")
)]
#[case::non_split_too_small(
    "max_non_split_rounding_mb:10",
    Want::Invalid("max_non_split_rounding_mb", "10")
)]
#[case::divisions_not_power_of_two(
    "roundup_power2_divisions:3",
    Want::Invalid("roundup_power2_divisions", "3")
)]
#[case::list_value_not_power_of_two(
    "roundup_power2_divisions:[256:3]",
    Want::Invalid("roundup_power2_divisions", "3")
)]
#[case::list_key_not_power_of_two(
    "roundup_power2_divisions:[300:4]",
    Want::Invalid("roundup_power2_divisions", "300")
)]
#[case::list_key_zero(
    "roundup_power2_divisions:[0:4]",
    Want::Invalid("roundup_power2_divisions", "0")
)]
#[case::list_key_word(
    "roundup_power2_divisions:[<:4]",
    Want::Invalid("roundup_power2_divisions", "<")
)]
#[case::list_unclosed("roundup_power2_divisions:[256:4,512:2", Want::Syntax(37))]
#[case::list_unclosed_after_comma("roundup_power2_divisions:[256:4,", Want::Syntax(32))]
#[case::list_entry_without_colon("roundup_power2_divisions:[256]", Want::Syntax(29))]
#[case::list_entry_without_value("roundup_power2_divisions:[256:]", Want::Syntax(30))]
#[case::list_nested("roundup_power2_divisions:[[256:4]]", Want::Syntax(26))]
#[case::list_missing_comma("roundup_power2_divisions:[256:4 512:2]", Want::Syntax(35))]
#[case::gc_too_big(
    "garbage_collection_threshold:1.5",
    Want::Invalid("garbage_collection_threshold", "1.5")
)]
#[case::gc_one(
    "garbage_collection_threshold:1",
    Want::Invalid("garbage_collection_threshold", "1")
)]
#[case::gc_zero(
    "garbage_collection_threshold:0",
    Want::Invalid("garbage_collection_threshold", "0")
)]
#[case::gc_negative(
    "garbage_collection_threshold:-0.5",
    Want::Invalid("garbage_collection_threshold", "-0.5")
)]
#[case::gc_nan(
    "garbage_collection_threshold:NaN",
    Want::Invalid("garbage_collection_threshold", "NaN")
)]
#[case::expandable_yes("expandable_segments:yes", Want::Invalid("expandable_segments", "yes"))]
#[case::expandable_lowercase(
    "expandable_segments:true",
    Want::Invalid("expandable_segments", "true")
)]
#[case::expandable_list(
    "expandable_segments:[True]",
    Want::Invalid("expandable_segments", "[True]")
)]
#[case::expandable_list_unclosed("expandable_segments:[True", Want::Syntax(25))]
#[case::missing_colon("expandable_segments", Want::Syntax(19))]
#[case::missing_value("max_split_size_mb:", Want::Syntax(18))]
#[case::missing_value_before_comma("max_split_size_mb:,expandable_segments:True", Want::Syntax(18))]
#[case::two_values("max_split_size_mb:128:256", Want::Syntax(21))]
#[case::empty_item("expandable_segments:True,,max_split_size_mb:128", Want::Syntax(25))]
#[case::leading_comma(",expandable_segments:True", Want::Syntax(0))]
#[case::two_trailing_commas("expandable_segments:True,,", Want::Syntax(25))]
#[case::empty_key(":True", Want::Syntax(0))]
#[case::stray_bracket("]", Want::Syntax(0))]
#[case::fraction_zero(
    "per_process_memory_fraction:0",
    Want::Invalid("per_process_memory_fraction", "0")
)]
#[case::fraction_too_big(
    "per_process_memory_fraction:1.5",
    Want::Invalid("per_process_memory_fraction", "1.5")
)]
#[case::backend_unknown("backend:cudaMalloc", Want::Invalid("backend", "cudaMalloc"))]
#[case::threads_not_power_of_two(
    "pinned_num_register_threads:3",
    Want::Invalid("pinned_num_register_threads", "3")
)]
#[case::threads_too_many(
    "pinned_num_register_threads:256",
    Want::Invalid("pinned_num_register_threads", "256")
)]
#[case::threads_zero(
    "pinned_num_register_threads:0",
    Want::Invalid("pinned_num_register_threads", "0")
)]
#[case::reserve_zero(
    "pinned_reserve_segment_size_mb:0",
    Want::Invalid("pinned_reserve_segment_size_mb", "0")
)]
#[case::alias_keeps_spelling(
    "release_lock_on_hipmalloc:1",
    Want::Invalid("release_lock_on_hipmalloc", "1")
)]
fn bad_strings(#[case] input: &str, #[case] want: Want) {
    let err = AllocatorConfig::parse(input).expect_err(input);
    match (&want, &err) {
        (Want::Unknown(k), ConfigError::UnknownKey { key, allowed }) => {
            assert_eq!(key, k);
            assert_eq!(*allowed, ALLOWED_KEYS);
        }
        (Want::Invalid(k, v), ConfigError::InvalidValue { key, value, .. }) => {
            assert_eq!((*key, value.as_str()), (*k, *v));
        }
        (
            Want::Syntax(p),
            ConfigError::Syntax {
                input: i, position, ..
            },
        ) => {
            assert_eq!(i, input);
            assert_eq!(position, p);
        }
        _ => panic!("{input:?}: wanted {want:?}, got {err:?}"),
    }
    // Every message names the key (or, for a syntax error, quotes the input).
    let message = err.to_string();
    match &err {
        ConfigError::UnknownKey { key, .. } => assert!(message.contains(&format!("\"{key}\""))),
        ConfigError::InvalidValue { key, .. } => assert!(message.contains(&format!("\"{key}\""))),
        ConfigError::Syntax { input, .. } => assert!(message.contains(input.as_str())),
    }
}

/// Every bad input of the table above and its message, in one snapshot.
#[test]
fn bad_string_messages() {
    const BAD: &[&str] = &[
        "foo:1",
        "large_segment_size_mb:64",
        "max_split_size_mb=128",
        "expandable_segments True",
        "max_split_size_mb:19",
        "max_split_size_mb:0",
        "max_split_size_mb:abc",
        "max_split_size_mb:-128",
        "max_split_size_mb:128MB",
        "max_split_size_mb:1 28",
        "max_split_size_mb:99999999999999999999999",
        "max_non_split_rounding_mb:10",
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[256:3]",
        "roundup_power2_divisions:[300:4]",
        "roundup_power2_divisions:[0:4]",
        "roundup_power2_divisions:[<:4]",
        "roundup_power2_divisions:[256:4,512:2",
        "roundup_power2_divisions:[256:4,",
        "roundup_power2_divisions:[256]",
        "roundup_power2_divisions:[256:]",
        "roundup_power2_divisions:[[256:4]]",
        "roundup_power2_divisions:[256:4 512:2]",
        "garbage_collection_threshold:1.5",
        "garbage_collection_threshold:1",
        "garbage_collection_threshold:0",
        "garbage_collection_threshold:-0.5",
        "garbage_collection_threshold:NaN",
        "expandable_segments:yes",
        "expandable_segments:true",
        "expandable_segments:[True]",
        "expandable_segments:[True",
        "expandable_segments",
        "max_split_size_mb:",
        "max_split_size_mb:,expandable_segments:True",
        "max_split_size_mb:128:256",
        "expandable_segments:True,,max_split_size_mb:128",
        ",expandable_segments:True",
        "expandable_segments:True,,",
        ":True",
        "]",
        "per_process_memory_fraction:0",
        "per_process_memory_fraction:1.5",
        "backend:cudaMalloc",
        "pinned_num_register_threads:3",
        "pinned_num_register_threads:256",
        "pinned_num_register_threads:0",
        "pinned_reserve_segment_size_mb:0",
        "release_lock_on_hipmalloc:1",
    ];
    let mut out = String::new();
    for input in BAD {
        let err = AllocatorConfig::parse(input).expect_err(input);
        out.push_str(&format!("{input}\n  => {err}\n"));
    }
    insta::assert_snapshot!("bad_string_messages", out);
}

#[rstest]
#[case::zero(0, 0)]
#[case::one_byte(1, 0)]
#[case::half_mib(512 * 1024, 0)]
#[case::just_below_1mib(MIB - 1, 0)]
#[case::one_mib(MIB, 0)]
#[case::just_below_2mib(2 * MIB - 1, 0)]
#[case::two_mib(2 * MIB, 1)]
#[case::three_mib(3 * MIB, 1)]
#[case::mib_256(256 * MIB, 8)]
#[case::gib_1(1 << 30, 10)]
#[case::gib_1_and_a_bit((1 << 30) + 1, 10)]
#[case::just_below_32gib((32 << 30) - 1, 14)]
#[case::gib_32(32 << 30, 15)]
#[case::gib_64(64 << 30, 15)]
#[case::tib_1(1 << 40, 15)]
#[case::max(usize::MAX, 15)]
fn roundup_interval_index(#[case] size: usize, #[case] index: usize) {
    assert_eq!(AllocatorConfig::roundup_power2_index(size), index);
    // Not valid divisions (the builder would refuse them), so set in place: they only mark
    // which entry a size reads.
    let mut c = cfg();
    c.roundup_power2_divisions = std::array::from_fn(|i| 100 + i);
    assert_eq!(c.roundup_power2_divisions_for(size), 100 + index);
}

#[test]
fn queries() {
    let c =
        AllocatorConfig::parse("max_split_size_mb:64,garbage_collection_threshold:0.7").unwrap();
    assert_eq!(c.max_split_size_or_max(), 64 * MIB);
    assert!(c.gc_enabled());
}

#[test]
fn validate_rejects_hand_built_nonsense() {
    // The builder refuses them with validate's errors.
    let b = AllocatorConfig::builder;
    let refused = [
        b().max_split_size(64 * MIB + 1).build(),
        b().max_split_size(19 * MIB).build(),
        b().max_non_split_rounding(MIB).build(),
        b().roundup_power2_divisions([3; 16]).build(),
        b().garbage_collection_threshold(1.0).build(),
        b().garbage_collection_threshold(f64::NAN).build(),
        b().per_process_memory_fraction(0.0).build(),
        b().pinned_num_register_threads(0).build(),
    ];
    let built_keys: Vec<&str> = refused
        .iter()
        .map(|r| match r {
            Err(ConfigError::InvalidValue { key, .. }) => *key,
            other => panic!("{other:?}"),
        })
        .collect();
    // And so does validate, for the same values set in place on a valid config.
    let mut bad = vec![cfg(); 8];
    bad[0].max_split_size = Some(64 * MIB + 1);
    bad[1].max_split_size = Some(19 * MIB);
    bad[2].max_non_split_rounding = MIB;
    bad[3].roundup_power2_divisions = [3; 16];
    bad[4].garbage_collection_threshold = 1.0;
    bad[5].garbage_collection_threshold = f64::NAN;
    bad[6].per_process_memory_fraction = Some(0.0);
    bad[7].pinned_num_register_threads = 0;
    let keys: Vec<&str> = bad
        .iter()
        .map(|c| match c.validate() {
            Err(ConfigError::InvalidValue { key, .. }) => key,
            other => panic!("{c:?}: {other:?}"),
        })
        .collect();
    assert_eq!(built_keys, keys);
    assert_eq!(
        keys,
        [
            "max_split_size_mb",
            "max_split_size_mb",
            "max_non_split_rounding_mb",
            "roundup_power2_divisions",
            "garbage_collection_threshold",
            "garbage_collection_threshold",
            "per_process_memory_fraction",
            "pinned_num_register_threads",
        ]
    );
}

#[test]
fn warnings() {
    let warn = |s: &str| AllocatorConfig::parse(s).unwrap().validate_warnings();
    assert!(warn("").is_empty());
    assert!(warn("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9").is_empty());
    assert!(warn("expandable_segments:True").is_empty());
    assert!(warn("max_split_size_mb:128").is_empty());
    assert!(warn("backend:cudaMallocAsync,pinned_use_background_threads:True").is_empty());

    assert_eq!(
        warn("garbage_collection_threshold:0.6"),
        [ConfigWarning::GcThresholdWithoutMemoryFraction { threshold: 0.6 }]
    );
    assert_eq!(
        warn("expandable_segments:True,max_split_size_mb:128"),
        [ConfigWarning::ExpandableSegmentsWithMaxSplitSize {
            max_split_size: 128 * MIB
        }]
    );
    assert_eq!(
        warn("backend:cudaMallocAsync,max_split_size_mb:128,roundup_power2_divisions:4"),
        [ConfigWarning::AsyncBackendIgnoresNativeOptions {
            options: vec!["max_split_size_mb", "roundup_power2_divisions"]
        }]
    );

    let all = warn(
        "backend:cudaMallocAsync,max_split_size_mb:128,max_non_split_rounding_mb:40,\
         roundup_power2_divisions:4,garbage_collection_threshold:0.6,expandable_segments:True",
    );
    let text: String = all.iter().map(|w| format!("{w}\n")).collect();
    insta::assert_snapshot!("warning_messages", text);
}

#[test]
fn settings_of_default() {
    assert_eq!(
        cfg().to_settings(),
        vec![
            ("PYTORCH_CUDA_ALLOC_CONF", SettingValue::Str(String::new())),
            ("max_split_size", SettingValue::Int(-1)),
            ("garbage_collection_threshold", SettingValue::Float(0.0)),
            ("expandable_segments", SettingValue::Bool(false)),
            ("pinned_num_register_threads", SettingValue::Int(1)),
            ("release_lock_on_cudamalloc", SettingValue::Bool(false)),
            ("pinned_use_cuda_host_register", SettingValue::Bool(false)),
            (
                "roundup_power2_divisions",
                SettingValue::Map((0..16).map(|i| ((1u32 << i).to_string(), 0)).collect())
            ),
            (
                "graph_capture_record_stream_reuse",
                SettingValue::Bool(false)
            ),
        ]
    );
}

#[test]
fn settings_of_configured() {
    let c = AllocatorConfig::parse(
        "max_split_size_mb:128,roundup_power2_divisions:[256:4,512:2,>:1],expandable_segments:True,\
         garbage_collection_threshold:0.5,pinned_num_register_threads:8",
    )
    .unwrap();
    let s = c.to_settings();
    let get = |name: &str| {
        s.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(
        get("PYTORCH_CUDA_ALLOC_CONF"),
        SettingValue::Str(c.to_string())
    );
    assert_eq!(get("max_split_size"), SettingValue::Int(128 << 20));
    assert_eq!(
        get("garbage_collection_threshold"),
        SettingValue::Float(0.5)
    );
    assert_eq!(get("expandable_segments"), SettingValue::Bool(true));
    assert_eq!(get("pinned_num_register_threads"), SettingValue::Int(8));
    let SettingValue::Map(roundup) = get("roundup_power2_divisions") else {
        panic!()
    };
    assert_eq!(roundup.len(), 16);
    assert_eq!(roundup[0], ("1".to_owned(), 4));
    assert_eq!(roundup[8], ("256".to_owned(), 4));
    assert_eq!(roundup[9], ("512".to_owned(), 2));
    assert_eq!(roundup[15], ("32768".to_owned(), 1));

    // Replay: the string wins and brings back everything, our extensions included.
    assert_eq!(AllocatorConfig::from_settings(&s), Ok(c.clone()));
    // Without the string, the fields give the same config here (all its knobs are fields).
    let fields: Vec<(String, SettingValue)> = s
        .iter()
        .map(|(k, v)| match *k {
            "PYTORCH_CUDA_ALLOC_CONF" => (k.to_string(), SettingValue::Str(String::new())),
            _ => (k.to_string(), v.clone()),
        })
        .collect();
    assert_eq!(AllocatorConfig::from_settings(&fields), Ok(c));
}

#[test]
fn from_settings_of_a_pytorch_snapshot() {
    // As an older PyTorch writes it: no graph_capture_record_stream_reuse, no string set.
    let settings = vec![
        ("PYTORCH_CUDA_ALLOC_CONF", SettingValue::Str(String::new())),
        ("max_split_size", SettingValue::Int(-1)),
        ("garbage_collection_threshold", SettingValue::Float(0.0)),
        ("expandable_segments", SettingValue::Bool(true)),
        ("pinned_num_register_threads", SettingValue::Int(1)),
        ("release_lock_on_cudamalloc", SettingValue::Bool(false)),
        ("pinned_use_cuda_host_register", SettingValue::Bool(false)),
        (
            "roundup_power2_divisions",
            SettingValue::Map(vec![("1".into(), 2), ("32768".into(), 8)]),
        ),
        ("some_future_key", SettingValue::Int(7)),
    ];
    let mut want = AllocatorConfig::builder()
        .expandable_segments(true)
        .build()
        .unwrap();
    want.roundup_power2_divisions[0] = 2;
    want.roundup_power2_divisions[15] = 8;
    assert_eq!(AllocatorConfig::from_settings(&settings), Ok(want));

    // A non-empty string is preferred over the fields.
    let mut with_string = settings.clone();
    with_string[0].1 = SettingValue::Str("max_split_size_mb:200".into());
    assert_eq!(
        AllocatorConfig::from_settings(&with_string),
        Ok(AllocatorConfig::builder()
            .max_split_size(200 * MIB)
            .build()
            .unwrap())
    );

    // Nothing at all (a snapshot from before torch 2.4 has no settings): the default.
    let empty: [(&str, SettingValue); 0] = [];
    assert_eq!(AllocatorConfig::from_settings(&empty), Ok(cfg()));
}

#[rstest]
#[case::string_not_str("PYTORCH_CUDA_ALLOC_CONF", SettingValue::Int(3))]
#[case::string_bad("PYTORCH_CUDA_ALLOC_CONF", SettingValue::Str("expandable_segments:yes".into()))]
#[case::split_wrong_type("max_split_size", SettingValue::Str("128".into()))]
#[case::split_too_small("max_split_size", SettingValue::Int(1 << 20))]
#[case::split_zero("max_split_size", SettingValue::Int(0))]
#[case::gc_too_big("garbage_collection_threshold", SettingValue::Float(2.0))]
#[case::bool_wrong_type("expandable_segments", SettingValue::Int(1))]
#[case::threads_bad("pinned_num_register_threads", SettingValue::Int(3))]
#[case::threads_negative("pinned_num_register_threads", SettingValue::Int(-2))]
#[case::roundup_bad_key("roundup_power2_divisions", SettingValue::Map(vec![("3".into(), 2)]))]
#[case::roundup_bad_value("roundup_power2_divisions", SettingValue::Map(vec![("4".into(), 3)]))]
#[case::roundup_not_map("roundup_power2_divisions", SettingValue::Int(4))]
fn from_settings_rejects(#[case] key: &str, #[case] value: SettingValue) {
    let err = AllocatorConfig::from_settings(&[(key, value.clone())]).expect_err(key);
    assert!(
        matches!(err, ConfigError::InvalidValue { .. }),
        "{key} = {value}: {err:?}"
    );
}

fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
    move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| OsString::from(v))
    }
}

#[test]
fn environment_lookup() {
    let split = |mb| {
        Ok(AllocatorConfig::builder()
            .max_split_size(mb * MIB)
            .build()
            .unwrap())
    };
    assert_eq!(AllocatorConfig::from_env_with(env(&[])), Ok(cfg()));
    assert_eq!(
        AllocatorConfig::from_env_with(env(&[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")])),
        split(64)
    );
    assert_eq!(
        AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:32")])),
        split(32)
    );
    // Both set: PYTORCH_CUDA_ALLOC_CONF wins, as in PyTorch's code.
    assert_eq!(
        AllocatorConfig::from_env_with(env(&[
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:32"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
        ])),
        split(64)
    );
    // Set but empty still counts as set.
    assert_eq!(
        AllocatorConfig::from_env_with(env(&[
            ("PYTORCH_CUDA_ALLOC_CONF", ""),
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:32"),
        ])),
        Ok(cfg())
    );
    assert!(matches!(
        AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "bogus:1")])),
        Err(ConfigError::UnknownKey { .. })
    ));
}

#[cfg(unix)]
#[test]
fn environment_not_utf8() {
    use std::os::unix::ffi::OsStringExt;
    let err = AllocatorConfig::from_env_with(|name| {
        (name == "PYTORCH_CUDA_ALLOC_CONF").then(|| OsString::from_vec(vec![0x66, 0xff]))
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::InvalidValue {
                key: "PYTORCH_CUDA_ALLOC_CONF",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn the_builder_starts_from_the_defaults_or_a_config() {
    assert_eq!(AllocatorConfig::builder().build(), Ok(cfg()));
    let base = AllocatorConfig::parse("expandable_segments:True,max_split_size_mb:64").unwrap();
    assert_eq!(base.to_builder().build(), Ok(base.clone()));
    // Setting an Option knob to None clears it.
    let cleared = base.to_builder().max_split_size(None).build().unwrap();
    assert_eq!(cleared.to_string(), "expandable_segments:True");
    // The error is the configuration string's, for the same value.
    assert_eq!(
        AllocatorConfig::builder()
            .pinned_num_register_threads(3)
            .build(),
        AllocatorConfig::parse("pinned_num_register_threads:3")
    );
}
