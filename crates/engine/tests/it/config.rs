//! Engine selection by configuration and by `TENSORMEM_ENGINE_TYPE` (as MXNET_ENGINE_TYPE),
//! and the four standard workloads' checksums.

use engine::workloads::Workload;
use engine::{EngineConfig, EngineKind};

fn lookup(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |key| {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn engine_type_names_follow_mxnet() {
    for (text, kind) in [
        ("NaiveEngine", EngineKind::Naive),
        ("ThreadedEngine", EngineKind::Pooled),
        ("ThreadedEnginePooled", EngineKind::Pooled),
        ("ThreadedEnginePerDevice", EngineKind::PerDevice),
        ("naive", EngineKind::Naive),
        ("per-device", EngineKind::PerDevice),
    ] {
        let config = EngineConfig::from_lookup(lookup(Box::leak(Box::new([(
            "TENSORMEM_ENGINE_TYPE",
            text,
        )]))))
        .unwrap();
        assert_eq!(config.kind, kind, "{text}");
        assert_eq!(config.build().unwrap().kind(), kind);
    }
    assert_eq!(
        EngineConfig::from_lookup(|_| None).unwrap().kind,
        EngineKind::PerDevice
    );
}

#[test]
fn bad_settings_are_named_in_the_error() {
    let err = EngineConfig::from_lookup(lookup(&[("TENSORMEM_ENGINE_TYPE", "Turbo")])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid engine configuration: TENSORMEM_ENGINE_TYPE=\"Turbo\": expected NaiveEngine, ThreadedEngine or ThreadedEnginePerDevice"
    );
    let err =
        EngineConfig::from_lookup(lookup(&[("TENSORMEM_CPU_WORKER_NTHREADS", "two")])).unwrap_err();
    assert!(
        err.to_string()
            .contains("TENSORMEM_CPU_WORKER_NTHREADS=\"two\""),
        "{err}"
    );
    let err =
        EngineConfig::from_lookup(lookup(&[("TENSORMEM_CPU_WORKER_NTHREADS", "0")])).unwrap_err();
    assert!(err.to_string().contains("at least one worker"), "{err}");
    let c = EngineConfig::from_lookup(lookup(&[
        ("TENSORMEM_CPU_WORKER_NTHREADS", "3"),
        ("TENSORMEM_ENGINE_BULK_SIZE", "15"),
    ]))
    .unwrap();
    assert_eq!((c.cpu_workers, c.bulk_size), (3, 15));
    assert_eq!(c.build().unwrap().bulk_size(), 15);
}

#[test]
fn the_four_workloads_match_the_issue_checksums() {
    for (name, sum) in engine::workloads::CHECKSUMS {
        let w = Workload::by_name(name).unwrap();
        assert_eq!(w.checksum(), sum, "{name}");
    }
    assert_eq!(Workload::w1().len(), 100_000);
    assert_eq!(Workload::w4().len(), 65_000);
    let w3 = Workload::w3();
    assert!(
        w3.tasks()
            .all(|t| (2..=19).contains(&t.reads.len()) && !t.reads.contains(&t.write.unwrap()))
    );
    assert_eq!(w3.prefix(10).len(), 10);
}
