//! The worker's side of the serve protocol, once for both hosts: the loop
//! that turns request lines into response lines, and the process-mode read
//! of an envelope file.
//!
//! ```text
//! requests ──► line ─┬─ blank ──────────────────────────► skipped
//!                    ├─ not a request, or its envelope
//!                    │  file unreadable ────────────────► Response::unknown_task ─┐
//!                    └─ Envelope ──► answer(envelope) ──► Response ───────────────┴─► out:
//!                                                                   one line, flushed
//! end of requests ──► Ok(())      a request that cannot be read, or a failed write ──► Err
//! ```
//!
//! A host brings only what differs: where the lines come from, where the
//! responses go, and how a task is run ([`serve`]'s `answer`). The Rust host
//! runs it on tokio with its own async task runner; the Python module drives
//! [`serve_blocking`] with a handler written in Python.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::pin;

use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use dfx_abi::Plugin;

use crate::error::{Result, RuntimeError};
use crate::flight::serving;
use crate::protocol::envelope::Envelope;
use crate::protocol::report::Response;

/// One request to a serving worker (`--serve`).
///
/// The Rust scheduler's pool sends the envelope itself, so a query's tasks
/// need no file each (creating one is a few hundred microseconds of the
/// driver's CPU); process mode gives a worker a file. A worker of either
/// host takes both forms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Request {
    /// `{"envelope": "<path>"}`: the task's envelope file.
    File {
        /// The envelope file of the task.
        envelope: PathBuf,
    },
    /// `{"task": {<envelope>}}`: the envelope itself.
    Inline {
        /// The task's envelope, as its file would hold it.
        task: Box<Envelope>,
    },
}

impl Request {
    /// Read one request line.
    ///
    /// # Errors
    ///
    /// A line that is neither form, quoted (cut to 200 characters) with the
    /// forms expected.
    pub fn parse(line: &str) -> std::result::Result<Self, String> {
        serde_json::from_str(line.trim()).map_err(|err| {
            format!(
                "cannot read the request {:.200?}: {err}; expected {{\"envelope\": \"<path>\"}} \
                 or {{\"task\": {{<envelope>}}}}",
                line.trim()
            )
        })
    }

    /// The request as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        // Cannot fail: a path or an envelope, whose every field serializes.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    /// The envelope the request names or carries.
    ///
    /// # Errors
    ///
    /// An envelope file that cannot be read or does not parse.
    pub fn envelope(self) -> Result<Envelope> {
        match self {
            Self::File { envelope } => Envelope::read(&envelope),
            Self::Inline { task } => Ok(*task),
        }
    }
}

/// Where a serving worker's requests come from, as its errors name it: the
/// protocol's requests travel on the worker's stdin.
const REQUESTS: &str = "stdin";

/// Where a worker's responses go, as its errors name it: the worker's
/// stdout (a Python worker writes to its copy of the original fd 1).
const RESPONSES: &str = "stdout";

/// The envelope a request line names or carries; `None` for a blank line,
/// which is skipped. A line that is not a request, or names an envelope
/// file that cannot be read, is answered at once: an unknown task.
fn envelope_of_line(line: &str) -> Option<std::result::Result<Envelope, Response>> {
    if line.trim().is_empty() {
        return None;
    }
    let envelope = match Request::parse(line) {
        Ok(request) => request
            .envelope()
            .map_err(|err| Response::unknown_task(err.to_string())),
        Err(err) => Err(Response::unknown_task(err)),
    };
    Some(envelope)
}

/// Serve the task protocol: for each line of `requests`, write one response
/// line to `out`, until `requests` ends.
///
/// A line is one request (its trailing newline optional). A blank line is
/// skipped. A line that is not a request, or names an envelope file that
/// cannot be read, is answered as an unknown task
/// ([`Response::unknown_task`]) without calling `answer`; every other
/// request is answered by `answer(envelope)`. A failed task is just its
/// response: the loop goes on to the next line. Each response is written
/// whole and flushed ([`write_response`]) before the next line is read, as
/// the driver waits for it.
///
/// `answer` may borrow state across calls (a host's warm sessions):
///
/// ```
/// # futures::executor::block_on(async {
/// use dfx_runtime::protocol::{Envelope, Response, WorkerReport, serve::serve};
///
/// let line = r#"{"task": {"spec": {}, "plan": "/s/tasks/stage-1.plan", "stage_id": 1, "partition": 0}}"#;
/// let requests = futures::stream::iter([Ok(String::new()), Ok(line.to_string())]);
/// let mut out = Vec::new();
/// let mut answered = 0;
/// serve(None, requests, &mut out, async |envelope: Envelope| {
///     answered += 1;
///     Response::Report(WorkerReport {
///         stage_id: envelope.stage_id,
///         partition: envelope.partition,
///         rows: 3,
///         bytes: None,
///         elapsed_ms: None,
///         layout: None,
///     })
/// })
/// .await
/// .unwrap();
/// assert_eq!(answered, 1, "the blank line is skipped");
/// assert_eq!(String::from_utf8(out).unwrap(), "{\"stage_id\":1,\"partition\":0,\"rows\":3}\n");
/// # });
/// ```
///
/// # Errors
///
/// [`RuntimeError::Io`] only when a request cannot be read (naming stdin)
/// or a response cannot be written (naming stdout: the driver is gone). The
/// end of `requests` is success.
pub async fn serve<W>(
    plugin: Option<&Plugin>,
    requests: impl Stream<Item = std::io::Result<String>>,
    out: &mut W,
    mut answer: impl AsyncFnMut(Envelope) -> Response,
) -> Result<()>
where
    W: Write + ?Sized,
{
    let mut requests = pin!(requests);
    let served = async {
        while let Some(line) = requests.next().await {
            let line =
                line.map_err(|e| RuntimeError::io("cannot read a request from", REQUESTS, e))?;
            let response = match envelope_of_line(&line) {
                None => continue,
                Some(Ok(mut envelope)) => match serving::before_task(plugin, &mut envelope) {
                    Ok(served) => serving::sign(answer(envelope).await, served.as_ref()),
                    Err(error) => Response::of_final(&envelope, error),
                },
                Some(Err(unknown)) => unknown,
            };
            write_response(out, &response)?;
        }
        Ok(())
    }
    .await;
    // Nothing is served past the loop: the copies kept for it go.
    serving::after_serving();
    served
}

/// [`serve`] for a host without an async runtime: request lines from an
/// iterator, each task answered by a plain function, the calling thread
/// blocked until `requests` ends (the Python worker, whose handler is a
/// Python callable). The same loop, driven by [`futures::executor::block_on`].
///
/// # Errors
///
/// As [`serve`]: a request that cannot be read, or a response that cannot
/// be written.
pub fn serve_blocking<W>(
    plugin: Option<&Plugin>,
    requests: impl IntoIterator<Item = std::io::Result<String>>,
    out: &mut W,
    mut answer: impl FnMut(Envelope) -> Response,
) -> Result<()>
where
    W: Write + ?Sized,
{
    futures::executor::block_on(serve(
        plugin,
        futures::stream::iter(requests),
        out,
        async |envelope| answer(envelope),
    ))
}

/// Process mode's first step: the envelope of the file `path` the worker
/// was started with.
///
/// # Errors
///
/// The response to give instead, when the file cannot be read or does not
/// parse: an unknown task ([`Response::unknown_task`]) whose message names
/// the file. The caller writes it like any other ([`write_response`]).
pub fn read_task_file(path: &Path) -> std::result::Result<Envelope, Response> {
    Envelope::read(path).map_err(|err| Response::unknown_task(err.to_string()))
}

/// Write `response` to `out` as one line, newline included, and flush it:
/// a serving worker's answer to one request, or a process-mode worker's
/// last line of stdout.
///
/// The line is handed to `out` in one `write_all`: through Rust's stdout,
/// which holds its lock for the whole call, a print from another thread
/// lands before or after the response, never inside it.
///
/// # Errors
///
/// [`RuntimeError::Io`] naming stdout when the line cannot be written or
/// flushed (the driver is gone).
pub fn write_response<W: Write + ?Sized>(out: &mut W, response: &Response) -> Result<()> {
    let mut line = response.to_line();
    line.push('\n');
    out.write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| RuntimeError::io("cannot write the response to", RESPONSES, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SessionSpec;

    #[test]
    fn an_inline_request_carries_the_envelope_its_file_would_hold() {
        let envelope = Envelope {
            spec: SessionSpec::default(),
            plan: "/s/tasks/stage-2.plan".into(),
            stage_id: 2,
            partition: 5,
            attempt: 1,
            added_from: None,
        };
        let request = Request::Inline {
            task: Box::new(envelope.clone()),
        };
        let line = request.to_line();
        assert!(line.starts_with("{\"task\":{"), "{line}");
        assert_eq!(Request::parse(&line).unwrap().envelope().unwrap(), envelope);
        let file = Request::parse("{\"envelope\": \"/s/t.json\"}").unwrap();
        assert_eq!(
            file,
            Request::File {
                envelope: "/s/t.json".into()
            }
        );
        assert_eq!(
            file.to_line(),
            "{\"envelope\":\"/s/t.json\"}\n",
            "the file form is written as it is read"
        );
        let err = Request::parse("{\"task\": 3}").unwrap_err();
        assert!(err.contains("expected"), "{err}");
    }

    use std::cell::RefCell;
    use std::io;

    use dfx_abi::FailureClass;
    use serde_json::Value;

    use crate::protocol::WorkerReport;

    fn envelope(stage_id: u64, partition: usize) -> Envelope {
        Envelope {
            spec: SessionSpec::default(),
            plan: format!("/s/tasks/stage-{stage_id}.plan").into(),
            stage_id,
            partition,
            attempt: 0,
            added_from: None,
        }
    }

    /// The report a test's `answer` gives: the envelope's task, with its
    /// map as the rows, so each response names the request it answers.
    fn report_of(envelope: &Envelope) -> Response {
        Response::Report(WorkerReport {
            stage_id: envelope.stage_id,
            partition: envelope.partition,
            rows: envelope.partition * 10,
            bytes: None,
            elapsed_ms: None,
            layout: None,
        })
    }

    fn inline(envelope: &Envelope) -> io::Result<String> {
        Ok(Request::Inline {
            task: Box::new(envelope.clone()),
        }
        .to_line())
    }

    fn line(text: &str) -> io::Result<String> {
        Ok(text.to_string())
    }

    /// The response lines written, each parsed; the output must end with a
    /// newline.
    fn responses(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    fn serve_lines(requests: Vec<io::Result<String>>) -> (Result<()>, Vec<u8>, Vec<Envelope>) {
        let mut out = Vec::new();
        let mut answered = Vec::new();
        let served = futures::executor::block_on(serve(
            None,
            futures::stream::iter(requests),
            &mut out,
            async |envelope: Envelope| {
                let response = report_of(&envelope);
                answered.push(envelope);
                response
            },
        ));
        (served, out, answered)
    }

    #[test]
    fn blank_lines_are_skipped_bad_ones_answered_as_unknown_tasks_good_ones_by_answer() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("task-3-1.json");
        let (first, second) = (envelope(2, 5), envelope(3, 1));
        let (served, out, answered) = serve_lines(vec![
            line(""),
            line("   \n"),
            line("not json"),
            inline(&first),
            Ok(Request::File {
                envelope: missing.clone(),
            }
            .to_line()),
            line("\n"),
            inline(&second),
        ]);
        served.unwrap();
        assert_eq!(answered, [first, second], "answer sees only good requests");
        let responses = responses(&out);
        assert_eq!(
            responses.len(),
            4,
            "one line per non-blank request: {responses:?}"
        );

        let bad = &responses[0];
        assert!(
            bad["error"]
                .as_str()
                .unwrap()
                .contains("cannot read the request"),
            "{bad}"
        );
        assert_eq!(bad["stage_id"], Value::Null, "{bad}");
        assert_eq!(bad["partition"], Value::Null, "{bad}");
        assert_eq!(bad["retry"], "final", "{bad}");

        assert_eq!(responses[1]["stage_id"], 2);
        assert_eq!(responses[1]["partition"], 5);
        assert_eq!(responses[1]["rows"], 50);

        let unreadable = &responses[2];
        let error = unreadable["error"].as_str().unwrap();
        assert!(error.contains("cannot read envelope"), "{unreadable}");
        assert!(
            error.contains(missing.to_str().unwrap()),
            "names the file: {unreadable}"
        );
        assert_eq!(unreadable["stage_id"], Value::Null, "{unreadable}");
        assert_eq!(unreadable["retry"], "final", "{unreadable}");

        assert_eq!(responses[3]["stage_id"], 3);
        assert_eq!(responses[3]["rows"], 10);
    }

    #[test]
    fn a_file_request_is_answered_with_the_envelope_its_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task-4-2.json");
        let task = envelope(4, 2);
        task.write(&path).unwrap();
        let request = Request::File { envelope: path }.to_line();
        let (served, out, answered) = serve_lines(vec![Ok(request)]);
        served.unwrap();
        assert_eq!(answered, [task]);
        assert_eq!(responses(&out)[0]["rows"], 20);
    }

    #[test]
    fn the_end_of_the_requests_ends_serving_with_success() {
        let (served, out, answered) = serve_lines(Vec::new());
        served.unwrap();
        assert!(out.is_empty() && answered.is_empty());
        let (served, out, _) = serve_lines(vec![line(""), line("\n")]);
        served.unwrap();
        assert!(out.is_empty(), "blank lines get no response");
    }

    /// A writer whose every write fails, as stdout does once the driver
    /// closed its end.
    struct Gone;

    impl Write for Gone {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::new(io::ErrorKind::BrokenPipe, "driver gone"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_response_that_cannot_be_written_ends_serving_with_an_error_naming_stdout() {
        let mut answered = 0;
        let err = serve_blocking(
            None,
            [inline(&envelope(1, 0)), inline(&envelope(1, 1))],
            &mut Gone,
            |envelope| {
                answered += 1;
                report_of(&envelope)
            },
        )
        .unwrap_err();
        assert!(
            matches!(&err, RuntimeError::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "cannot write the response to stdout: driver gone"
        );
        assert_eq!(answered, 1, "no task runs after the driver is gone");
    }

    #[test]
    fn a_request_that_cannot_be_read_ends_serving_with_an_error_naming_stdin() {
        let unreadable = io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        );
        let (served, out, answered) = serve_lines(vec![
            inline(&envelope(1, 0)),
            Err(unreadable),
            inline(&envelope(1, 1)),
        ]);
        let err = served.unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read a request from stdin: stream did not contain valid UTF-8"
        );
        assert_eq!(
            answered,
            [envelope(1, 0)],
            "nothing after the unreadable request"
        );
        assert_eq!(
            responses(&out).len(),
            1,
            "the request before it was answered"
        );
    }

    /// A writer that logs what it is asked to do into a log the requests
    /// share, so the order of reads, writes and flushes can be asserted.
    struct Logged<'a>(&'a RefCell<Vec<String>>);

    impl Write for Logged<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .borrow_mut()
                .push(format!("write {}", String::from_utf8_lossy(buf)));
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            self.0.borrow_mut().push("flush".into());
            Ok(())
        }
    }

    #[test]
    fn each_response_is_one_whole_line_flushed_before_the_next_request_is_read() {
        let log = RefCell::new(Vec::new());
        let mut requests = vec![inline(&envelope(7, 1)), line("{}")].into_iter();
        let requests = std::iter::from_fn(|| {
            log.borrow_mut().push("read".into());
            requests.next()
        });
        serve_blocking(None, requests, &mut Logged(&log), |envelope| {
            report_of(&envelope)
        })
        .unwrap();
        let unknown = Response::unknown_task(Request::parse("{}").unwrap_err());
        assert_eq!(
            log.into_inner(),
            [
                "read".to_string(),
                "write {\"stage_id\":7,\"partition\":1,\"rows\":10}\n".into(),
                "flush".into(),
                "read".into(),
                format!("write {}\n", unknown.to_line()),
                "flush".into(),
                "read".into(),
            ]
        );
    }

    #[test]
    fn process_mode_reads_the_envelope_file_or_answers_an_unknown_task_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task-5-0.json");
        envelope(5, 0).write(&path).unwrap();
        assert_eq!(read_task_file(&path), Ok(envelope(5, 0)));

        let missing = dir.path().join("task-5-1.json");
        let Err(Response::Error(error)) = read_task_file(&missing) else {
            panic!("a missing envelope file is an unknown task");
        };
        assert_eq!((error.stage_id, error.partition), (None, None));
        assert_eq!(error.retry, FailureClass::Final);
        assert!(
            error.error.contains("cannot read envelope"),
            "{}",
            error.error
        );
        assert!(
            error.error.contains(missing.to_str().unwrap()),
            "{}",
            error.error
        );

        let garbled = dir.path().join("task-5-2.json");
        std::fs::write(&garbled, "{\"stage_id\": ").unwrap();
        let Err(Response::Error(error)) = read_task_file(&garbled) else {
            panic!("an envelope that does not parse is an unknown task");
        };
        assert!(
            error.error.contains("cannot parse envelope"),
            "{}",
            error.error
        );
        assert!(
            error.error.contains(garbled.to_str().unwrap()),
            "{}",
            error.error
        );
    }
}
