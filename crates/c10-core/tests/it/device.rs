//! `Device` / `DeviceType` parsing and printing: round trips, error cases, and a property test.

use c10_core::{Device, DeviceType, Error};
use proptest::prelude::*;
use rstest::rstest;

#[rstest]
#[case::cpu("cpu", Device::cpu())]
#[case::cpu_0("cpu:0", Device::new(DeviceType::Cpu, Some(0)))]
#[case::cuda("cuda", Device::new(DeviceType::Cuda, None))]
#[case::cuda_0("cuda:0", Device::cuda(0))]
#[case::cuda_7("cuda:7", Device::cuda(7))]
#[case::cuda_10("cuda:10", Device::cuda(10))]
#[case::cuda_255("cuda:255", Device::cuda(255))]
#[case::sim_1("sim:1", Device::sim(1))]
#[case::meta("meta", Device::meta())]
fn parse_and_print(#[case] text: &str, #[case] device: Device) {
    assert_eq!(text.parse::<Device>().unwrap(), device);
    assert_eq!(device.to_string(), text);
}

#[rstest]
#[case::empty("", "device string must not be empty")]
#[case::unknown_type("gpu", "unknown device type (expected cpu, cuda, meta or sim)")]
#[case::upper_case("CUDA:0", "unknown device type (expected cpu, cuda, meta or sim)")]
#[case::no_type(":0", "unknown device type (expected cpu, cuda, meta or sim)")]
#[case::missing_index("cuda:", "expected a device index after ':'")]
#[case::negative_index("cuda:-1", "device index must be a non-negative decimal integer")]
#[case::letter_index("cuda:x", "device index must be a non-negative decimal integer")]
#[case::plus_sign("cuda:+1", "device index must be a non-negative decimal integer")]
#[case::space("cuda: 1", "device index must be a non-negative decimal integer")]
#[case::two_colons("cuda:0:1", "expected at most one ':' (type:index)")]
#[case::leading_zero("cuda:01", "device index must not have leading zeros")]
#[case::overflow("cpu:256", "device index out of range (expected 0..=255)")]
#[case::huge(
    "cuda:99999999999999999999",
    "device index out of range (expected 0..=255)"
)]
fn parse_errors(#[case] text: &str, #[case] reason: &str) {
    let err = text.parse::<Device>().unwrap_err();
    match &err {
        Error::InvalidDevice { input, reason: got } => {
            assert_eq!(input, text);
            assert_eq!(*got, reason);
        }
        other => panic!("expected InvalidDevice, got {other:?}"),
    }
    // The message names the string.
    assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
}

#[test]
fn predicates_and_accessors() {
    let cuda = Device::cuda(3);
    assert!(cuda.is_cuda() && !cuda.is_cpu());
    assert_eq!(cuda.device_type(), DeviceType::Cuda);
    assert_eq!(cuda.index(), Some(3));
    assert!(cuda.has_index());
    let cpu = Device::cpu();
    assert!(cpu.is_cpu() && !cpu.is_cuda());
    assert_eq!(cpu.index(), None);
    assert!(!cpu.has_index());
    assert_eq!(
        Device::from(DeviceType::Sim),
        Device::new(DeviceType::Sim, None)
    );
}

#[test]
fn device_type_names() {
    let names: Vec<String> = DeviceType::ALL.iter().map(ToString::to_string).collect();
    assert_eq!(names, ["cpu", "cuda", "meta", "sim"]);
    for device_type in DeviceType::ALL {
        assert_eq!(
            device_type.name().parse::<DeviceType>().unwrap(),
            device_type
        );
    }
    assert!("gpu".parse::<DeviceType>().is_err());
}

fn any_device() -> impl Strategy<Value = Device> {
    (
        prop::sample::select(DeviceType::ALL.to_vec()),
        prop::option::of(any::<u8>()),
    )
        .prop_map(|(device_type, index)| Device::new(device_type, index))
}

proptest! {
    // Few cases: the suite also runs under valgrind. PROPTEST_CASES overrides this.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64)
    ))]

    #[test]
    fn display_then_parse_round_trips(device in any_device()) {
        let text = device.to_string();
        prop_assert_eq!(text.parse::<Device>().unwrap(), device);
    }

    #[test]
    fn arbitrary_strings_never_panic(text in ".{0,12}") {
        if let Ok(device) = text.parse::<Device>() {
            prop_assert_eq!(device.to_string(), text);
        }
    }
}
