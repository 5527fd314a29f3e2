//! The corpus of operator logs recorded from real PyTorch models by `tensormem.record`
//! (`corpus/*.log.gz`): every log parses with the reader `tensormem dtr` uses, says what its
//! `TIME` holds, has a forward and a backward, and runs without a budget; the table of their
//! no-eviction figures is a snapshot (a change of the recorder or of the reader shows there).

use crate::support;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use checkpoint::log::{self, Event};
use checkpoint::sim;

#[test]
fn every_corpus_log_parses_and_runs() {
    let logs = support::corpus_logs();
    let architectures: BTreeSet<&str> = logs
        .iter()
        .map(|(n, _)| n.rsplit_once('-').map_or(n.as_str(), |(a, _)| a))
        .collect();
    assert!(
        architectures.len() >= 15,
        "{} architectures: {architectures:?}",
        architectures.len()
    );
    let mut table = String::from(
        "| log | calls | mutates | constants | releases | peak bytes | compute | cost |\n",
    );
    let mut total_bytes = 0u64;
    for (name, path) in &logs {
        total_bytes += std::fs::metadata(path).unwrap().len();
        let lg = log::parse_file(path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let count = |f: fn(&Event) -> bool| lg.events.iter().filter(|e| f(&e.event)).count();
        let annotations: Vec<&str> = lg
            .events
            .iter()
            .filter_map(|e| match &e.event {
                Event::Annotate(a) => Some(a.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(annotations[0], "START", "{name}");
        assert!(annotations.contains(&"BACKWARD"), "{name}");
        let cost = lg
            .cost_annotation()
            .unwrap_or_else(|| panic!("{name}: no COST"));
        assert!(cost.starts_with("roofline "), "{name}: {cost}");
        let base = sim::baseline(&lg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(base.peak_bytes > 0 && base.compute_ns > 0, "{name}");
        let calls = count(|e| matches!(e, Event::Call { .. }));
        assert!(calls > 100, "{name}: {calls} calls");
        let _ = writeln!(
            table,
            "| {name} | {calls} | {} | {} | {} | {} | {} | {} |",
            count(|e| matches!(e, Event::Mutate { .. })),
            count(|e| matches!(e, Event::Constant { .. })),
            count(|e| matches!(e, Event::Release { .. })),
            base.peak_bytes,
            base.compute_ns,
            cost.split_whitespace().next().unwrap_or("")
        );
    }
    // Small enough to keep in the repository.
    assert!(total_bytes < 4 << 20, "the corpus is {total_bytes} bytes");
    insta::assert_snapshot!(table);
}
