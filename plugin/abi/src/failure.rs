//! How a failed task may be retried: its failure class, decided by the
//! plugin where the error is made and carried to hosts as data.
//!
//! A host never reads an error message to decide whether to retry; it takes
//! the classes the plugin recorded for its shuffle location (the export
//! [`crate::DfxPlugin::take_failures`], [`crate::Plugin::take_failures`])
//! and picks the task's class from them with [`FailureClass::most_telling`].
//!
//! The JSON spelling, in a worker's report and across the boundary:
//!
//! ```text
//! "final"            FailureClass::Final
//! "io"               FailureClass::Io
//! {"lost": [2, 3]}   FailureClass::Lost([2, 3]): map 3 of stage 2
//! ```

use serde::{Deserialize, Serialize};

/// Words in every error of a failed write of shuffle storage (a full disk, a
/// dropped connection), for the person reading it. Hosts do not look for
/// them: the plugin records [`FailureClass::Io`] where it makes such an
/// error, and a host takes the class with [`crate::Plugin::take_failures`].
pub const IO_FAILURE: &str = "I/O failure";

/// How a failed task may be retried, decided where the failure was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureClass {
    /// Another attempt would fail the same way (the default for an error
    /// nobody classified: SQL, planning, schema, a function's error).
    Final,
    /// Shuffle storage failed under the task (full disk, dropped
    /// connection): retry.
    Io,
    /// The output of map `[stage, map]` is lost: run that map again, then
    /// this task.
    Lost([u64; 2]),
}

impl FailureClass {
    /// The class of a task whose failure recorded `recorded`, by this rule:
    ///
    /// | recorded | class | why |
    /// | --- | --- | --- |
    /// | any `Lost` | the first `Lost` | a missing input fails every attempt until its map runs again; [`FailureClass::lost_maps`] has them all |
    /// | `Io`, no `Lost` | `Io` | storage failed under the task; another attempt may succeed |
    /// | nothing, or only `Final` | `Final` | an error nobody classified recurs |
    ///
    /// ```
    /// use dfx_abi::FailureClass::{self, Final, Io, Lost};
    /// assert_eq!(FailureClass::most_telling(&[Io, Lost([2, 3])]), Lost([2, 3]));
    /// assert_eq!(FailureClass::most_telling(&[Final, Io]), Io);
    /// assert_eq!(FailureClass::most_telling(&[]), Final);
    /// ```
    pub fn most_telling(recorded: &[FailureClass]) -> FailureClass {
        let lost = recorded.iter().find(|c| matches!(c, FailureClass::Lost(_)));
        let io = recorded.iter().find(|c| matches!(c, FailureClass::Io));
        lost.or(io).copied().unwrap_or(FailureClass::Final)
    }

    /// Every map whose output `recorded` says is lost, as `(stage, map)`,
    /// each once, in the order first recorded: a map that many readers
    /// missed runs again once.
    ///
    /// ```
    /// use dfx_abi::FailureClass::{self, Io, Lost};
    /// let recorded = [Lost([2, 1]), Io, Lost([2, 0]), Lost([2, 1])];
    /// assert_eq!(FailureClass::lost_maps(&recorded), vec![(2, 1), (2, 0)]);
    /// ```
    pub fn lost_maps(recorded: &[FailureClass]) -> Vec<(u64, usize)> {
        let mut maps: Vec<(u64, usize)> = Vec::new();
        for class in recorded {
            if let FailureClass::Lost([stage, map]) = *class {
                let map = (stage, map as usize);
                if !maps.contains(&map) {
                    maps.push(map);
                }
            }
        }
        maps
    }
}

#[cfg(test)]
mod tests {
    use super::FailureClass::{self, Final, Io, Lost};

    #[test]
    fn each_class_has_one_json_spelling() {
        for (class, json) in [
            (Final, r#""final""#),
            (Io, r#""io""#),
            (Lost([2, 3]), r#"{"lost":[2,3]}"#),
        ] {
            assert_eq!(serde_json::to_string(&class).unwrap(), json);
            assert_eq!(serde_json::from_str::<FailureClass>(json).unwrap(), class);
        }
        let list = serde_json::to_string(&[Io, Lost([1, 0])]).unwrap();
        assert_eq!(list, r#"["io",{"lost":[1,0]}]"#);
        // Another spelling is an error, not a guess.
        for wrong in [r#""Final""#, r#""lost""#, r#"{"lost":[2]}"#, r#""retry""#] {
            assert!(
                serde_json::from_str::<FailureClass>(wrong).is_err(),
                "{wrong} parsed"
            );
        }
    }

    #[test]
    fn lost_output_tells_more_than_io_which_tells_more_than_final() {
        assert_eq!(FailureClass::most_telling(&[]), Final);
        assert_eq!(FailureClass::most_telling(&[Final]), Final);
        assert_eq!(FailureClass::most_telling(&[Final, Io, Final]), Io);
        assert_eq!(
            FailureClass::most_telling(&[Io, Lost([4, 1]), Final, Lost([4, 0])]),
            Lost([4, 1])
        );
    }

    #[test]
    fn a_lost_map_is_listed_once_however_often_it_was_recorded() {
        assert!(FailureClass::lost_maps(&[Final, Io]).is_empty());
        assert_eq!(
            FailureClass::lost_maps(&[Lost([3, 2]), Lost([1, 0]), Io, Lost([3, 2])]),
            vec![(3, 2), (1, 0)]
        );
    }
}
