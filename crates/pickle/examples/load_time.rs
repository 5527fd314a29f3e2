//! Times decoding each file named on the command line (best of N runs), in release mode:
//! `cargo run --release -p tensormem-pickle --example load_time -- FILE... [-n N]`.

use std::time::Instant;

fn main() {
    let mut files = Vec::new();
    let mut runs = 20;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "-n" {
            runs = args.next().and_then(|n| n.parse().ok()).unwrap_or(runs);
        } else {
            files.push(arg);
        }
    }
    for file in files {
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{file}: {e}");
                continue;
            }
        };
        let mut best = f64::INFINITY;
        for _ in 0..runs {
            // Timed like CPython's `pickle.loads(data)` as a statement: decode and drop.
            let start = Instant::now();
            let value = tensormem_pickle::decode(&bytes);
            drop(value);
            let elapsed = start.elapsed().as_secs_f64();
            best = best.min(elapsed);
        }
        let ok = tensormem_pickle::decode(&bytes).is_ok();
        println!("{file}\t{:.3} ms\tok={ok}", best * 1e3);
    }
}
