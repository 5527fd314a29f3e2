//! `oracle-diff`: differential tests of tensormem's caching allocator against PyTorch's real
//! one (torch-oracle). `cargo xtask oracle` runs `oracle-diff fuzz`.

use std::path::PathBuf;
use std::process::ExitCode;

use c10_cuda::rules::{Rules, TorchVersion};
use clap::{Parser, Subcommand};

use oracle_diff::check::Outcome;
use oracle_diff::fixtures::{self, Case};
use oracle_diff::fuzz::{self, Campaign};
use oracle_diff::generate::{self, Shape};
use oracle_diff::oracle::Oracle;
use oracle_diff::script::Script;
use oracle_diff::{driver, trace};

/// `println!` that ignores a closed stdout (`oracle-diff gen | head`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` that ignores a closed stdout.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

#[derive(Parser)]
#[command(
    name = "oracle-diff",
    about = "Differential tests of tensormem's caching allocator against PyTorch's real one (torch-oracle)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run random scripts through the oracle and through us, and compare every decision.
    /// The last line sums up; the exit status is 1 on any divergence that is not one of our
    /// deliberate fixes.
    Fuzz {
        /// torch version(s): 2.7.1, 2.15.0, or all.
        #[arg(long, default_value = "all")]
        torch: String,
        /// Scripts per version.
        #[arg(long, default_value_t = 1000)]
        cases: u64,
        /// Generator seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Index of the first case (to split a campaign).
        #[arg(long, default_value_t = 0)]
        first_case: u64,
        /// Worker threads (default: the machine's cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Fewest ops per script.
        #[arg(long, default_value_t = 200)]
        min_ops: usize,
        /// Most ops per script.
        #[arg(long, default_value_t = 400)]
        max_ops: usize,
        /// Diverging scripts to shrink and print.
        #[arg(long, default_value_t = 3)]
        shrink: usize,
    },
    /// Print our output (the oracle's JSON lines) for a script.
    Run {
        /// The script (`-` for stdin).
        script: PathBuf,
        /// torch version whose rules to follow.
        #[arg(long, default_value = "2.15")]
        torch: String,
        /// PyTorch's behaviour exactly (no deliberate fixes).
        #[arg(long)]
        exact: bool,
    },
    /// Run one script through the oracle and us; print the outcome (and shrink a divergence).
    Diff {
        /// The script (`-` for stdin).
        script: PathBuf,
        /// torch version.
        #[arg(long, default_value = "2.15.0")]
        torch: String,
        /// Shrink a divergence and print the smallest script.
        #[arg(long)]
        shrink: bool,
    },
    /// Print the canonical text of the oracle's output (or ours) for a script: what is compared.
    Render {
        /// The script (`-` for stdin).
        script: PathBuf,
        /// torch version.
        #[arg(long, default_value = "2.15.0")]
        torch: String,
        /// Our output instead of the oracle's.
        #[arg(long)]
        ours: bool,
        /// With --ours: PyTorch's behaviour exactly (no deliberate fixes).
        #[arg(long)]
        exact: bool,
    },
    /// Print the generated script of one case.
    Gen {
        /// Generator seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Case index.
        #[arg(long, default_value_t = 0)]
        case: u64,
        /// torch version.
        #[arg(long, default_value = "2.15.0")]
        torch: String,
        /// Fewest ops.
        #[arg(long, default_value_t = 200)]
        min_ops: usize,
        /// Most ops.
        #[arg(long, default_value_t = 400)]
        max_ops: usize,
    },
    /// Write a fixture file: generated scripts (and the given probe scripts) with the oracle's
    /// decisions. Only scripts we agree on (or differ on by a deliberate fix) are written.
    Fixtures {
        /// torch version.
        #[arg(long)]
        torch: String,
        /// Generated scripts.
        #[arg(long, default_value_t = 300)]
        cases: u64,
        /// Generator seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Fewest ops.
        #[arg(long, default_value_t = 40)]
        min_ops: usize,
        /// Most ops.
        #[arg(long, default_value_t = 120)]
        max_ops: usize,
        /// Probe scripts to add (named by their file stem).
        #[arg(long)]
        probe: Vec<PathBuf>,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Check fixture files against our allocator (what CI runs).
    CheckFixtures {
        /// Fixture files (`torch-VERSION.fixtures`).
        files: Vec<PathBuf>,
    },
}

fn versions(arg: &str) -> Result<Vec<TorchVersion>, String> {
    if arg == "all" {
        return Ok(TorchVersion::ALL.to_vec());
    }
    arg.split(',')
        .map(|v| v.parse::<TorchVersion>().map_err(|e| e.to_string()))
        .collect()
}

fn read_script(path: &PathBuf) -> Result<Script, String> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| e.to_string())?
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let script = Script::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    oracle_diff::api::check(&script).map_err(|e| {
        format!(
            "{}: not a script a PyTorch program can produce: {e}",
            path.display()
        )
    })?;
    Ok(script)
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("oracle-diff: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.cmd {
        Cmd::Fuzz {
            torch,
            cases,
            seed,
            first_case,
            jobs,
            min_ops,
            max_ops,
            shrink,
        } => {
            let jobs = jobs.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
            });
            let mut failed = false;
            let mut summaries = Vec::new();
            for version in versions(&torch)? {
                let c = Campaign {
                    version,
                    cases,
                    first_case,
                    seed,
                    jobs,
                    shape: Shape { min_ops, max_ops },
                    shrink_at_most: shrink,
                    shrink_budget: 3000,
                    progress: true,
                };
                eprintln!(
                    "oracle-diff: torch {}: {cases} scripts of {min_ops}-{max_ops} ops, seed {seed}, {jobs} jobs",
                    version.checked_release()
                );
                let r = fuzz::run(&c).map_err(|e| e.to_string())?;
                for f in &r.found {
                    say!(
                        "DIVERGENCE torch {} case {} {}\nshrunk to {} ops ({}):\n{}",
                        version.checked_release(),
                        f.case,
                        f.divergence,
                        f.shrunk.ops.len(),
                        f.shrunk_divergence,
                        f.shrunk
                    );
                }
                if let Some(e) = &r.first_oracle_failure {
                    say!("first oracle failure: {e}");
                }
                failed |= r.diverging > 0 || r.oracle_failures > 0;
                summaries.push((r.summary(version), r));
            }
            for (s, _) in &summaries {
                say!("{s}");
            }
            if summaries.len() > 1 {
                let sum =
                    |f: fn(&fuzz::Report) -> u64| summaries.iter().map(|(_, r)| f(r)).sum::<u64>();
                say!(
                    "oracle, all versions: {} cases, {} ops, {} agreeing, {} deliberate differences, {} divergences, {} oracle failures",
                    sum(|r| r.cases),
                    sum(|r| r.ops),
                    sum(|r| r.agreeing),
                    sum(|r| r.deliberate_cases),
                    sum(|r| r.diverging),
                    sum(|r| r.oracle_failures)
                );
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Cmd::Run {
            script,
            torch,
            exact,
        } => {
            let version: TorchVersion = torch.parse().map_err(|e| format!("{e}"))?;
            let rules = if exact {
                Rules::pytorch_exact(version)
            } else {
                Rules::new(version)
            };
            let lines = driver::run(&read_script(&script)?, rules).map_err(|e| e.to_string())?;
            say_raw!("{}", trace::to_jsonl(&lines));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Diff {
            script,
            torch,
            shrink,
        } => {
            let version: TorchVersion = torch.parse().map_err(|e| format!("{e}"))?;
            let oracle = Oracle::find(version).map_err(|e| e.to_string())?;
            let s = read_script(&script)?;
            match fuzz::check_script(&oracle, &s).map_err(|e| e.to_string())? {
                None => say!("both refuse the script"),
                Some(Outcome::Agree) => say!("agree"),
                Some(Outcome::Deliberate(names)) => {
                    say!("deliberate difference: {}", names.join(", "));
                }
                Some(Outcome::PytorchDefect(name)) => {
                    let what = oracle_diff::check::PYTORCH_DEFECTS
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map_or("", |(_, w)| *w);
                    say!("PyTorch defect {name}: {what}");
                }
                Some(Outcome::Diverge(d)) => {
                    say!("DIVERGENCE {d}");
                    if shrink {
                        let (small, d2) = fuzz::shrink_divergence(&oracle, &s, &d, 5000);
                        say!("shrunk to {} ops ({d2}):\n{small}", small.ops.len());
                    }
                    return Ok(ExitCode::FAILURE);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Render {
            script,
            torch,
            ours,
            exact,
        } => {
            let version: TorchVersion = torch.parse().map_err(|e| format!("{e}"))?;
            let s = read_script(&script)?;
            let lines = if ours {
                let rules = if exact {
                    Rules::pytorch_exact(version)
                } else {
                    Rules::new(version)
                };
                driver::run(&s, rules).map_err(|e| e.to_string())?
            } else {
                let oracle = Oracle::find(version).map_err(|e| e.to_string())?;
                oracle.run(&s).map_err(|e| e.to_string())?
            };
            say_raw!(
                "{}",
                fixtures::render(&lines, oracle_diff::compare::order_sensitive(&s))
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Gen {
            seed,
            case,
            torch,
            min_ops,
            max_ops,
        } => {
            let version: TorchVersion = torch.parse().map_err(|e| format!("{e}"))?;
            say_raw!(
                "{}",
                generate::script(seed, case, version, Shape { min_ops, max_ops })
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Fixtures {
            torch,
            cases,
            seed,
            min_ops,
            max_ops,
            probe,
            out,
        } => {
            let version: TorchVersion = torch.parse().map_err(|e| format!("{e}"))?;
            let oracle = Oracle::find(version).map_err(|e| e.to_string())?;
            let mut scripts: Vec<(String, Script)> = Vec::new();
            for p in &probe {
                let name = p
                    .file_stem()
                    .map_or("probe".into(), |s| s.to_string_lossy().into_owned());
                scripts.push((name, read_script(p)?));
            }
            for case in 0..cases {
                let s = generate::script(seed, case, version, Shape { min_ops, max_ops });
                scripts.push((format!("seed{seed}-{case}"), s));
            }
            let mut kept = Vec::new();
            let (mut skipped, mut deliberate, mut defects) = (0, 0, 0);
            for (name, s) in scripts {
                let theirs = match oracle.run(&s) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("skipping {name}: {e}");
                        skipped += 1;
                        continue;
                    }
                };
                let with_fixes = match oracle_diff::check::classify(&s, &theirs, version) {
                    Ok(Outcome::Agree) => true,
                    Ok(Outcome::Deliberate(_)) => {
                        deliberate += 1;
                        false
                    }
                    Ok(Outcome::Diverge(d)) => {
                        // Not a fixture: PyTorch went on with a pool it had erased.
                        let erased = driver::run_noting(&s, Rules::new(version))
                            .ok()
                            .and_then(|(_, n)| n.erased_pool_with_live_blocks);
                        if erased.is_some_and(|at| d.step + 1 >= at) {
                            eprintln!(
                                "leaving out {name}: PyTorch defect erased-pool-with-live-blocks"
                            );
                            defects += 1;
                        } else {
                            eprintln!("skipping {name}: diverges {d}");
                            skipped += 1;
                        }
                        continue;
                    }
                    Ok(Outcome::PytorchDefect(n)) => {
                        eprintln!("leaving out {name}: PyTorch defect {n}");
                        defects += 1;
                        continue;
                    }
                    Err(e) => {
                        eprintln!("skipping {name}: {e}");
                        skipped += 1;
                        continue;
                    }
                };
                let expect = fixtures::render(&theirs, oracle_diff::compare::order_sensitive(&s));
                kept.push(Case {
                    name,
                    with_fixes,
                    script: s,
                    expect,
                });
            }
            let text = fixtures::to_text(&kept);
            let bytes = fixtures::compress(&text);
            std::fs::write(&out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
            say!(
                "{}: {} cases ({deliberate} with a deliberate difference, {defects} left out for a PyTorch defect, {skipped} skipped), {} bytes ({} uncompressed)",
                out.display(),
                kept.len(),
                bytes.len(),
                text.len()
            );
            Ok(if skipped > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Cmd::CheckFixtures { files } => {
            let mut failures = 0;
            for f in &files {
                let bytes = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
                let version = fixture_version(f)?;
                let cases =
                    fixtures::decompress(&bytes).map_err(|e| format!("{}: {e}", f.display()))?;
                let mut bad = 0;
                for c in &cases {
                    if let Err(e) = fixtures::check_case(c, version) {
                        bad += 1;
                        if bad <= 3 {
                            say!("{e}");
                        }
                    }
                }
                say!("{}: {} cases, {bad} differ", f.display(), cases.len());
                failures += bad;
            }
            Ok(if failures > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// The torch version in a fixture file's name (`torch-2.15.0.fixtures`).
fn fixture_version(path: &std::path::Path) -> Result<TorchVersion, String> {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem.strip_prefix("torch-")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            format!(
                "{}: a fixture file is named torch-VERSION.fixtures",
                path.display()
            )
        })
}
