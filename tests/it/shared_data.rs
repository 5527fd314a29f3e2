//! The shared data folder is laid out as INDEX.md files describe (skips without `../shared`).

use integration_tests::shared_data_dir;

#[test]
fn shared_snapshots_and_dtr_logs_are_present() {
    let Some(dir) = shared_data_dir() else { return };
    let snapshots: Vec<_> = std::fs::read_dir(dir.join("snapshots"))
        .expect("snapshots folder")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "pickle"))
        .collect();
    assert!(
        snapshots.len() >= 9,
        "expected at least 9 snapshot pickles, found {}",
        snapshots.len()
    );
    let logs = std::fs::read_dir(dir.join("dtr-logs"))
        .expect("dtr-logs folder")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .count();
    assert_eq!(logs, 5, "the DTR paper's five operator logs");
}
