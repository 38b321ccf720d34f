//! Speculation: a second attempt for a task running well past its stage's
//! median, on a slot nothing else is waiting for.
//!
//! ```text
//! stage S: map 0 ▇▇ 2 s   map 1 ▇▇ 2 s   map 2 ▇▇▇▇▇▇▇▇▇▇ still running at 2 × median
//!                                         └─ a free slot, nothing ready ─► map 2, attempt 1
//! the first attempt to publish wins; the other is stopped (its worker killed)
//! ```
//!
//! Both attempts write the same map file. Publishing never replaces a map
//! file (the plugin's writer links it into place, or creates the S3 object
//! only if it is absent), so the first attempt to finish is the one every
//! reader sees, and an attempt that finishes second discards its own output.
//! A map's output is the same whichever attempt made it: a task runs one
//! partition of a deterministic plan.

use std::time::Duration;

/// When a running task earns a speculative attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speculation {
    /// A task running longer than this many times its stage's median
    /// (over the stage's finished tasks) is a straggler.
    pub factor: f64,
    /// No task younger than this is a straggler, whatever the median: a
    /// second worker costs more than waiting a little for a short task.
    pub min_elapsed: Duration,
}

impl Speculation {
    /// The factor when a host sets none: twice the median.
    pub const DEFAULT_FACTOR: f64 = 2.0;
    /// The youngest a straggler may be when a host sets none.
    pub const DEFAULT_MIN_ELAPSED: Duration = Duration::from_secs(1);

    /// Speculation after `factor` times the stage's median, at the default
    /// minimum age.
    ///
    /// # Errors
    ///
    /// A factor that is not a finite number above 1: at or below 1, every
    /// task slower than the median would run twice.
    pub fn after(factor: f64) -> Result<Self, String> {
        if !factor.is_finite() || factor <= 1.0 {
            return Err(format!(
                "the speculation factor must be a number above 1 (a task is speculated once it \
                 runs that many times its stage's median), got {factor}"
            ));
        }
        Ok(Self {
            factor,
            min_elapsed: Self::DEFAULT_MIN_ELAPSED,
        })
    }
}

impl Default for Speculation {
    fn default() -> Self {
        Self {
            factor: Self::DEFAULT_FACTOR,
            min_elapsed: Self::DEFAULT_MIN_ELAPSED,
        }
    }
}

/// A running task, as speculation weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Running {
    /// The task's position in the query's task list.
    pub index: usize,
    /// How long it has run.
    pub elapsed: Duration,
    /// The median time of its stage's finished tasks; `None` while fewer
    /// than half of them have finished (too few to call anything slow).
    pub median: Option<Duration>,
}

/// The task most worth a speculative attempt among `running` (those not
/// speculated yet), if any is a straggler: the one furthest past its
/// stage's median.
pub(crate) fn straggler(policy: &Speculation, running: &[Running]) -> Option<usize> {
    running
        .iter()
        .filter_map(|task| {
            let median = task.median?;
            let limit = median.mul_f64(policy.factor).max(policy.min_elapsed);
            (task.elapsed > limit).then(|| {
                let ratio = task.elapsed.as_secs_f64() / median.as_secs_f64().max(1e-6);
                (ratio, task.index)
            })
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, index)| index)
}

/// The median of a stage's finished task times, once at least half of its
/// `maps` have finished (and at least one).
pub(crate) fn stage_median(finished: &[Duration], maps: usize) -> Option<Duration> {
    if finished.is_empty() || finished.len() * 2 < maps {
        return None;
    }
    let mut sorted = finished.to_vec();
    sorted.sort_unstable();
    Some(sorted[sorted.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_factor_at_or_below_one_is_refused() {
        for factor in [1.0, 0.5, 0.0, -2.0, f64::NAN, f64::INFINITY] {
            let err = Speculation::after(factor).unwrap_err();
            assert!(err.contains("above 1"), "{factor}: {err}");
        }
        assert_eq!(Speculation::after(3.0).unwrap().factor, 3.0);
    }

    #[test]
    fn the_median_waits_for_half_of_the_stage() {
        assert_eq!(stage_median(&[], 4), None);
        assert_eq!(stage_median(&[secs(1.0)], 4), None);
        assert_eq!(stage_median(&[secs(3.0), secs(1.0)], 4), Some(secs(3.0)));
        assert_eq!(
            stage_median(&[secs(5.0), secs(1.0), secs(2.0)], 3),
            Some(secs(2.0))
        );
    }

    #[test]
    fn a_straggler_is_past_the_factor_and_the_minimum_age() {
        let policy = Speculation::after(2.0).unwrap();
        let task = |index: usize, elapsed: f64, median: Option<f64>| Running {
            index,
            elapsed: secs(elapsed),
            median: median.map(secs),
        };
        // Past 2 × 2 s: yes. Not yet, or no median: no.
        assert_eq!(straggler(&policy, &[task(0, 4.5, Some(2.0))]), Some(0));
        assert_eq!(straggler(&policy, &[task(0, 3.5, Some(2.0))]), None);
        assert_eq!(straggler(&policy, &[task(0, 60.0, None)]), None);
        // A short stage: 2 × 0.1 s is under the minimum age of 1 s.
        assert_eq!(straggler(&policy, &[task(0, 0.5, Some(0.1))]), None);
        assert_eq!(straggler(&policy, &[task(0, 1.5, Some(0.1))]), Some(0));
        // The one furthest past its own median.
        let both = [task(0, 9.0, Some(4.0)), task(1, 3.0, Some(1.0))];
        assert_eq!(straggler(&policy, &both), Some(1));
    }
}
