//! The live progress line a query shows on a terminal while its tasks run:
//! one line on stderr, drawn by indicatif once the query has run about a
//! second (a quick query shows nothing), and cleared when its tasks end.
//!
//! ```text
//! ⠙ stages 1/3 · tasks 2 running, 5/12 done · 1.2 MiB published · 0 retries [00:00:03]
//! ```
//!
//! It is told by the runtime's scheduler ([`Progress`]): every count comes
//! from the scheduler's [`ProgressSnapshot`], never from a message, and its
//! text is the runtime's ([`ProgressSnapshot::line`]), the one Python's
//! line shows too.

use std::io::IsTerminal as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use dfx_runtime::scheduler::SHOW_AFTER;
use dfx_runtime::scheduler::progress_line::tasks_line;
use dfx_runtime::scheduler::{Progress, ProgressSnapshot};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the line redraws (its spinner and elapsed time) between
/// events.
const TICK: Duration = Duration::from_millis(120);

/// The live line, for a scheduler's options: `None` unless `wanted` and
/// stderr is a terminal (a log file or a pipe gets nothing of it).
pub fn live_line(wanted: bool) -> Option<Arc<dyn Progress>> {
    (wanted && std::io::stderr().is_terminal())
        .then(|| Arc::new(LiveLine::default()) as Arc<dyn Progress>)
}

/// One query's line at a time; a new query (a shell's next) starts a new
/// one.
#[derive(Default)]
pub struct LiveLine {
    state: Arc<Mutex<LineState>>,
}

#[derive(Default)]
struct LineState {
    /// Counts the queries begun, so a timer of an earlier query's never
    /// shows a later one's line early.
    generation: u64,
    /// The bar of the query running now: hidden until [`SHOW_AFTER`].
    bar: Option<ProgressBar>,
    /// The text of the line as last told.
    message: String,
    /// Tasks of the wave, and those ended, for a run that sends no
    /// snapshot (tasks outside a query's graph).
    total: usize,
    ended: usize,
    /// Whether a snapshot came: then it alone says what the line shows.
    snapshots: bool,
}

/// Locked even if a thread panicked holding it: the state is only text.
fn lock(state: &Mutex<LineState>) -> MutexGuard<'_, LineState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Progress for LiveLine {
    fn start(&self, total: usize) {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]") {
            bar.set_style(style);
        }
        let generation = {
            let mut state = lock(&self.state);
            state.generation += 1;
            (state.total, state.ended, state.snapshots) = (total, 0, false);
            state.message = tasks_line(0, total);
            bar.set_message(state.message.clone());
            state.bar = Some(bar);
            state.generation
        };
        // Shown only once the query has run a while: a timer of its own,
        // since a task of minutes sends no event in between.
        let state = Arc::clone(&self.state);
        std::thread::spawn(move || {
            std::thread::sleep(SHOW_AFTER);
            let state = lock(&state);
            if state.generation != generation {
                return;
            }
            if let Some(bar) = &state.bar {
                bar.set_draw_target(ProgressDrawTarget::stderr());
                bar.enable_steady_tick(TICK);
            }
        });
    }

    fn task_done(&self) {
        let mut state = lock(&self.state);
        state.ended += 1;
        if !state.snapshots {
            let message = tasks_line(state.ended, state.total);
            if let Some(bar) = &state.bar {
                bar.set_message(message.clone());
            }
            state.message = message;
        }
    }

    fn update(&self, now: &ProgressSnapshot) {
        let mut state = lock(&self.state);
        state.snapshots = true;
        let message = now.line();
        if message != state.message {
            if let Some(bar) = &state.bar {
                bar.set_message(message.clone());
            }
            state.message = message;
        }
    }

    fn finish(&self) {
        let mut state = lock(&self.state);
        // A later timer of this query finds another generation, or no bar.
        state.generation += 1;
        if let Some(bar) = state.bar.take() {
            bar.finish_and_clear();
        }
    }
}
