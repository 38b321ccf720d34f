//! The plan file of a stage cut for its maps: the one definition of its
//! layout, written by the drivers of both hosts and read by their workers.
//!
//! A stage over many files is cut by the plugin (its export `cut_stage`)
//! into a shared part and each map's files; the driver writes them into the
//! stage's one plan file, and a worker reads the shared part and its own
//! map's files only, at offsets, then has the plugin put them together
//! (`stage_for_map`). So a task reads, checks and decodes a plan whose size
//! does not grow with the stage's file count, and the driver writes each
//! file once.
//!
//! ```text
//! magic b"DFXC" | version u16 | first map u64 | maps u64 | shared length u64
//! | shared part | (maps + 1) offsets u64, from the end of the offsets
//! | each map's files, first map first
//! ```
//!
//! A stage the plugin does not cut keeps the plain encoded plan as its plan
//! file, which never begins with the magic (an encoded plan begins with a
//! protobuf field tag, and 'D' would be an end-group tag). A copy holding
//! one map's files only ([`one_map`]) is what travels by value to a worker
//! on another node.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use abi_stable::std_types::{RResult, RSlice};
use dfx_abi::{DfxStageInfo, Plugin};

use crate::error::{Result, RuntimeError};
use crate::scheduler::graph::EncodedStage;

/// First bytes of a stage file.
pub const STAGE_FILE_MAGIC: [u8; 4] = *b"DFXC";

/// Version of the layout this runtime writes and reads.
pub const STAGE_FILE_VERSION: u16 = 1;

/// Bytes before the shared part: magic, version, first map, maps, length.
const HEADER_BYTES: usize = 4 + 2 + 8 + 8 + 8;

/// `stages` with each one the plugin cuts for its maps as a stage file
/// (see the module doc); the others as they are. The description of each
/// is unchanged: the cut moves files, never a stage's maps or deps.
///
/// # Errors
///
/// A stage the plugin fails to cut, named.
pub fn cut_stages(plugin: &Plugin, stages: Vec<EncodedStage>) -> Result<Vec<EncodedStage>> {
    let Some(cut) = plugin.module().cut_stage() else {
        // A plugin that cannot cut ships stages whole, as before.
        return Ok(stages);
    };
    stages
        .into_iter()
        .map(|stage| {
            let stage_id = stage.info.stage_id;
            let cut = match cut(RSlice::from_slice(&stage.bytes)) {
                RResult::ROk(cut) => cut,
                RResult::RErr(message) => {
                    return Err(RuntimeError::Invalid(format!(
                        "stage {stage_id}: the plugin {} cannot cut it for its maps: {message}",
                        plugin.path().display()
                    )));
                }
            };
            let bytes = if cut.maps.is_empty() {
                cut.shared.into_vec()
            } else {
                if cut.maps.len() != stage.info.maps {
                    return Err(RuntimeError::Invalid(format!(
                        "stage {stage_id}: the plugin cut it into the files of {} map(s); it has {}",
                        cut.maps.len(),
                        stage.info.maps
                    )));
                }
                let maps: Vec<&[u8]> = cut.maps.iter().map(|m| m.as_slice()).collect();
                write(0, &cut.shared, &maps)
            };
            Ok(EncodedStage {
                info: stage.info,
                bytes,
            })
        })
        .collect()
}

/// What the plugin says of the stage in `bytes`, a plain encoded stage or a
/// stage file (described by its shared part, whose writer is the stage's).
///
/// # Errors
///
/// A truncated stage file, or bytes the plugin cannot describe.
pub fn stage_info(plugin: &Plugin, bytes: &[u8]) -> Result<DfxStageInfo> {
    let plan = shared_part(bytes)?;
    plugin
        .encoded_stage_info(plan)
        .map_err(|err| RuntimeError::Invalid(err.strip_backtrace()))
}

/// The plan every map of the stage in `bytes` shares: a plain encoded
/// stage whole, a stage file's shared part.
///
/// # Errors
///
/// A stage file truncated in its shared part.
pub fn shared_part(bytes: &[u8]) -> Result<&[u8]> {
    match Header::parse(bytes).map_err(RuntimeError::Invalid)? {
        None => Ok(bytes),
        Some(header) => usize::try_from(header.shared)
            .ok()
            .and_then(|len| bytes.get(HEADER_BYTES..HEADER_BYTES.checked_add(len)?))
            .ok_or_else(|| {
                RuntimeError::Invalid(format!(
                    "a stage file of {} bytes is truncated in its shared part",
                    bytes.len()
                ))
            }),
    }
}

/// A stage file holding `shared` and the files of maps `first ..`.
fn write(first: u64, shared: &[u8], maps: &[&[u8]]) -> Vec<u8> {
    let files: usize = maps.iter().map(|m| m.len()).sum();
    let mut out = Vec::with_capacity(HEADER_BYTES + shared.len() + 8 * (maps.len() + 1) + files);
    out.extend_from_slice(&STAGE_FILE_MAGIC);
    out.extend_from_slice(&STAGE_FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&(maps.len() as u64).to_le_bytes());
    out.extend_from_slice(&(shared.len() as u64).to_le_bytes());
    out.extend_from_slice(shared);
    let mut offset = 0u64;
    out.extend_from_slice(&offset.to_le_bytes());
    for map in maps {
        offset += map.len() as u64;
        out.extend_from_slice(&offset.to_le_bytes());
    }
    for map in maps {
        out.extend_from_slice(map);
    }
    out
}

/// What a stage file's header says.
struct Header {
    first: u64,
    maps: u64,
    shared: u64,
}

impl Header {
    /// The header at the start of `bytes`; `None` when they do not begin
    /// with the magic (a plain encoded plan).
    fn parse(bytes: &[u8]) -> std::result::Result<Option<Self>, String> {
        if !bytes.starts_with(&STAGE_FILE_MAGIC) {
            return Ok(None);
        }
        if bytes.len() < HEADER_BYTES {
            return Err(format!(
                "a stage file of {} bytes is shorter than its {HEADER_BYTES}-byte header",
                bytes.len()
            ));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != STAGE_FILE_VERSION {
            return Err(format!(
                "stage file version {version}; this runtime reads version {STAGE_FILE_VERSION}"
            ));
        }
        Ok(Some(Self {
            first: u64_at(6),
            maps: u64_at(14),
            shared: u64_at(22),
        }))
    }

    /// Where map `map`'s offsets sit, from the file's start.
    fn offsets_at(&self, map: u64) -> std::result::Result<u64, String> {
        if map < self.first || map - self.first >= self.maps {
            return Err(format!(
                "map {map} out of range: it holds the files of {} map(s), maps {}..{}",
                self.maps,
                self.first,
                self.first + self.maps
            ));
        }
        Ok(HEADER_BYTES as u64 + self.shared + 8 * (map - self.first))
    }

    /// Where the maps' files begin.
    fn files_at(&self) -> u64 {
        HEADER_BYTES as u64 + self.shared + 8 * (self.maps + 1)
    }
}

/// The pieces of map `map`'s plan in a stage file: its shared part and
/// the map's files.
struct Pieces {
    shared: Vec<u8>,
    files: Vec<u8>,
}

/// The encoded stage map `map` runs, from the plan file `path`: a plain
/// plan whole; from a stage file only the shared part and this map's files
/// (read at their offsets), put together by the plugin.
///
/// # Errors
///
/// A file that cannot be read, a stage file that is truncated or lacks the
/// map, or files the plugin refuses; each names the file and the map.
pub fn read_task_plan(plugin: &Plugin, path: &Path, map: u64) -> Result<Vec<u8>> {
    match read_pieces(path, map)? {
        PlanRead::Plain(bytes) => Ok(bytes),
        PlanRead::Cut(pieces) => {
            put_together(plugin, &pieces, map).map_err(|e| invalid(path, map, e))
        }
    }
}

/// What a task of map `map` needs of the plan file `path`, to hand over by
/// value: a plain plan whole, of a stage file its [`one_map`] copy, read at
/// its offsets.
///
/// # Errors
///
/// As [`read_task_plan`], without the plugin's part.
pub fn read_one_map(path: &Path, map: u64) -> Result<Vec<u8>> {
    match read_pieces(path, map)? {
        PlanRead::Plain(bytes) => Ok(bytes),
        PlanRead::Cut(pieces) => Ok(write(map, &pieces.shared, &[&pieces.files])),
    }
}

/// A plan file as read for one map.
enum PlanRead {
    /// A plain encoded plan, whole.
    Plain(Vec<u8>),
    /// A stage file's shared part and the map's files.
    Cut(Pieces),
}

fn read_pieces(path: &Path, map: u64) -> Result<PlanRead> {
    let mut file = File::open(path).map_err(|e| RuntimeError::io("cannot read plan", path, e))?;
    let mut head = vec![0u8; HEADER_BYTES];
    let read = read_up_to(&mut file, &mut head)
        .map_err(|e| RuntimeError::io("cannot read plan", path, e))?;
    head.truncate(read);
    let header = Header::parse(&head).map_err(|e| invalid(path, map, e))?;
    let Some(header) = header else {
        let mut bytes = head;
        file.read_to_end(&mut bytes)
            .map_err(|e| RuntimeError::io("cannot read plan", path, e))?;
        return Ok(PlanRead::Plain(bytes));
    };
    let pieces = (|| -> std::io::Result<std::result::Result<Pieces, String>> {
        let mut shared = vec![
            0u8;
            usize::try_from(header.shared)
                .unwrap_or(usize::MAX)
                .min(1 << 34)
        ];
        file.read_exact(&mut shared)?;
        let at = match header.offsets_at(map) {
            Ok(at) => at,
            Err(e) => return Ok(Err(e)),
        };
        file.seek(SeekFrom::Start(at))?;
        let mut offsets = [0u8; 16];
        file.read_exact(&mut offsets)?;
        let (start, end) = span(&offsets);
        if end < start {
            return Ok(Err(format!("map {map}'s files end before they begin")));
        }
        file.seek(SeekFrom::Start(header.files_at() + start))?;
        let mut files = vec![0u8; usize::try_from(end - start).unwrap_or(usize::MAX)];
        file.read_exact(&mut files)?;
        Ok(Ok(Pieces { shared, files }))
    })()
    .map_err(|e| RuntimeError::io("cannot read plan", path, e))?
    .map_err(|e| invalid(path, map, e))?;
    Ok(PlanRead::Cut(pieces))
}

/// [`read_task_plan`] for a plan handed over by value (`bytes`: a plain
/// plan, a stage file, or its [`one_map`] copy); `what` names it in errors.
///
/// # Errors
///
/// As [`read_task_plan`].
pub fn task_plan_from_bytes(plugin: &Plugin, bytes: Vec<u8>, map: u64) -> Result<Vec<u8>> {
    let what = Path::new("the plan handed over");
    let Some(header) = Header::parse(&bytes).map_err(|e| invalid(what, map, e))? else {
        return Ok(bytes);
    };
    let pieces = slice(&bytes, &header, map).map_err(|e| invalid(what, map, e))?;
    put_together(plugin, &pieces, map).map_err(|e| invalid(what, map, e))
}

/// A copy of the stage file `bytes` holding map `map`'s files only (a
/// plain plan as it is): what a task on another node needs of it.
///
/// # Errors
///
/// A stage file that is truncated or lacks the map.
pub fn one_map(bytes: &[u8], map: u64) -> std::result::Result<Vec<u8>, String> {
    let Some(header) = Header::parse(bytes)? else {
        return Ok(bytes.to_vec());
    };
    let pieces = slice(bytes, &header, map)?;
    Ok(write(map, &pieces.shared, &[&pieces.files]))
}

fn slice(bytes: &[u8], header: &Header, map: u64) -> std::result::Result<Pieces, String> {
    let truncated = || format!("a stage file of {} bytes is truncated", bytes.len());
    let range = |start: u64, len: u64| -> std::result::Result<&[u8], String> {
        let start = usize::try_from(start).map_err(|_| truncated())?;
        let end = start
            .checked_add(usize::try_from(len).map_err(|_| truncated())?)
            .ok_or_else(truncated)?;
        bytes.get(start..end).ok_or_else(truncated)
    };
    let shared = range(HEADER_BYTES as u64, header.shared)?.to_vec();
    let offsets: [u8; 16] = range(header.offsets_at(map)?, 16)?
        .try_into()
        .map_err(|_| truncated())?;
    let (start, end) = span(&offsets);
    if end < start {
        return Err(format!("map {map}'s files end before they begin"));
    }
    let files = range(header.files_at() + start, end - start)?.to_vec();
    Ok(Pieces { shared, files })
}

/// A map's start and end among the maps' files.
fn span(offsets: &[u8; 16]) -> (u64, u64) {
    let start = u64::from_le_bytes(offsets[..8].try_into().expect("8"));
    let end = u64::from_le_bytes(offsets[8..].try_into().expect("8"));
    (start, end)
}

fn put_together(
    plugin: &Plugin,
    pieces: &Pieces,
    map: u64,
) -> std::result::Result<Vec<u8>, String> {
    let Some(stage_for_map) = plugin.module().stage_for_map() else {
        return Err(format!(
            "the plugin {} cannot put a map's files into its stage (built before stage_for_map)",
            plugin.path().display()
        ));
    };
    match stage_for_map(
        RSlice::from_slice(&pieces.shared),
        RSlice::from_slice(&pieces.files),
        map,
    ) {
        RResult::ROk(bytes) => Ok(bytes.into_vec()),
        RResult::RErr(message) => Err(message.into_string()),
    }
}

fn invalid(path: &Path, map: u64, what: String) -> RuntimeError {
    RuntimeError::Invalid(format!("map {map}: plan {}: {what}", path.display()))
}

/// Read into `buf` until it is full or the file ends; the bytes read.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut read = 0;
    while read < buf.len() {
        match file.read(&mut buf[read..])? {
            0 => break,
            n => read += n,
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_sliced_from_the_whole_file_and_from_its_one_map_copy() {
        let maps: [&[u8]; 3] = [b"zero", b"", b"two!"];
        let file = write(0, b"shared", &maps);
        let header = Header::parse(&file).unwrap().unwrap();
        for (map, files) in maps.iter().enumerate() {
            let pieces = slice(&file, &header, map as u64).unwrap();
            assert_eq!(pieces.shared, b"shared");
            assert_eq!(pieces.files, *files);
            let copy = one_map(&file, map as u64).unwrap();
            let copy_header = Header::parse(&copy).unwrap().unwrap();
            assert_eq!(
                slice(&copy, &copy_header, map as u64).unwrap().files,
                *files
            );
            let other = (map as u64 + 1) % 3;
            let err = slice(&copy, &copy_header, other).err().unwrap();
            assert!(err.contains(&format!("map {other} out of range")), "{err}");
        }
        let err = slice(&file, &header, 3).err().unwrap();
        assert!(
            err.contains("map 3 out of range: it holds the files of 3 map(s), maps 0..3"),
            "{err}"
        );
    }

    #[test]
    fn a_truncated_file_is_refused_and_a_plain_plan_passes() {
        let file = write(0, b"shared", &[b"zero"]);
        for len in 0..file.len() {
            let cut = &file[..len];
            let outcome = Header::parse(cut).and_then(|header| match header {
                None => Ok(()),
                Some(header) => slice(cut, &header, 0).map(|_| ()),
            });
            if len >= 4 {
                assert!(outcome.is_err(), "{len} bytes passed");
            }
        }
        assert!(Header::parse(b"\x0a\x02plain").unwrap().is_none());
    }
}
