//! `dfx-fuzz`: run the fuzz targets (see the crate's documentation).
//!
//! ```text
//! dfx-fuzz [--target NAME|all] [--iterations N] [--seed S] [--crash-dir DIR]
//! dfx-fuzz --target NAME --replay FILE...
//! dfx-fuzz [--target NAME|all] --dump-seeds DIR
//! ```
//!
//! `--keep-last FILE` writes each input to FILE before running it, so a
//! crash that aborts the process (a failed allocation) leaves its input.
//!
//! `--iterations` counts inputs per target (seeds included). Exits 1 with
//! the crashing input written to the crash directory (default
//! `fuzz/crashes/`), 2 on a usage error.

use std::path::PathBuf;
use std::process::ExitCode;

use dfx_fuzz::targets::{NAMES, by_name};
use dfx_fuzz::{Outcome, fuzz_keeping_last, run_one, save_crash};

struct Args {
    targets: Vec<String>,
    iterations: u64,
    seed: u64,
    crash_dir: PathBuf,
    replay: Vec<PathBuf>,
    keep_last: Option<PathBuf>,
    dump_seeds: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        targets: NAMES.iter().map(|n| n.to_string()).collect(),
        iterations: 100_000,
        seed: 1,
        crash_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crashes"),
        replay: Vec::new(),
        keep_last: None,
        dump_seeds: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--target" => {
                let name = value()?;
                args.targets = if name == "all" {
                    NAMES.iter().map(|n| n.to_string()).collect()
                } else {
                    vec![name]
                };
            }
            "--iterations" => {
                let v = value()?;
                args.iterations = v
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("--iterations {v}: {e}"))?;
            }
            "--seed" => {
                let v = value()?;
                args.seed = v.parse().map_err(|e| format!("--seed {v}: {e}"))?;
            }
            "--crash-dir" => args.crash_dir = PathBuf::from(value()?),
            "--keep-last" => args.keep_last = Some(PathBuf::from(value()?)),
            "--dump-seeds" => args.dump_seeds = Some(PathBuf::from(value()?)),
            "--replay" => {
                args.replay.push(PathBuf::from(value()?));
                args.replay.extend(it.by_ref().map(PathBuf::from));
            }
            "-h" | "--help" => {
                return Err(format!(
                    "usage: dfx-fuzz [--target NAME|all] [--iterations N] [--seed S] \
                     [--crash-dir DIR] [--keep-last FILE]\n       \
                     dfx-fuzz --target NAME --replay FILE...\n       \
                     dfx-fuzz [--target NAME|all] --dump-seeds DIR\n\
                     targets: {}",
                    NAMES.join(", ")
                ));
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if !args.replay.is_empty() {
        return replay(&args);
    }
    if let Some(dir) = &args.dump_seeds {
        return dump_seeds(&args.targets, dir);
    }
    let (mut total, mut seconds) = (0u64, 0f64);
    for name in &args.targets {
        let mut target = match by_name(name) {
            Ok(target) => target,
            Err(message) => {
                eprintln!("{message}");
                return ExitCode::from(2);
            }
        };
        let report = fuzz_keeping_last(
            target.as_mut(),
            args.iterations,
            args.seed,
            args.keep_last.as_deref(),
        );
        let secs = report.elapsed.as_secs_f64();
        total += report.inputs;
        seconds += secs;
        println!(
            "{:<14} {:>11} inputs ({} accepted, corpus {}) in {:.1} s, {:.0} inputs/s",
            report.target,
            report.inputs,
            report.accepted,
            report.corpus,
            secs,
            report.inputs as f64 / secs.max(1e-9)
        );
        if let Some(crash) = &report.crash {
            eprintln!(
                "CRASH in {} at input {} (seed {}): {}",
                crash.target, crash.iteration, args.seed, crash.message
            );
            match save_crash(&args.crash_dir, crash, args.seed) {
                Ok(path) => eprintln!(
                    "input written to {}\nreplay: cargo run --release -p dfx-fuzz -- --target {} \
                     --replay {}",
                    path.display(),
                    crash.target,
                    path.display()
                ),
                Err(e) => eprintln!("cannot write the input: {e}"),
            }
            return ExitCode::FAILURE;
        }
    }
    println!(
        "total          {total:>11} inputs in {seconds:.1} s (seed {}, no crash)",
        args.seed
    );
    ExitCode::SUCCESS
}

fn replay(args: &Args) -> ExitCode {
    let [name] = args.targets.as_slice() else {
        eprintln!("--replay needs one --target");
        return ExitCode::from(2);
    };
    let mut target = match by_name(name) {
        Ok(target) => target,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for file in &args.replay {
        let input = match std::fs::read(file) {
            Ok(input) => input,
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                return ExitCode::from(2);
            }
        };
        match run_one(target.as_mut(), &input) {
            Ok(Outcome::Accepted) => println!("{}: accepted", file.display()),
            Ok(Outcome::Refused) => println!("{}: refused with a proper error", file.display()),
            Err(message) => {
                println!("{}: CRASH: {message}", file.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Write every seed of `targets` to `<dir>/<target>/seed-<n>.bin`.
fn dump_seeds(targets: &[String], dir: &std::path::Path) -> ExitCode {
    for name in targets {
        let target = match by_name(name) {
            Ok(target) => target,
            Err(message) => {
                eprintln!("{message}");
                return ExitCode::from(2);
            }
        };
        let out = dir.join(name);
        for (n, seed) in target.seeds().iter().enumerate() {
            let path = out.join(format!("seed-{n}.bin"));
            if let Err(e) = std::fs::create_dir_all(&out).and_then(|()| std::fs::write(&path, seed))
            {
                eprintln!("{}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            println!("{}", path.display());
        }
    }
    ExitCode::SUCCESS
}
