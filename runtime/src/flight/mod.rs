//! A worker's map files, served to readers in other processes over Arrow
//! Flight, when a query's shuffle durability is `local`: each map file
//! stays on the disk of the worker that wrote it.
//!
//! ```text
//! worker A (writes stage 2, map 0)            worker B (reads stage 2)
//!   task ──► <location>/stage-2/0-map-0.arrow      envelope: layouts, each with
//!   report: layout + owner = A's address ──►       its owner
//!   map server A ◄── do_get(ticket: location,   ◄─ a map B does not own:
//!        stage 2, map 0, byte ranges)               its ranges over Flight;
//!        └── the ranges' bytes ──────────────►     its own: read from disk
//! ```
//!
//! map_server  the Flight service: one per worker process, on a runtime of
//!             its own, checking each ticket against the locations its
//!             process wrote
//! serving     what the serve loop does around each task: start the server,
//!             tell the task its own address, sign its report as the owner
//!
//! The ticket's wire format is [`dfx_abi::MapTicket`], which the plugin's
//! reader writes.

pub mod map_server;
pub mod serving;

pub use map_server::{MapServer, ServedCounts};
