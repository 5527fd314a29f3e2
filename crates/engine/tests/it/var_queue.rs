//! The per-variable state machine on its own (`engine::var::VarQueue`), rule by rule.

use engine::var::{Grant, VarQueue};

type Q = VarQueue<&'static str, u32>;

fn runs(out: &mut Vec<Grant<&'static str, u32>>) -> Vec<&'static str> {
    out.drain(..)
        .filter_map(|g| match g {
            Grant::Run(op) => Some(op),
            Grant::Wake(_) => None,
        })
        .collect()
}

#[test]
fn reads_are_granted_together_and_a_write_waits_for_them() {
    let mut q = Q::new();
    let mut out = Vec::new();
    assert!(q.append_read(|| "r1"));
    assert!(q.append_read(|| "r2"));
    assert!(!q.append_write(|| "w"));
    assert!(
        !q.append_read(|| "r3"),
        "a read never overtakes a queued write"
    );
    assert_eq!((q.running_reads(), q.queued()), (2, 2));
    q.complete_read(&mut out);
    assert!(runs(&mut out).is_empty());
    q.complete_read(&mut out);
    assert_eq!(runs(&mut out), vec!["w"]);
    assert!(q.write_running());
    q.complete_write(&mut out);
    assert_eq!(runs(&mut out), vec!["r3"]);
    assert_eq!(q.version(), 1);
    q.complete_read(&mut out);
    assert!(q.is_idle());
}

#[test]
fn a_completed_write_grants_the_run_of_reads_up_to_the_next_write() {
    let mut q = Q::new();
    let mut out = Vec::new();
    assert!(q.append_write(|| "w1"));
    assert!(!q.append_write(|| "w2"));
    assert!(!q.append_read(|| "r1"));
    assert!(!q.append_read(|| "r2"));
    assert!(!q.append_write(|| "w3"));
    q.complete_write(&mut out);
    assert_eq!(
        runs(&mut out),
        vec!["w2"],
        "the next write, no read before it"
    );
    q.complete_write(&mut out);
    assert_eq!(
        runs(&mut out),
        vec!["r1", "r2"],
        "the reads up to w3, at once"
    );
    q.complete_read(&mut out);
    q.complete_read(&mut out);
    assert_eq!(runs(&mut out), vec!["w3"]);
    q.complete_write(&mut out);
    assert_eq!((q.version(), q.is_idle()), (3, true));
}

#[test]
fn waiters_need_no_worker_and_hold_nothing() {
    let mut q = Q::new();
    let mut out = Vec::new();
    assert!(
        q.append_wait_read(|| 1),
        "no write: wait_for_var returns at once"
    );
    assert!(q.append_read(|| "r"));
    assert!(
        q.append_wait_read(|| 2),
        "pending reads do not block wait_for_var"
    );
    assert!(
        !q.append_wait_write(|| 3),
        "wait_to_write waits for the read"
    );
    assert!(!q.append_write(|| "w"));
    assert!(!q.append_wait_read(|| 4));
    q.complete_read(&mut out);
    // The wait_to_write waiter is woken and holds nothing: the write is granted in the same step.
    assert_eq!(
        std::mem::take(&mut out),
        vec![Grant::Wake(3), Grant::Run("w")]
    );
    q.complete_write(&mut out);
    assert_eq!(std::mem::take(&mut out), vec![Grant::Wake(4)]);
    assert!(q.is_idle());
}

#[test]
#[should_panic(expected = "complete_write without a running write")]
fn completing_a_write_that_is_not_running_is_a_bug() {
    Q::new().complete_write(&mut Vec::new());
}
