//! What travels between driver and worker: the task envelope, the worker's
//! response, and the serve protocol. The one definition of the
//! driver/worker contract; workers and drivers of both hosts speak it
//! through this module.
//!
//! ```text
//! driver ── envelope (a file, or inline in a request) ──► worker         (Envelope)
//!
//! process mode: one `<worker> <envelope file>` per task
//! driver ◄── last non-empty stdout line ───────────────── worker         (Response)
//!
//! pool mode: one long-lived `<worker> --serve` per slot, many tasks each
//! driver ── stdin:  {"task": {<envelope>}}\n ──────────► worker --serve  (Request)
//!                   or {"envelope": "<path>"}\n
//! driver ◄── stdout: one response line per request ────── worker --serve  (Response)
//! ```
//!
//! # Envelope
//!
//! JSON: `spec` (the session spec, an object or a string holding one),
//! `plan` (path of the encoded stage), `stage_id`, `partition` (the map)
//! and `attempt` (0 when absent). A retry whose envelope is a file gets a
//! copy with its number, `task-S-M.attempt-N.json`, so a worker still
//! reading an earlier attempt's file is not disturbed.
//!
//! # Response
//!
//! One JSON line, in both modes:
//!
//! - success: `{"stage_id": S, "partition": M, "rows": R, "bytes": B, "elapsed_ms": T}`,
//!   `rows` and `bytes` summed over the writer's summary (every bucket it
//!   published), `elapsed_ms` the worker's own time for the task;
//! - failure: `{"stage_id": S, "partition": M, "error": "<message>", "retry": C}`,
//!   where `C` is `"final"`, `"io"` or `{"lost": [stage, map]}`: the class
//!   the plugin recorded where the error was made (see
//!   [`dfx_abi::FailureClass`]). `stage_id` and `partition` are `null`
//!   when the envelope could not be read. The message is for people; no
//!   driver reads it to decide anything.
//!
//! In process mode the response is the last non-empty line of stdout (any
//! other line is ignored) and a failed task also exits non-zero. A serving
//! worker writes exactly one response line per request, goes on serving
//! after a failure, and exits with status 0 at the end of stdin. Other lines
//! a library prints to stdout may come before a response: the driver reads
//! lines until one is a response object (a JSON object with a `rows` or an
//! `error` key) and keeps the others as the task's output. A worker that
//! exits or is killed while a request is outstanding fails that task; the
//! driver replaces it for later tasks.
//!
//! # Worker side
//!
//! Both hosts' workers speak the protocol through [`serve`]: the loop of a
//! serving worker ([`serve::serve`], or [`serve::serve_blocking`] for a host
//! without an async runtime), process mode's read of its envelope file
//! ([`serve::read_task_file`]), and the writing of one response line
//! ([`serve::write_response`]). A host supplies only how a task is run.

pub mod checks;
pub mod envelope;
pub mod placement;
pub mod report;
pub mod serve;
pub mod stage_file;

pub use checks::{TaskInput, check_task};
pub use envelope::{Envelope, TASK_DIR, attempt_path, envelope_path, plan_path};
pub use placement::Placement;
pub use report::{Published, Response, TaskError, WorkerReport};
pub use serve::Request;
