//! The layout of a published map file (`stage-<S>/<K>-map-<M>.arrow`), for
//! anything that reads a shuffle location by hand (tests, tools): the
//! plugin writes and reads it.

/// The last 8 bytes of every published map file (`stage-<S>/<K>-map-<M>.arrow`).
///
/// A map file is the map's segments (each a whole Arrow IPC stream), then
/// its commit marker (JSON: stage, map, and per bucket its rows and the byte
/// ranges of its segments), then a footer of [`MAP_FOOTER_BYTES`]: the
/// marker's length as a little-endian u64, then this magic. The plugin
/// writes and reads it; it is here so that anything reading a shuffle
/// directory by hand (tests, tools) finds the layout in one place.
pub const MAP_FOOTER_MAGIC: &[u8; 8] = b"DFXMAP01";

/// Bytes of a map file's footer: the commit marker's length, then
/// [`MAP_FOOTER_MAGIC`].
pub const MAP_FOOTER_BYTES: u64 = 16;

/// Where the commit marker is in the whole map file `file` (the segments
/// are the bytes before it), or `None` when the file does not end with a
/// footer or the footer's length overruns it. For readers of a shuffle by
/// hand; the plugin reads only a file's tail, and says what is wrong.
pub fn map_marker_range(file: &[u8]) -> Option<std::ops::Range<usize>> {
    let footer = file.len().checked_sub(MAP_FOOTER_BYTES as usize)?;
    let (len, magic) = file[footer..].split_at(8);
    if magic != MAP_FOOTER_MAGIC {
        return None;
    }
    let len = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
    Some(footer.checked_sub(len)?..footer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_file_splits_at_its_footer() {
        let mut file = b"segmentsmarker".to_vec();
        file.extend_from_slice(&6u64.to_le_bytes());
        file.extend_from_slice(MAP_FOOTER_MAGIC);
        assert_eq!(map_marker_range(&file), Some(8..14));
        // No magic, too short, or a length past the file's start.
        assert_eq!(map_marker_range(&file[..file.len() - 1]), None);
        assert_eq!(map_marker_range(b"short"), None);
        let mut overrun = b"x".to_vec();
        overrun.extend_from_slice(&2u64.to_le_bytes());
        overrun.extend_from_slice(MAP_FOOTER_MAGIC);
        assert_eq!(map_marker_range(&overrun), None);
    }
}
