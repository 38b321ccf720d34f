//! Fuzzing dfx's parsers on stable Rust, without libFuzzer.
//!
//! There is no nightly toolchain here, so no `cargo fuzz`: this crate is a
//! small, deterministic, seedable mutational fuzzer instead. Each target
//! starts from a seed corpus of *real* inputs (payloads the plugin's codec
//! encoded, map files and markers its writer published, envelopes and
//! reports drivers and workers exchange), mutates them (bit flips, byte sets, interesting
//! integers, truncation, splicing, insertion, deletion, dictionary tokens) and
//! runs each input under `catch_unwind`. An input that panics, or breaks the
//! target's stated property, is a crash: it is written to a file and the run
//! exits non-zero.
//!
//! Reproduce a run (the same seed gives the same inputs, in the same order):
//!
//! ```text
//! cargo run --release -p dfx-fuzz -- --target all --iterations 2000000 --seed 1
//! cargo run --release -p dfx-fuzz -- --target bucket --replay fuzz/crashes/bucket-1-123.bin
//! ```
//!
//! Every crash found becomes a file under `fuzz/regressions/<target>/`,
//! replayed by `cargo test -p dfx-fuzz` (see `tests/regressions.rs`); a
//! smoke run of every target is a test too (`tests/smoke.rs`).
//!
//! Without coverage feedback the mutator keeps, as further material, inputs
//! a target *accepted* after mutation (they reached past the first checks),
//! up to a bound: a cheap stand-in for libFuzzer's corpus growth.

pub mod mutate;
pub mod targets;

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, PanicHookInfo, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use mutate::{Mutator, Rng};

/// What running one input found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The target accepted the input (parsed it, read it).
    Accepted,
    /// The target refused it with a proper error.
    Refused,
}

/// A fuzz target: real seeds, and one run per input.
pub trait Target {
    /// The target's name on the command line and in file names.
    fn name(&self) -> &'static str;

    /// Valid inputs to start from.
    fn seeds(&self) -> Vec<Vec<u8>>;

    /// Tokens worth inserting (JSON punctuation, magic numbers).
    fn dictionary(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }

    /// Run one input.
    ///
    /// # Errors
    ///
    /// A broken property of the target (an error that does not name dfx, a
    /// round trip that differs, a panic the plugin's guard caught): a crash.
    fn run(&mut self, input: &[u8]) -> Result<Outcome, String>;
}

/// An input that crashed a target, and why.
#[derive(Debug, Clone)]
pub struct Crash {
    /// The target.
    pub target: &'static str,
    /// The input.
    pub input: Vec<u8>,
    /// The panic message (with its location) or the broken property.
    pub message: String,
    /// Which input of the run it was (0-based).
    pub iteration: u64,
}

/// What a run of one target did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target.
    pub target: &'static str,
    /// Inputs run (seeds included).
    pub inputs: u64,
    /// Inputs the target accepted.
    pub accepted: u64,
    /// The corpus size at the end (seeds plus kept inputs).
    pub corpus: usize,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
    /// The first crash, which ended the run.
    pub crash: Option<Crash>,
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    static IN_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static HOOK: Once = Once::new();

/// Record panics of a target's run for the report instead of printing them:
/// a crash is reported once, with its input file, by [`run_one`]'s caller.
/// A panic anywhere else (a failed assertion in a test of the harness) goes
/// to the hook that was there before, so it is still printed.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if !IN_TARGET.with(std::cell::Cell::get) {
                previous(info);
                return;
            }
            let payload = info.payload();
            let mut message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            if let Some(location) = info.location() {
                message = format!("{message} (at {location})");
            }
            LAST_PANIC.with(|last| *last.borrow_mut() = Some(message));
        }));
    });
}

/// Run one input under `catch_unwind`.
///
/// # Errors
///
/// The panic's message, or the property the target reports broken.
pub fn run_one(target: &mut dyn Target, input: &[u8]) -> Result<Outcome, String> {
    install_hook();
    IN_TARGET.with(|flag| flag.set(true));
    let outcome = catch_unwind(AssertUnwindSafe(|| target.run(input)));
    IN_TARGET.with(|flag| flag.set(false));
    match outcome {
        Ok(result) => result,
        Err(_) => Err(format!(
            "panicked: {}",
            LAST_PANIC
                .with(|last| last.borrow_mut().take())
                .unwrap_or_else(|| "(no message)".to_string())
        )),
    }
}

/// Most inputs kept beside the seeds.
const MAX_KEPT: usize = 512;

/// Run `iterations` inputs through `target`: first every seed, then
/// mutations of the corpus, drawn from a generator seeded with `seed`.
/// Stops at the first crash.
pub fn fuzz(target: &mut dyn Target, iterations: u64, seed: u64) -> Report {
    fuzz_keeping_last(target, iterations, seed, None)
}

/// [`fuzz`], writing each input to `keep_last` before running it: a crash
/// that aborts the process (a failed allocation cannot be caught) leaves
/// its input there. Slower; for reproducing such a crash.
pub fn fuzz_keeping_last(
    target: &mut dyn Target,
    iterations: u64,
    seed: u64,
    keep_last: Option<&Path>,
) -> Report {
    let start = Instant::now();
    let name = target.name();
    let mut rng = Rng::new(seed ^ fnv(name));
    let mut corpus = target.seeds();
    assert!(!corpus.is_empty(), "target {name} has no seed");
    let mutator = Mutator::new(target.dictionary());
    let base = corpus.len();
    let mut accepted = 0;
    let mut crash = None;
    let mut inputs = 0;
    while inputs < iterations {
        let iteration = inputs;
        inputs += 1;
        let input = match corpus.get(iteration as usize) {
            Some(seed_input) if (iteration as usize) < base => seed_input.clone(),
            _ => mutator.mutate(&mut rng, &corpus),
        };
        if let Some(path) = keep_last
            && let Err(e) = std::fs::write(path, &input)
        {
            panic!("cannot write the input to {}: {e}", path.display());
        }
        match run_one(target, &input) {
            Ok(Outcome::Accepted) => {
                accepted += 1;
                if iteration as usize >= base {
                    keep(&mut corpus, base, input, &mut rng);
                }
            }
            Ok(Outcome::Refused) => {}
            Err(message) => {
                crash = Some(Crash {
                    target: name,
                    input,
                    message,
                    iteration,
                });
                break;
            }
        }
    }
    Report {
        target: name,
        inputs,
        accepted,
        corpus: corpus.len(),
        elapsed: start.elapsed(),
        crash,
    }
}

/// Keep an accepted mutant: append while there is room, else replace a
/// random kept one (never a seed).
fn keep(corpus: &mut Vec<Vec<u8>>, base: usize, input: Vec<u8>, rng: &mut Rng) {
    if corpus.len() < base + MAX_KEPT {
        corpus.push(input);
    } else {
        let slot = base + rng.below(MAX_KEPT as u64) as usize;
        corpus[slot] = input;
    }
}

/// FNV-1a of a name: each target draws its own sequence from one seed.
fn fnv(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Write `crash`'s input into `dir` as `<target>-<seed>-<iteration>.bin`.
///
/// # Errors
///
/// When the directory or the file cannot be written.
pub fn save_crash(dir: &Path, crash: &Crash, seed: u64) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-{seed}-{}.bin", crash.target, crash.iteration));
    std::fs::write(&path, &crash.input)?;
    Ok(path)
}

/// The directory of regression inputs of `target` (`fuzz/regressions/<target>`).
pub fn regressions_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target)
}
