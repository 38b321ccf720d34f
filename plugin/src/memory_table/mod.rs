//! In-memory tables across a host's planner boundary, and into workers.
//!
//! A host such as datafusion-python hands the plugin's planner its logical
//! plan as protobuf, which carries tables over files, views and empty tables
//! only. Anything else (a `MemTable` from `from_arrow` or
//! `register_record_batches`, a table function's rows) reaches the host's
//! logical codec chain, where [`DfxLogicalCodec`] takes it:
//!
//! ```text
//! host (encodes the plan)         plugin planner (decodes, plans)        workers
//! ----                            --------------                         -------
//! scan the table, its batches ──► MemorySourceTable ── scan:
//! as Arrow IPC, one stream per      with a shuffle location: each
//! partition (up to the limit,       partition written ONCE as
//! `dfx_engine.memory_table_limit`)  <location>/sources/<digest>/part-<p>.arrow
//!                                   and scanned as Arrow files ──────────► read like any table
//!                                 without one: scanned in memory
//! ```
//!
//! The payload, framed so foreign bytes are refused with a reason
//! (integers little endian):
//!
//! ```text
//! magic b"DFXT" | payload version u16 (PAYLOAD_VERSION) | partitions u32
//! | per partition: u64 length, then one Arrow IPC stream (schema, batches)
//! ```
//!
//! A worker scans a source file through DataFusion's Arrow file scan, which
//! the host's own codec carries; the stage check lets a worker read files
//! under its location's [`SOURCES_DIR`] beside its spec's tables
//! ([`is_source_file`]).

mod source;

pub use source::{MemorySourceTable, SOURCES_DIR, is_source_file};

use datafusion::common::Result;

/// The setting that bounds a table carried this way, in bytes of Arrow IPC.
pub use crate::config::{DEFAULT_MEMORY_TABLE_LIMIT, MEMORY_TABLE_LIMIT_KEY};
use crate::error::Area;
use crate::error::fail;

/// First bytes of every payload of [`DfxLogicalCodec`].
pub const PAYLOAD_MAGIC: [u8; 4] = *b"DFXT";

/// Version of the payload layout this plugin writes and reads.
pub const PAYLOAD_VERSION: u16 = 1;

/// The payload of one table: its partitions, each one Arrow IPC stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePayload {
    /// One Arrow IPC stream (schema, then batches) per partition.
    pub partitions: Vec<Vec<u8>>,
}

impl TablePayload {
    /// Append the framed payload to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) -> Result<()> {
        buf.extend_from_slice(&PAYLOAD_MAGIC);
        buf.extend_from_slice(&PAYLOAD_VERSION.to_le_bytes());
        let count = u32::try_from(self.partitions.len()).map_err(|_| {
            fail(
                Area::InMemoryTable,
                format!("{} partitions do not fit", self.partitions.len()),
            )
        })?;
        buf.extend_from_slice(&count.to_le_bytes());
        for partition in &self.partitions {
            buf.extend_from_slice(&(partition.len() as u64).to_le_bytes());
            buf.extend_from_slice(partition);
        }
        Ok(())
    }

    /// Read a framed payload.
    ///
    /// # Errors
    ///
    /// Bytes of another codec (no magic), another payload version, a
    /// truncated payload or trailing bytes, each named.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let mut rest = buf;
        let mut take = |n: usize, what: &str| -> Result<&[u8]> {
            if rest.len() < n {
                return Err(fail(
                    Area::InMemoryTable,
                    format!(
                        "payload truncated in {what}: {n} byte(s) wanted, {} left",
                        rest.len()
                    ),
                ));
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        if take(4, "the magic")? != PAYLOAD_MAGIC {
            return Err(fail(
                Area::InMemoryTable,
                format!(
                    "not a dfx table payload: it does not start with {:?}",
                    String::from_utf8_lossy(&PAYLOAD_MAGIC)
                ),
            ));
        }
        let version = u16::from_le_bytes(take(2, "the version")?.try_into().unwrap_or_default());
        if version != PAYLOAD_VERSION {
            return Err(fail(
                Area::InMemoryTable,
                format!(
                    "payload version {version}, but this plugin reads version {PAYLOAD_VERSION}"
                ),
            ));
        }
        let count = u32::from_le_bytes(take(4, "the count")?.try_into().unwrap_or_default());
        let mut partitions = Vec::new();
        for partition in 0..count {
            let what = format!("partition {partition}'s length");
            let len = u64::from_le_bytes(take(8, &what)?.try_into().unwrap_or_default());
            let len = usize::try_from(len)
                .map_err(|_| fail(Area::InMemoryTable, format!("{what} is {len}")))?;
            partitions.push(take(len, &format!("partition {partition}"))?.to_vec());
        }
        if !rest.is_empty() {
            return Err(fail(
                Area::InMemoryTable,
                format!("{} trailing byte(s) after {count} partition(s)", rest.len()),
            ));
        }
        Ok(Self { partitions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TablePayload {
        TablePayload {
            partitions: vec![vec![1, 2, 3], vec![], vec![9; 20]],
        }
    }

    #[test]
    fn a_payload_round_trips_and_every_truncation_is_named() {
        let mut buf = Vec::new();
        sample().encode(&mut buf).unwrap();
        assert_eq!(TablePayload::decode(&buf).unwrap(), sample());
        for len in 0..buf.len() {
            let err = TablePayload::decode(&buf[..len]).unwrap_err().to_string();
            assert!(err.contains("dfx in-memory table"), "{len}: {err}");
        }
        buf.push(0);
        let err = TablePayload::decode(&buf).unwrap_err().to_string();
        assert!(err.contains("1 trailing byte(s)"), "{err}");
    }

    #[test]
    fn another_version_or_codec_is_refused_by_name() {
        let mut buf = Vec::new();
        sample().encode(&mut buf).unwrap();
        buf[4] = 7;
        let err = TablePayload::decode(&buf).unwrap_err().to_string();
        assert!(err.contains("payload version 7"), "{err}");
        let err = TablePayload::decode(b"PAR1xxxxxxxx")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a dfx table payload"), "{err}");
    }
}
