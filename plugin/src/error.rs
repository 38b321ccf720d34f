//! How the plugin's errors are spelled and classed.
//!
//! **One prefix per area.** Every error the plugin makes itself starts
//! with the prefix of the area that made it ([`Area::prefix`], the one
//! table of them), then says what was expected against what was found:
//! `dfx codec: payload version 3 is not supported; ...`. A message is for
//! people; nothing decides on its text.
//!
//! **The failure ledger.** The class of each failure the exchange makes is
//! kept per shuffle location until a host takes it (the export
//! `take_failures`):
//!
//! ```text
//! reader: a map's file is missing ──record(location, Lost([S, M]))──┐
//! writer: storage fails under it  ──record(location, Io)────────────┤
//!                                                                   ▼
//!                          ledger: (canonical location, class), oldest first
//!                                                                   │
//! host: take_failures(location) ◄── the location's entries, removed ┘
//! ```
//!
//! The class is decided where the error is made, beside its message (which
//! stays as detailed as ever, for people); a host never reads the message to
//! decide whether to retry. An error nobody recorded is final.
//!
//! Locations compare as [`canonical_location`] spells them: `/q`, `/q/` and
//! `file:///q` are one location, `s3://b/p/` is `s3://b/p`.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use datafusion::common::DataFusionError;
use dfx_abi::{FailureClass, IO_FAILURE};

use dfx_abi::location::canonical_location;

/// The part of the plugin an error comes from, which names its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// The physical codec and the payload frame.
    Codec,
    /// The body of a join filter's payload.
    JoinFilterCodec,
    /// The logical codec of in-memory tables.
    InMemoryTable,
    /// A scan cut for one map.
    MapScan,
    /// A setting of the `dfx_engine` namespace.
    Config,
    /// A stage's reader.
    Reader,
    /// A filter that crosses stages.
    JoinFilter,
    /// The adaptive step's request and answer.
    Adapt,
}

impl Area {
    /// The prefix of every error of this area: the one table of them.
    pub const fn prefix(self) -> &'static str {
        match self {
            Area::Codec => "dfx codec",
            Area::JoinFilterCodec => "dfx codec: join filter",
            Area::InMemoryTable => "dfx in-memory table",
            Area::MapScan => "dfx MapScanExec",
            Area::Config => "dfx config",
            Area::Reader => "dfx reader",
            Area::JoinFilter => "dfx join filter",
            Area::Adapt => "dfx adaptive",
        }
    }
}

/// An execution error of `area`: its prefix, then `what`.
pub fn fail(area: Area, what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("{}: {what}", area.prefix()))
}

/// Entries the ledger keeps at most. Past it the oldest is dropped: a host
/// that never takes its failures (one that predates the export) must not
/// make the process grow without end, and a task's failures are taken as
/// soon as it ends, so the newest are the ones still wanted.
pub const MAX_ENTRIES: usize = 4096;

/// Classes recorded per location, oldest first.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: VecDeque<(String, FailureClass)>,
}

impl Ledger {
    /// An empty ledger.
    pub const fn new() -> Self {
        Self {
            entries: VecDeque::new(),
        }
    }

    /// Record `class` for `location`. An entry already recorded and not yet
    /// taken is not recorded again: a reader of many partitions that each
    /// miss one map records it once.
    pub fn record(&mut self, location: &str, class: FailureClass) {
        let location = canonical_location(location);
        if self
            .entries
            .iter()
            .any(|(at, recorded)| *at == location && *recorded == class)
        {
            return;
        }
        while self.entries.len() >= MAX_ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back((location, class));
    }

    /// The classes recorded for `location`, oldest first, removed from the
    /// ledger; the other locations' stay.
    pub fn take(&mut self, location: &str) -> Vec<FailureClass> {
        let location = canonical_location(location);
        let mut taken = Vec::new();
        self.entries.retain(|(at, class)| {
            let ours = *at == location;
            if ours {
                taken.push(*class);
            }
            !ours
        });
        taken
    }

    /// Entries held, every location's.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The process's ledger: every node of every stage records into it.
static LEDGER: Mutex<Ledger> = Mutex::new(Ledger::new());

/// Run `f` on the process's ledger. A thread that panicked while holding it
/// left the entries whole (each change is one push or one retain), so a
/// poisoned lock is used as it is: recording a failure must never fail.
fn with_ledger<T>(f: impl FnOnce(&mut Ledger) -> T) -> T {
    let mut ledger = LEDGER.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut ledger)
}

/// Record `class` for the shuffle location `location` (see [`Ledger::record`]).
pub fn record(location: &Path, class: FailureClass) {
    with_ledger(|ledger| ledger.record(&location.to_string_lossy(), class));
}

/// The classes recorded for `location` since they were last taken (see
/// [`Ledger::take`]).
pub fn take(location: &str) -> Vec<FailureClass> {
    with_ledger(|ledger| ledger.take(location))
}

/// The message of a failure of shuffle storage under `location` (a full
/// disk, a dropped connection): [`IO_FAILURE`], then `what`. Records
/// [`FailureClass::Io`] for `location`: another attempt may succeed.
pub fn io_failure(location: &Path, what: impl std::fmt::Display) -> String {
    record(location, FailureClass::Io);
    format!("{IO_FAILURE}: {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfx_abi::FailureClass::{Io, Lost};

    #[test]
    fn a_take_returns_its_locations_entries_once() {
        let mut ledger = Ledger::new();
        ledger.record("/q", Lost([2, 1]));
        ledger.record("/other", Io);
        ledger.record("/q", Io);
        assert_eq!(ledger.take("/q"), vec![Lost([2, 1]), Io]);
        assert!(ledger.take("/q").is_empty());
        assert_eq!(ledger.take("/other"), vec![Io]);
        assert!(ledger.is_empty());
    }

    #[test]
    fn one_location_has_one_spelling() {
        let mut ledger = Ledger::new();
        ledger.record("/tmp/q/", Io);
        assert_eq!(ledger.take("file:///tmp/q"), vec![Io]);
        ledger.record("s3://b/p", Lost([1, 0]));
        assert!(ledger.take("s3://b/q").is_empty());
        assert_eq!(ledger.take("s3://b/p/"), vec![Lost([1, 0])]);
    }

    #[test]
    fn an_entry_not_yet_taken_is_recorded_once() {
        let mut ledger = Ledger::new();
        for _ in 0..3 {
            ledger.record("/q", Lost([2, 0]));
        }
        ledger.record("/q/", Lost([2, 0]));
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger.take("/q"), vec![Lost([2, 0])]);
    }

    #[test]
    fn past_its_bound_the_ledger_drops_the_oldest() {
        let mut ledger = Ledger::new();
        for map in 0..MAX_ENTRIES as u64 + 10 {
            ledger.record("/q", Lost([1, map]));
        }
        assert_eq!(ledger.len(), MAX_ENTRIES);
        let kept = ledger.take("/q");
        assert_eq!(kept.first(), Some(&Lost([1, 10])));
        assert_eq!(kept.last(), Some(&Lost([1, MAX_ENTRIES as u64 + 9])));
    }

    #[test]
    fn a_poisoned_ledger_still_records_and_takes() {
        let location = "/failures-unit-test/poisoned";
        let _ = std::thread::spawn(|| {
            with_ledger(|_| panic!("a recorder panicked while holding the ledger"))
        })
        .join();
        record(Path::new(location), Io);
        assert_eq!(take(location), vec![Io]);
    }
}
