//! Panics stop at the plugin's edge: every path by which a host calls into
//! dfx's code catches them and hands back a DataFusion error instead.
//!
//! Why this module exists: `datafusion-ffi` calls into the plugin through
//! `extern "C"` functions (`execute`, a stream's `poll_next`, a UDF's
//! `invoke_with_args`, an accumulator's `update_batch`, a codec's
//! `try_decode`, a planner's `create_physical_plan`, ...), and does not catch
//! unwinds in them. A panic that reaches such a function cannot unwind
//! through it, so Rust aborts the process: the `dfx` worker, the driver, or
//! the Python interpreter dies with its whole session. The plugin therefore
//! catches every panic in its own code before it gets there, at these doors:
//!
//! | door | how it is guarded |
//! | --- | --- |
//! | `ExecutionPlan::execute` of `ShuffleWriterExec` / `ShuffleReaderExec` | [`catch`] around the body |
//! | every poll of the streams they return | [`GuardedStream`]: DataFusion operators of the stage run inside our stream's poll, so their panics are caught here too |
//! | the scalar UDFs' `invoke_with_args` / `return_type` | [`catch`] around the body |
//! | the aggregate UDF's accumulators | [`GuardedAccumulator`] around every method |
//! | the physical codec's `try_encode` / `try_decode` | [`catch`] around the body |
//! | the query planner (which runs the split rule) | [`GuardedQueryPlanner`]: every poll of its future |
//! | the root module's constructors, config included | [`catch`] (see `export.rs`) |
//! | Arrow's IPC decoder on a segment of a map file | [`catch_decoder`]: a corrupt file, reported naming it |
//!
//! A caught panic becomes `dfx plugin panicked in <where>: <message> (at
//! <file>:<line>)`: the message is never swallowed, and it names dfx so a user
//! knows whose bug it is. It is an `Execution` error rather than `Internal`,
//! whose text asks users to report a bug to DataFusion: the bug is dfx's.
//!
//! The panic hook: Rust prints every panic to stderr (`thread '...' panicked
//! at ...`) before unwinding; the error then says it again. Inside a guarded
//! region the plugin's hook records the message and its location for the
//! error instead of printing it, so the panic is reported once, by whoever
//! reports the error. Outside a guarded region (or on another thread, such as
//! a task the stage spawned) the hook that was installed before ours runs
//! unchanged.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo, catch_unwind};
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll};

use async_trait::async_trait;
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::logical_expr::{Accumulator, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use futures::Stream;

/// The stable prefix of every caught panic's message.
pub const PANIC_PREFIX: &str = "dfx plugin panicked in";

thread_local! {
    /// How many guarded regions this thread is inside.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The message and location of the last panic inside a guarded region.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Install the plugin's panic hook once, chained to the one already there.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if DEPTH.with(Cell::get) == 0 {
                previous(info);
                return;
            }
            let mut message = payload_message(info.payload());
            if let Some(location) = info.location() {
                message = format!("{message} (at {location})");
            }
            LAST_PANIC.with(|last| *last.borrow_mut() = Some(message));
        }));
    });
}

/// The text of a panic payload (`panic!` gives `&str` or `String`).
fn payload_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Marks the current thread as inside a guarded region while alive.
struct Region;

impl Region {
    fn enter() -> Self {
        install_hook();
        DEPTH.with(|depth| depth.set(depth.get() + 1));
        Region
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        DEPTH.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

/// Run `body`, turning a panic into the error [`panic_error`] describes.
fn catch_raw<T>(body: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let region = Region::enter();
    let outcome = catch_unwind(AssertUnwindSafe(body));
    drop(region);
    outcome.map_err(|payload| {
        LAST_PANIC
            .with(|last| last.borrow_mut().take())
            .unwrap_or_else(|| payload_message(payload.as_ref()))
    })
}

/// Run a third-party decoder over bytes read from disk, returning the
/// message of a panic instead of unwinding.
///
/// Not a bug of dfx's: Arrow's IPC reader still panics on some corrupt
/// streams (a buffer offset beyond the message body, found by fuzzing the
/// map-file reader). A panic there means a corrupt file, and the caller
/// reports it as one, naming the file, rather than as a dfx panic.
///
/// # Errors
///
/// The panic's message (with its location).
pub fn catch_decoder<T>(decode: impl FnOnce() -> T) -> std::result::Result<T, String> {
    catch_raw(decode)
}

/// The error a caught panic becomes: `dfx plugin panicked in <where>: <message>`.
pub fn panic_error(place: impl fmt::Display, message: impl fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("{PANIC_PREFIX} {place}: {message}"))
}

/// Run `body`; a panic inside it becomes an error naming dfx and `place`.
///
/// # Errors
///
/// `body`'s own error, or the caught panic.
pub fn catch<T>(place: impl fmt::Display, body: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_raw(body).unwrap_or_else(|message| Err(panic_error(place, message)))
}

/// Await `future`, catching a panic in any of its polls.
///
/// # Errors
///
/// The future's own error, or the caught panic.
pub async fn catch_future<T>(
    place: impl fmt::Display,
    future: impl Future<Output = Result<T>>,
) -> Result<T> {
    let mut future = std::pin::pin!(future);
    let mut place = Some(place);
    std::future::poll_fn(move |cx| match catch_raw(|| future.as_mut().poll(cx)) {
        Ok(poll) => poll,
        Err(message) => {
            let place = place.take().map(|p| p.to_string()).unwrap_or_default();
            Poll::Ready(Err(panic_error(place, message)))
        }
    })
    .await
}

/// A stream whose every poll is guarded: a panic becomes one error item,
/// then the stream ends (whatever panicked is in no state to be polled again).
///
/// Everything that runs inside the poll is covered: the stage's DataFusion
/// operators below a writer poll their inputs there, so a panic anywhere in
/// the stage (an operator, a UDF, an accumulator) surfaces through it.
pub struct GuardedStream {
    place: String,
    schema: SchemaRef,
    inner: Option<SendableRecordBatchStream>,
}

impl GuardedStream {
    /// Guard `inner`; `place` names it in errors (`ShuffleWriterExec stage 2 map 0`).
    pub fn wrap(
        place: impl Into<String>,
        inner: SendableRecordBatchStream,
    ) -> SendableRecordBatchStream {
        Box::pin(Self {
            place: place.into(),
            schema: inner.schema(),
            inner: Some(inner),
        })
    }
}

impl Stream for GuardedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match catch_raw(|| inner.as_mut().poll_next(cx)) {
            Ok(poll) => poll,
            Err(message) => {
                // Dropped now, guarded too: a half-updated stream may panic
                // again while dropping.
                let inner = self.inner.take();
                let _ = catch_raw(move || drop(inner));
                let place = format!("a poll of {}", self.place);
                Poll::Ready(Some(Err(panic_error(place, message))))
            }
        }
    }
}

impl RecordBatchStream for GuardedStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// An accumulator whose every method is guarded.
///
/// `size` cannot return an error: a panic there counts as 0 bytes, and the
/// next method that can fail reports the bug (it runs the same code).
#[derive(Debug)]
pub struct GuardedAccumulator {
    function: &'static str,
    inner: Box<dyn Accumulator>,
}

impl GuardedAccumulator {
    /// Guard the accumulator `inner` of the aggregate function `function`.
    pub fn wrap(function: &'static str, inner: Box<dyn Accumulator>) -> Box<dyn Accumulator> {
        Box::new(Self { function, inner })
    }

    fn run<T>(
        &mut self,
        method: &str,
        body: impl FnOnce(&mut dyn Accumulator) -> Result<T>,
    ) -> Result<T> {
        let inner = self.inner.as_mut();
        catch(format_args!("{} {method}", self.function), || body(inner))
    }
}

impl Accumulator for GuardedAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.run("update_batch", |acc| acc.update_batch(values))
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.run("merge_batch", |acc| acc.merge_batch(states))
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.run("evaluate", |acc| acc.evaluate())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.run("state", |acc| acc.state())
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.run("retract_batch", |acc| acc.retract_batch(values))
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }

    fn size(&self) -> usize {
        // The wrapper's own size plus the inner one (0 if it panicked).
        let inner = self.inner.as_ref();
        size_of_val(self) + catch_raw(|| inner.size()).unwrap_or(0)
    }
}

/// The query planner behind a guard: every poll of its planning future.
#[derive(Debug)]
pub struct GuardedQueryPlanner<P> {
    inner: P,
}

impl<P> GuardedQueryPlanner<P> {
    /// Guard `inner`.
    pub fn new(inner: P) -> Self {
        Self { inner }
    }
}

#[async_trait]
impl<P: QueryPlanner + Send + Sync> QueryPlanner for GuardedQueryPlanner<P> {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        catch_future(
            "the query planner",
            self.inner.create_physical_plan(logical_plan, session),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;

    #[test]
    fn a_panic_becomes_an_error_naming_dfx_the_place_and_the_message() {
        let err = catch("the test", || -> Result<()> { panic!("boom {}", 7) })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dfx plugin panicked in the test: boom 7"),
            "{err}"
        );
        assert!(err.contains("guard.rs"), "the location is kept: {err}");
        // Errors pass through untouched, values too.
        assert_eq!(catch("x", || Ok(3)).unwrap(), 3);
        let err = catch("x", || -> Result<()> {
            Err(DataFusionError::Plan("no".into()))
        });
        assert!(matches!(err, Err(DataFusionError::Plan(_))));
    }

    #[test]
    fn nested_regions_report_the_inner_panic_once() {
        let outer = catch("outer", || {
            let inner = catch("inner", || -> Result<()> { panic!("deep") });
            assert!(inner.unwrap_err().to_string().contains("inner: deep"));
            Ok(1)
        });
        assert_eq!(outer.unwrap(), 1);
        assert_eq!(DEPTH.with(Cell::get), 0);
    }

    #[tokio::test]
    async fn a_stream_that_panics_yields_one_error_then_ends() {
        let schema = Arc::new(Schema::empty());
        let items = futures::stream::iter(0..3).map(|i| {
            if i == 1 {
                panic!("poll {i} went wrong");
            }
            Ok(RecordBatch::new_empty(Arc::new(Schema::empty())))
        });
        let mut stream = GuardedStream::wrap(
            "the test stream",
            Box::pin(RecordBatchStreamAdapter::new(schema, items)),
        );
        assert!(stream.next().await.unwrap().is_ok());
        let err = stream.next().await.unwrap().unwrap_err().to_string();
        assert!(
            err.contains("dfx plugin panicked in a poll of the test stream: poll 1 went wrong"),
            "{err}"
        );
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_panicking_future_becomes_an_error() {
        let err = catch_future("the future", async {
            tokio::task::yield_now().await;
            if true {
                panic!("late");
            }
            Ok(())
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("dfx plugin panicked in the future: late"),
            "{err}"
        );
    }

    #[derive(Debug, Default)]
    struct Fragile;

    impl Accumulator for Fragile {
        fn update_batch(&mut self, _values: &[ArrayRef]) -> Result<()> {
            panic!("update")
        }
        fn merge_batch(&mut self, _states: &[ArrayRef]) -> Result<()> {
            panic!("merge")
        }
        fn evaluate(&mut self) -> Result<ScalarValue> {
            panic!("evaluate")
        }
        fn state(&mut self) -> Result<Vec<ScalarValue>> {
            panic!("state")
        }
        fn size(&self) -> usize {
            panic!("size")
        }
    }

    #[test]
    fn every_accumulator_method_is_guarded() {
        let mut acc = GuardedAccumulator::wrap("f", Box::new(Fragile));
        for (err, method) in [
            (acc.update_batch(&[]).unwrap_err(), "update_batch: update"),
            (acc.merge_batch(&[]).unwrap_err(), "merge_batch: merge"),
            (acc.evaluate().unwrap_err(), "evaluate: evaluate"),
            (acc.state().unwrap_err(), "state: state"),
        ] {
            let err = err.to_string();
            assert!(err.contains(&format!("{PANIC_PREFIX} f {method}")), "{err}");
        }
        assert!(acc.size() > 0);
    }
}
