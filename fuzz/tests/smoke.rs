//! A short run of every target, so CI exercises the harness and each
//! target's seeds: 20 000 inputs each (seeds included), fixed seed.

use dfx_fuzz::targets::{NAMES, by_name};
use dfx_fuzz::{Outcome, fuzz, run_one};

const INPUTS: u64 = 20_000;

#[test]
fn every_target_runs_twenty_thousand_inputs_without_a_crash() {
    for name in NAMES {
        let mut target = by_name(name).unwrap();
        let report = fuzz(target.as_mut(), INPUTS, 1);
        if let Some(crash) = &report.crash {
            panic!(
                "{name} crashed at input {}: {}\ninput: {:?}",
                crash.iteration, crash.message, crash.input
            );
        }
        assert_eq!(report.inputs, INPUTS, "{name}");
        // Mutants get past the first checks: the seeds alone would not count.
        assert!(
            report.accepted > target.seeds().len() as u64,
            "{name}: {report:?}"
        );
    }
}

#[test]
fn every_seed_is_accepted() {
    for name in NAMES {
        let mut target = by_name(name).unwrap();
        for (n, seed) in target.seeds().iter().enumerate() {
            assert_eq!(
                run_one(target.as_mut(), seed),
                Ok(Outcome::Accepted),
                "{name} seed {n}"
            );
        }
    }
}

#[test]
fn a_panic_is_a_crash_with_its_input() {
    struct Panics;
    impl dfx_fuzz::Target for Panics {
        fn name(&self) -> &'static str {
            "panics"
        }
        fn seeds(&self) -> Vec<Vec<u8>> {
            vec![b"ok".to_vec()]
        }
        fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
            if input.len() > 3 {
                panic!("too long: {}", input.len());
            }
            Ok(Outcome::Accepted)
        }
    }
    let report = fuzz(&mut Panics, 10_000, 5);
    let crash = report.crash.expect("a mutant longer than 3 bytes");
    assert!(crash.input.len() > 3);
    assert!(crash.message.contains("too long"), "{}", crash.message);
    assert!(crash.message.contains("smoke.rs"), "{}", crash.message);
    // The same seed finds the same input.
    let again = fuzz(&mut Panics, 10_000, 5).crash.unwrap();
    assert_eq!(
        (again.iteration, again.input),
        (crash.iteration, crash.input)
    );
}
