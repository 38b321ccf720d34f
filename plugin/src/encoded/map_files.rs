//! The wire format of one map's files: for each cut scan of a stage (its
//! slot), the file group map M reads.
//!
//! ```text
//! magic b"DFXM" | version u16 | map u64 | slots u32
//! | per slot: partition u64 (NO_PARTITION: none) | file group blob (datafusion-proto `FileGroup`)
//! ```

use datafusion::common::Result;
use datafusion_proto::protobuf::FileGroup;
use prost::Message;

use crate::error::{Area, fail};
use crate::wire::{Cursor, NO_PARTITION, put_blob};

/// First bytes of a map's files.
pub const MAP_FILES_MAGIC: [u8; 4] = *b"DFXM";

/// Version of the map files' layout:
///
/// ```text
/// magic b"DFXM" | version u16 | map u64 | slots u32
/// | per slot: partition u64 (NO_PARTITION: none) | file group blob (datafusion-proto `FileGroup`)
/// ```
pub const MAP_FILES_VERSION: u16 = 1;

/// A scan a map reads, cut out of the shared part.
pub(super) struct Slot {
    /// Map `m` reads partition `m - offset`.
    pub(super) offset: u64,
    /// Its file groups, partition 0 first.
    pub(super) groups: Vec<FileGroup>,
}

/// The files of map `map`: for each slot, the group of the partition it reads.
pub(super) fn map_files(map: u64, slots: &[Slot]) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    buf.extend_from_slice(&MAP_FILES_MAGIC);
    buf.extend_from_slice(&MAP_FILES_VERSION.to_le_bytes());
    buf.extend_from_slice(&map.to_le_bytes());
    let count =
        u32::try_from(slots.len()).map_err(|_| fail(Area::Codec, "too many scans to cut"))?;
    buf.extend_from_slice(&count.to_le_bytes());
    for slot in slots {
        let partition = map
            .checked_sub(slot.offset)
            .filter(|p| (*p as usize) < slot.groups.len());
        match partition {
            Some(p) => {
                buf.extend_from_slice(&p.to_le_bytes());
                put_blob(
                    &mut buf,
                    &slot.groups[p as usize].encode_to_vec(),
                    "file group",
                )?;
            }
            None => {
                buf.extend_from_slice(&NO_PARTITION.to_le_bytes());
                put_blob(&mut buf, &[], "file group")?;
            }
        }
    }
    Ok(buf)
}

/// One slot of a map's files.
pub(super) struct MapSlot {
    pub(super) partition: u64,
    pub(super) group: Option<FileGroup>,
}

/// Parse map files, checking they are map `map`'s.
pub(super) fn read_map_files(bytes: &[u8], map: u64) -> Result<Vec<MapSlot>> {
    if bytes.len() >= 4 && bytes[..4] != MAP_FILES_MAGIC {
        return Err(fail(
            Area::Codec,
            format!(
                "not a map's files: expected magic {MAP_FILES_MAGIC:02x?}, found {:02x?}",
                &bytes[..4]
            ),
        ));
    }
    let mut cursor = Cursor { buf: bytes };
    cursor.take(4, "magic")?;
    let version = cursor.u16("map files version")?;
    if version != MAP_FILES_VERSION {
        return Err(fail(
            Area::Codec,
            format!(
                "map files version {version} is not supported; this plugin reads version \
             {MAP_FILES_VERSION}"
            ),
        ));
    }
    let found = cursor.u64("map")?;
    if found != map {
        return Err(fail(
            Area::Codec,
            format!("the files are map {found}'s, not map {map}'s"),
        ));
    }
    let count = cursor.u32("slots")? as usize;
    // Bounded by the bytes present (12 per slot at least), so a corrupt
    // count cannot make us allocate.
    if count > cursor.buf.len() / 12 {
        return Err(fail(
            Area::Codec,
            format!(
                "truncated map files: {count} slots declared, {} bytes left",
                cursor.buf.len()
            ),
        ));
    }
    let mut slots = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = cursor.u64("partition")?;
        let blob = cursor.blob("file group")?;
        let group = match partition {
            NO_PARTITION => None,
            _ => Some(FileGroup::decode(blob).map_err(|e| {
                fail(Area::Codec, format!(
                    "map {map}: the file group of partition {partition} is not valid protobuf: {e}"
                ))
            })?),
        };
        slots.push(MapSlot { partition, group });
    }
    if !cursor.buf.is_empty() {
        return Err(fail(
            Area::Codec,
            format!(
                "{} trailing bytes after map {map}'s files",
                cursor.buf.len()
            ),
        ));
    }
    Ok(slots)
}
