//! The defects a new user found (issue 15), each pinned by a test: sizes in PyTorch's
//! adaptive format, one legend entry per curve, the default named `default` in JSON as in
//! text, clear messages for a negative size and a device too small for a parity replay.

use crate::support;

use crate::support::{
    Format, HUGE_SEG, Scratch, stderr, success, synthetic_pickle, synthetic_value, tensormem,
};
use tensormem_pickle::Value;

fn synthetic_dir() -> Scratch {
    let dir = Scratch::new("defects");
    dir.write("synthetic.pickle", &synthetic_pickle(Format::MODERN));
    dir
}

/// A size in GiB with two decimals ("0.06 GiB") never appears: small figures print in the
/// unit PyTorch's OOM message would use.
#[test]
fn sizes_are_adaptive_everywhere_in_text() {
    let dir = synthetic_dir();
    for args in [
        &["replay", "synthetic.pickle"][..],
        &["replay", "synthetic.pickle", "--from-empty", "--sweep"],
        &["replay", "synthetic.pickle", "--top", "3"],
        &["advise", "synthetic.pickle"],
        &["explain", "synthetic.pickle"],
    ] {
        let text = success(&tensormem(dir.path(), args));
        assert!(!text.contains(" 0.0"), "{args:?}:\n{text}");
        assert!(!text.contains("0.00 GiB"), "{args:?}:\n{text}");
    }
    let o = tensormem(
        dir.path(),
        &[
            "replay",
            "synthetic.pickle",
            "--from-empty",
            "--device-memory",
            "1KiB",
        ],
    );
    // Nothing fits 1 KiB: the report prints, and the exit status says our replay ran out.
    assert_eq!(o.status.code(), Some(1));
    let text = support::stdout(&o);
    assert!(
        text.contains("device memory 1024 bytes"),
        "a 1 KiB device prints as PyTorch prints it:\n{text}"
    );
    let text = success(&tensormem(dir.path(), &["replay", "synthetic.pickle"]));
    assert!(
        text.contains("peak reserved:                    ours 62.00 MiB, recorded 62.00 MiB"),
        "{text}"
    );
}

/// The legend names each curve once: a from-empty replay under a swept configuration is that
/// sweep row, and a parity replay is labelled as such.
#[test]
fn plot_legend_lists_each_curve_once() {
    let dir = synthetic_dir();
    for (extra, main_label) in [
        (&["--from-empty"][..], None),
        (&[][..], Some("default (parity): reserved")),
    ] {
        let mut args = vec!["replay", "synthetic.pickle", "--sweep", "--plot", "out.svg"];
        args.extend(extra);
        success(&tensormem(dir.path(), &args));
        let svg = std::fs::read_to_string(dir.path().join("out.svg")).expect("written");
        for label in [
            "default: reserved",
            "default: allocated",
            "expandable_segments:True: reserved",
        ] {
            assert_eq!(svg.matches(label).count(), 1, "{label} in {extra:?}");
        }
        if let Some(l) = main_label {
            assert_eq!(svg.matches(l).count(), 1);
        }
        // Small figures are drawn in MiB, not as fractions of a GiB.
        assert!(svg.contains(">\nMiB\n<"), "the y axis unit");
    }
}

#[test]
fn a_negative_size_is_named_as_such() {
    let dir = synthetic_dir();
    let o = tensormem(
        dir.path(),
        &["replay", "synthetic.pickle", "--device-memory=-5"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "tensormem: error: --device-memory: invalid size '-5': a size cannot be negative (expected e.g. 40GiB)\n"
    );
}

/// A parity replay on a device smaller than the segments that existed before the history
/// began names the option, the size needed, and the way out.
#[test]
fn parity_on_a_too_small_device_names_the_option_and_the_size() {
    // The synthetic snapshot without the `segment_alloc` of its 40 MiB segment: that segment
    // existed before the history began.
    let v = synthetic_value(Format::MODERN);
    let pairs: Vec<(Value, Value)> = v
        .as_dict()
        .expect("a dict")
        .iter()
        .map(|(k, val)| {
            if k.as_str() != Some("device_traces") {
                return (k.clone(), val.clone());
            }
            let trace: Vec<Value> = val.as_list().expect("list")[0]
                .as_list()
                .expect("list")
                .iter()
                .filter(|e| {
                    !(e.get("action").and_then(Value::as_str) == Some("segment_alloc")
                        && e.get("addr").and_then(Value::as_i64) == Some(HUGE_SEG))
                })
                .cloned()
                .collect();
            (k.clone(), Value::list(vec![Value::list(trace)]))
        })
        .collect();
    let dir = Scratch::new("too-small");
    dir.write(
        "started.pickle",
        &tensormem_pickle::encode(&Value::dict(pairs)),
    );
    let o = tensormem(
        dir.path(),
        &["replay", "started.pickle", "--device-memory", "16MiB"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "tensormem: error: --device-memory 16.00 MiB: too small for the segments that existed \
         before the history began (40.00 MiB); use at least 40.00 MiB, or --from-empty to place \
         their blocks with our own decisions (--history-only leaves them out)\n"
    );
}
