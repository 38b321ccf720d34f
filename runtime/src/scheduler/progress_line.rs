//! The live progress line's text, written once for both hosts, and a plain
//! renderer of it for a host without a progress library (Python's).
//!
//! ```text
//! stages 1/3 · tasks 2 running, 5/12 done · 1.20 MiB published · 0 retries
//! ```
//!
//! The Rust host draws it with indicatif (a spinner before it, the elapsed
//! time after); [`TerminalLine`] redraws it in place with `\r`, the elapsed
//! time after it. Either shows nothing until a query has run
//! [`SHOW_AFTER`], so a quick query's answer is not preceded by a flash of
//! a line, and erases it when the tasks end.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::scheduler::options::{Progress, ProgressSnapshot};

/// How long a query runs before its line appears.
pub const SHOW_AFTER: Duration = Duration::from_secs(1);

/// How often [`TerminalLine`] redraws (its elapsed time) between events.
const TICK: Duration = Duration::from_millis(200);

impl ProgressSnapshot {
    /// The line's text for this snapshot.
    pub fn line(&self) -> String {
        format!(
            "stages {}/{} · tasks {} running, {}/{} done · {} published · {} retries",
            self.stages_done,
            self.stages,
            self.running,
            self.tasks_done,
            self.tasks,
            human_bytes(self.bytes),
            self.retries
        )
    }
}

/// The line's text for a run that sends no snapshot (tasks outside a
/// query's graph): `ended` of its `total` tasks done.
pub fn tasks_line(ended: usize, total: usize) -> String {
    format!("tasks {ended}/{total} done")
}

/// `bytes` in binary units: `512 B`, `1.50 KiB`, `3.00 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// `elapsed` as `hh:mm:ss`.
pub fn clock(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The progress line drawn in place on a terminal with `\r`, for a host
/// that has no progress library: after [`SHOW_AFTER`], redrawn as the run
/// changes and each [`TICK`] (its elapsed time), erased when the tasks end.
/// One query's line at a time; a new query starts a new one.
pub struct TerminalLine {
    state: Arc<Mutex<LineState>>,
}

struct LineState {
    /// Where the line is drawn (stderr).
    out: Box<dyn Write + Send>,
    /// Counts the queries begun, so a timer of an earlier query's never
    /// shows a later one's line.
    generation: u64,
    /// Whether the line is on the terminal now.
    shown: bool,
    /// The text as last told.
    text: String,
    /// The line as last drawn, so an unchanged one is not drawn again.
    drawn: String,
    /// When the query's tasks began.
    started: Instant,
    /// Tasks of the wave, and those ended, for a run that sends no
    /// snapshot.
    total: usize,
    ended: usize,
    /// Whether a snapshot came: then it alone says what the line shows.
    snapshots: bool,
}

/// Locked even if a thread panicked holding it: the state is only text.
fn lock(state: &Mutex<LineState>) -> MutexGuard<'_, LineState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl TerminalLine {
    /// A line drawn on `out` (the process's stderr, which the caller has
    /// found to be a terminal).
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            state: Arc::new(Mutex::new(LineState {
                out,
                generation: 0,
                shown: false,
                text: String::new(),
                drawn: String::new(),
                started: Instant::now(),
                total: 0,
                ended: 0,
                snapshots: false,
            })),
        }
    }
}

impl LineState {
    /// Draw the line over itself, unless it is drawn so already; a write
    /// error (a closed terminal) only loses the line.
    fn draw(&mut self) {
        let line = format!("\r{} [{}]\x1b[K", self.text, clock(self.started.elapsed()));
        if line != self.drawn {
            let _ = self.out.write_all(line.as_bytes());
            let _ = self.out.flush();
            self.drawn = line;
        }
    }

    /// The line's text is now `text`: redrawn if shown and changed.
    fn tell(&mut self, text: String) {
        if text != self.text {
            self.text = text;
            if self.shown {
                self.draw();
            }
        }
    }
}

impl Progress for TerminalLine {
    fn start(&self, total: usize) {
        let generation = {
            let mut state = lock(&self.state);
            state.generation += 1;
            (state.total, state.ended, state.snapshots) = (total, 0, false);
            state.text = tasks_line(0, total);
            state.started = Instant::now();
            state.generation
        };
        // A timer of its own, since a task of minutes sends no event in
        // between; it ends with its query, or with the line.
        let state = Arc::clone(&self.state);
        std::thread::spawn(move || {
            std::thread::sleep(SHOW_AFTER);
            loop {
                {
                    let mut state = lock(&state);
                    if state.generation != generation {
                        return;
                    }
                    state.shown = true;
                    state.draw();
                }
                if Arc::strong_count(&state) == 1 {
                    return;
                }
                std::thread::sleep(TICK);
            }
        });
    }

    fn task_done(&self) {
        let mut state = lock(&self.state);
        state.ended += 1;
        if !state.snapshots {
            let text = tasks_line(state.ended, state.total);
            state.tell(text);
        }
    }

    fn update(&self, now: &ProgressSnapshot) {
        let mut state = lock(&self.state);
        state.snapshots = true;
        state.tell(now.line());
    }

    fn finish(&self) {
        let mut state = lock(&self.state);
        // A later timer of this query finds another generation.
        state.generation += 1;
        if state.shown {
            state.shown = false;
            state.drawn.clear();
            let _ = state.out.write_all(b"\r\x1b[2K");
            let _ = state.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose bytes a test reads.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn snapshot(tasks_done: usize) -> ProgressSnapshot {
        ProgressSnapshot {
            stages: 3,
            stages_done: 1,
            tasks: 12,
            running: 2,
            tasks_done,
            bytes: 3 * 1024 * 1024,
            retries: 1,
        }
    }

    #[test]
    fn the_line_names_every_count_of_the_snapshot() {
        assert_eq!(
            snapshot(5).line(),
            "stages 1/3 · tasks 2 running, 5/12 done · 3.00 MiB published · 1 retries"
        );
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(clock(Duration::from_secs(3723)), "01:02:03");
    }

    #[test]
    fn a_quick_run_draws_nothing_and_a_long_one_its_line_then_erases_it() {
        let out = Shared::default();
        let line = TerminalLine::new(Box::new(out.clone()));
        line.start(12);
        line.update(&snapshot(5));
        line.finish();
        std::thread::sleep(SHOW_AFTER + TICK);
        assert_eq!(out.text(), "", "a quick run draws nothing");

        line.start(12);
        line.update(&snapshot(5));
        std::thread::sleep(SHOW_AFTER + TICK);
        line.update(&snapshot(6));
        line.finish();
        let drawn = out.text();
        assert!(
            drawn.starts_with(&format!("\r{} [00:00:01]\x1b[K", snapshot(5).line())),
            "{drawn:?}"
        );
        assert!(drawn.contains(&snapshot(6).line()), "{drawn:?}");
        assert!(drawn.ends_with("\r\x1b[2K"), "erased at the end: {drawn:?}");
        assert!(
            !drawn.contains('\n'),
            "one line, drawn over itself: {drawn:?}"
        );
    }
}
