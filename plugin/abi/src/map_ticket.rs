//! The ticket of a map server's `do_get`: which map file of which location,
//! and which of its byte ranges. Written once here for the two sides that
//! speak it: the plugin's reader asks with it, the runtime's server checks
//! and answers it.
//!
//! ```text
//! ticket  {"location": "/tmp/q1", "stage": 2, "map": 0, "ranges": [[0, 4096]]}
//! answer  FlightData { app_metadata: {"size": <file's bytes>} }    first
//!         FlightData { data_body: <bytes of the ranges, in order> } …
//! ```
//!
//! The answer's bodies are the file's own bytes, the Arrow IPC streams the
//! writer published: a reader checks them as it checks a file it reads
//! itself, and nothing is decoded to be encoded again.

use serde::{Deserialize, Serialize};

/// The key (without the `dfx_engine.` prefix) by which a serving worker
/// tells each task its own map server's address: a map the task's own
/// process holds is read from disk, never through its own server.
pub const MAP_SERVER: &str = "map_server";

/// The key (without the `dfx_engine.` prefix) by which a serving worker
/// tells each task where to keep a copy of the map file it publishes (its
/// own disk, under shuffle durability `both`), which its server serves.
pub const MAP_COPY_DIR: &str = "map_copy_dir";

/// The key (without the `dfx_engine.` prefix) of a query's shuffle
/// durability (`object_store`, `local` or `both`), as every session of it
/// is told: a reader falls back to the location's file only under `both`.
pub const SHUFFLE_DURABILITY: &str = "shuffle_durability";

/// The most ranges one ticket may name: a reader asks for a few large
/// ranges of each map, never one per row group.
pub const MAX_TICKET_RANGES: usize = 4096;

/// One `do_get` request: ranges of `stage-<stage>/<k>-map-<map>.arrow` under
/// `location`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapTicket {
    /// The query's shuffle location, canonical
    /// ([`crate::location::canonical_location`]).
    pub location: String,
    /// The stage whose map is read.
    pub stage: u64,
    /// The map whose file is read.
    pub map: u64,
    /// `(offset, length)` of each range, streamed in this order.
    pub ranges: Vec<(u64, u64)>,
}

/// The first message of an answer: what the file is, before any byte of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapTicketAnswer {
    /// The file's whole size, which the reader checks against the layout
    /// its map reported.
    pub size: u64,
}

impl MapTicket {
    /// The ticket's bytes.
    pub fn encode(&self) -> Vec<u8> {
        // Cannot fail: strings and numbers.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A ticket from its bytes.
    ///
    /// # Errors
    ///
    /// Bytes that are not a ticket, or one naming no range, more than
    /// [`MAX_TICKET_RANGES`], or a range whose end overflows; said with
    /// what a ticket holds.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let ticket: Self = serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "malformed map ticket ({e}); expected {{\"location\", \"stage\", \"map\", \
                 \"ranges\": [[offset, length], ...]}}"
            )
        })?;
        if ticket.ranges.is_empty() || ticket.ranges.len() > MAX_TICKET_RANGES {
            return Err(format!(
                "malformed map ticket: {} range(s); expected 1 to {MAX_TICKET_RANGES}",
                ticket.ranges.len()
            ));
        }
        if let Some((offset, len)) = ticket
            .ranges
            .iter()
            .find(|(offset, len)| offset.checked_add(*len).is_none())
        {
            return Err(format!(
                "malformed map ticket: range at {offset} of {len} byte(s) overflows"
            ));
        }
        Ok(ticket)
    }

    /// Bytes the ranges hold, in all.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(_, len)| len).sum()
    }

    /// Whether the ranges hold no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MapTicketAnswer {
    /// The first message's metadata.
    pub fn encode(&self) -> Vec<u8> {
        // Cannot fail: a number.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The answer from the first message's metadata.
    ///
    /// # Errors
    ///
    /// Metadata that is not an answer, said with what an answer holds.
    pub fn decode(metadata: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(metadata).map_err(|e| {
            format!("the answer's first message is not one ({e}); expected {{\"size\": n}}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_round_trips_and_bad_ones_are_refused_saying_why() {
        let ticket = MapTicket {
            location: "/tmp/q1".into(),
            stage: 2,
            map: 3,
            ranges: vec![(0, 10), (20, 5)],
        };
        assert_eq!(MapTicket::decode(&ticket.encode()), Ok(ticket.clone()));
        assert_eq!(ticket.len(), 15);
        let err = MapTicket::decode(b"not json").unwrap_err();
        assert!(err.contains("malformed map ticket"), "{err}");
        let extra = br#"{"location":"/q","stage":1,"map":0,"ranges":[[0,1]],"path":"/etc"}"#;
        assert!(
            MapTicket::decode(extra)
                .unwrap_err()
                .contains("unknown field")
        );
        let none = br#"{"location":"/q","stage":1,"map":0,"ranges":[]}"#;
        assert!(MapTicket::decode(none).unwrap_err().contains("0 range(s)"));
        let overflow = format!(
            r#"{{"location":"/q","stage":1,"map":0,"ranges":[[{},2]]}}"#,
            u64::MAX
        );
        assert!(
            MapTicket::decode(overflow.as_bytes())
                .unwrap_err()
                .contains("overflows")
        );
    }
}
