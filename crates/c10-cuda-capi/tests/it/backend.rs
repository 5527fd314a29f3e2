//! Choosing the backend from the environment (`TENSORMEM_ALLOC_BACKEND`,
//! `TENSORMEM_SIM_MEMORY`, `TENSORMEM_SIM_DEVICES`, `PYTORCH_CUDA_ALLOC_CONF`), and the
//! messages when it cannot start.

use c10_cuda::device::StreamId;
use c10_cuda_driver::probe;
use rstest::rstest;
use tensormem_alloc::backend::{Front, from_env, parse_size};

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

fn start(vars: &[(&str, &str)]) -> Result<Box<dyn Front>, String> {
    from_env(env(vars))
}

#[rstest]
#[case::bytes("1073741824", 1 << 30)]
#[case::gib("80GiB", 80 << 30)]
#[case::g("2G", 2 << 30)]
#[case::mb_means_mib("512MB", 512 << 20)]
#[case::kib_with_space(" 64 KiB ", 64 << 10)]
#[case::tib("1TiB", 1 << 40)]
fn sizes(#[case] text: &str, #[case] bytes: usize) {
    assert_eq!(parse_size(text), Ok(bytes));
}

#[rstest]
#[case::empty("", "expected a byte count such as 80GiB or 1073741824")]
#[case::unit_only("GiB", "expected a byte count such as 80GiB or 1073741824")]
#[case::unknown_unit("12 parsecs", "unknown unit \"parsecs\" (B, KiB, MiB, GiB or TiB)")]
#[case::zero("0GiB", "a device needs more than 0 bytes")]
#[case::overflow("99999999999TiB", "too large")]
fn bad_sizes(#[case] text: &str, #[case] message: &str) {
    assert_eq!(parse_size(text), Err(message.to_string()));
}

#[rstest]
#[case::unknown_backend(
    &[("TENSORMEM_ALLOC_BACKEND", "tpu")],
    "TENSORMEM_ALLOC_BACKEND=\"tpu\": expected \"sim\" or \"cuda\""
)]
#[case::bad_memory(
    &[("TENSORMEM_ALLOC_BACKEND", "sim"), ("TENSORMEM_SIM_MEMORY", "lots")],
    "TENSORMEM_SIM_MEMORY=\"lots\": expected a byte count such as 80GiB or 1073741824"
)]
#[case::no_devices(
    &[("TENSORMEM_ALLOC_BACKEND", "sim"), ("TENSORMEM_SIM_DEVICES", "0")],
    "TENSORMEM_SIM_DEVICES=\"0\": expected a device count from 1 to 255"
)]
fn settings_that_cannot_start(#[case] vars: &[(&str, &str)], #[case] message: &str) {
    assert_eq!(start(vars).err().as_deref(), Some(message));
}

#[test]
fn a_bad_alloc_conf_names_the_variable_and_the_key() {
    let err = start(&[
        ("TENSORMEM_ALLOC_BACKEND", "sim"),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:3"),
    ])
    .err()
    .unwrap();
    assert!(
        err.starts_with("the allocator configuration from the environment: ")
            && err.contains("max_split_size_mb"),
        "{err}"
    );
}

/// Simulated devices: the count and the capacity asked for, and the configuration from
/// `PYTORCH_CUDA_ALLOC_CONF`.
#[test]
fn simulated_devices_from_the_environment() {
    let front = start(&[
        ("TENSORMEM_ALLOC_BACKEND", "sim"),
        ("TENSORMEM_SIM_MEMORY", "1GiB"),
        ("TENSORMEM_SIM_DEVICES", "2"),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
    ])
    .unwrap();
    let p = front.malloc(1, 900 << 20, StreamId::DEFAULT).unwrap();
    assert!(
        front.malloc(1, 900 << 20, StreamId::DEFAULT).is_err(),
        "1 GiB each"
    );
    assert!(
        front.malloc(2, 1 << 20, StreamId::DEFAULT).is_err(),
        "2 devices"
    );
    let stats = front.memory_stats(1).unwrap();
    assert_eq!(stats["max_split_size"], 64 << 20);
    assert_eq!(stats["num_ooms"], 1);
    front.free(p).unwrap();
}

/// Without `TENSORMEM_ALLOC_BACKEND` the backend is CUDA: on a machine without a GPU the message
/// says what was found and how to use the simulated device instead.
#[test]
fn cuda_is_the_default_backend() {
    let found = probe();
    match start(&[]) {
        Ok(_) => assert!(found.is_available(), "started without a GPU"),
        Err(message) => {
            assert!(!found.is_available());
            assert_eq!(
                message,
                format!(
                    "no usable CUDA device ({found}); set TENSORMEM_ALLOC_BACKEND=sim for a \
                     simulated one"
                )
            );
        }
    }
}
