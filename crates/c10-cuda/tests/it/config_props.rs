//! Property tests of `AllocatorConfig`: printing and parsing round-trip, parsing never panics.

use c10_cuda::config::{ALLOWED_KEYS, AllocatorConfig, Backend, MIB, SettingValue};
use proptest::prelude::*;

fn division() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), (0u32..20).prop_map(|k| 1usize << k)]
}

/// Division arrays: arbitrary ones, and the few-runs shapes real configs have.
fn divisions() -> impl Strategy<Value = [usize; 16]> {
    prop_oneof![
        Just([0; 16]),
        division().prop_map(|d| [d; 16]),
        prop::array::uniform16(division()),
        (division(), division(), division(), 0usize..16, 0usize..16).prop_map(|(a, b, c, i, j)| {
            let (lo, hi) = (i.min(j), i.max(j));
            std::array::from_fn(|k| {
                if k <= lo {
                    a
                } else if k <= hi {
                    b
                } else {
                    c
                }
            })
        }),
    ]
}

fn split_size() -> impl Strategy<Value = usize> {
    prop_oneof![20usize..100_000, 20usize..=usize::MAX / MIB].prop_map(|mb| mb * MIB)
}

fn fraction_below_one() -> impl Strategy<Value = f64> {
    prop_oneof![
        1e-300f64..1.0,
        (1u32..1000).prop_map(|n| f64::from(n) / 1000.0)
    ]
}

prop_compose! {
    fn valid_config()(
        max_split_size in prop::option::of(split_size()),
        max_non_split_rounding in split_size(),
        roundup_power2_divisions in divisions(),
        garbage_collection_threshold in prop_oneof![Just(0.0), fraction_below_one()],
        expandable_segments in any::<bool>(),
        per_process_memory_fraction in prop::option::of(prop_oneof![Just(1.0), fraction_below_one()]),
        backend in prop_oneof![Just(Backend::Native), Just(Backend::CudaMallocAsync)],
        bools in any::<[bool; 5]>(),
        threads_log2 in 0u32..=7,
        pinned_reserve_segment_size_mb in prop_oneof![Just(0usize), 1usize..1_000_000],
    ) -> AllocatorConfig {
        AllocatorConfig::builder()
            .max_split_size(max_split_size)
            .max_non_split_rounding(max_non_split_rounding)
            .roundup_power2_divisions(roundup_power2_divisions)
            .garbage_collection_threshold(garbage_collection_threshold)
            .expandable_segments(expandable_segments)
            .per_process_memory_fraction(per_process_memory_fraction)
            .backend(backend)
            .release_lock_on_cudamalloc(bools[0])
            .pinned_use_cuda_host_register(bools[1])
            .pinned_num_register_threads(1 << threads_log2)
            .pinned_reserve_segment_size_mb(pinned_reserve_segment_size_mb)
            .pinned_use_background_threads(bools[2])
            .graph_capture_record_stream_reuse(bools[3])
            .pinned_free_catch_all(bools[4])
            .build()
            .expect("every strategy gives a valid value")
    }
}

/// Strings made of the grammar's tokens, so that many of them parse or fail late.
fn grammar_string() -> impl Strategy<Value = String> {
    let keys: Vec<&'static str> = ALLOWED_KEYS.to_vec();
    let token = prop_oneof![
        4 => prop::sample::select(keys).prop_map(str::to_owned),
        6 => prop::sample::select(vec![",", ":", "[", "]", ">", " ", ":", ","]).prop_map(str::to_owned),
        2 => prop::sample::select(vec!["True", "False", "native", "cudaMallocAsync", "-1", "0", "1.0"])
            .prop_map(str::to_owned),
        3 => "[0-9]{1,25}",
        1 => "0\\.[0-9]{1,4}",
        1 => "[a-z_]{1,8}",
    ];
    prop::collection::vec(token, 0..24).prop_map(|tokens| tokens.concat())
}

/// A well-formed string: known keys with plausible (often invalid) values.
fn key_value_string() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        "[0-9]{1,6}",
        "0\\.[0-9]{1,3}",
        Just("True".to_owned()),
        Just("False".to_owned()),
        Just("cudaMallocAsync".to_owned()),
        prop::collection::vec(
            (
                prop_oneof!["[0-9]{1,5}", Just(">".to_owned())],
                "[0-9]{1,3}"
            )
                .prop_map(|(k, v)| format!("{k}:{v}")),
            0..5
        )
        .prop_map(|entries| format!("[{}]", entries.join(","))),
    ];
    let item =
        (prop::sample::select(ALLOWED_KEYS.to_vec()), value).prop_map(|(k, v)| format!("{k}:{v}"));
    prop::collection::vec(item, 0..6).prop_map(|items| items.join(","))
}

/// Whatever parses prints canonically and parses back to itself.
fn check_accepted(input: &str) -> Result<(), TestCaseError> {
    if let Ok(config) = AllocatorConfig::parse(input) {
        prop_assert_eq!(config.validate(), Ok(()));
        let canonical = config.to_string();
        prop_assert_eq!(
            AllocatorConfig::parse(&canonical),
            Ok(config.clone()),
            "{:?}",
            canonical
        );
        prop_assert_eq!(
            AllocatorConfig::parse(&canonical).unwrap().to_string(),
            canonical
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn display_parse_round_trip(config in valid_config()) {
        prop_assert_eq!(config.validate(), Ok(()));
        let text = config.to_string();
        prop_assert_eq!(AllocatorConfig::parse(&text), Ok(config), "{}", text);
    }

    #[test]
    fn settings_round_trip(config in valid_config()) {
        let settings = config.to_settings();
        prop_assert_eq!(AllocatorConfig::from_settings(&settings), Ok(config.clone()));

        // Through the fields alone, only what PyTorch's dict carries survives.
        let fields: Vec<(&str, SettingValue)> = settings
            .into_iter()
            .filter(|(k, _)| *k != "PYTORCH_CUDA_ALLOC_CONF")
            .collect();
        let expected = config
            .to_builder()
            .max_non_split_rounding(AllocatorConfig::default().max_non_split_rounding)
            .per_process_memory_fraction(None)
            .backend(Backend::Native)
            .pinned_reserve_segment_size_mb(0)
            .pinned_use_background_threads(false)
            .pinned_free_catch_all(false)
            .build()
            .unwrap();
        // Split sizes above i64::MAX saturate in the dict.
        if expected.max_split_size.is_none_or(|s| i64::try_from(s).is_ok()) {
            prop_assert_eq!(AllocatorConfig::from_settings(&fields), Ok(expected));
        }
    }

    #[test]
    fn parse_never_panics_on_any_string(input in ".*") {
        check_accepted(&input)?;
    }

    #[test]
    fn parse_never_panics_on_grammar_tokens(input in grammar_string()) {
        check_accepted(&input)?;
    }

    #[test]
    fn parse_key_value_strings(input in key_value_string()) {
        check_accepted(&input)?;
    }

    #[test]
    fn interval_index_is_floor_log2_minus_20(size in any::<usize>()) {
        let index = AllocatorConfig::roundup_power2_index(size);
        prop_assert!(index < 16);
        if (MIB..(32usize << 30)).contains(&size) {
            prop_assert!(MIB << index <= size && size < MIB << (index + 1));
        } else if size < MIB {
            prop_assert_eq!(index, 0);
        } else {
            prop_assert_eq!(index, 15);
        }
    }
}
