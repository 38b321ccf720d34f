//! Every input under `regressions/<target>/` once crashed its target; each
//! must now be accepted or refused with a proper error.
//!
//! Add one by copying a crash file there (`fuzz/crashes/<target>-...bin`)
//! once the bug is fixed, and say in `regressions/README.md` what it found.

use dfx_fuzz::targets::{NAMES, by_name};
use dfx_fuzz::{regressions_dir, run_one};

#[test]
fn every_regression_input_is_handled_without_a_crash() {
    let mut replayed = 0;
    let mut crashes = Vec::new();
    for name in NAMES {
        let dir = regressions_dir(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        let mut target = by_name(name).unwrap();
        for file in files {
            let input = std::fs::read(&file).unwrap();
            if let Err(message) = run_one(target.as_mut(), &input) {
                crashes.push(format!("{}: {message}", file.display()));
            }
            replayed += 1;
        }
    }
    assert!(crashes.is_empty(), "{}", crashes.join("\n"));
    // The three inputs the first runs found (see regressions/README.md).
    assert!(replayed >= 3, "only {replayed} regression input(s) found");
}
