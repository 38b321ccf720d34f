//! Map files: segments of Arrow IPC (LZ4-compressed unless the session turns
//! it off) closed by the commit marker, written under a temp name and
//! published by a link that never replaces a published file.
//!
//! File I/O happens inline, on the thread polling the stream, rather than on
//! a blocking pool: the plugin has its own copy of tokio and no runtime of its
//! own, so it cannot spawn onto the host's. Each write is one whole segment
//! (a coalesced batch), so there is no storm of small writes.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::{Fields, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::CompressionType;
use datafusion::arrow::ipc::reader::StreamDecoder;
use datafusion::arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use datafusion::arrow::record_batch::RecordBatch;

use crate::config::ShuffleCompression;
use crate::error::io_failure;
use crate::exchange::ipc_check::{FileRange, check_stream, check_stream_bytes};
use crate::guard;
use crate::paths::temp_path;

/// A temp file removed on drop unless it was published.
#[derive(Debug)]
pub struct TempFile {
    temp: Option<PathBuf>,
}

impl TempFile {
    /// Claim `temp`: from now on it is removed unless published.
    pub fn new(temp: PathBuf) -> Self {
        Self { temp: Some(temp) }
    }

    /// The temp file's path.
    pub fn path(&self) -> &Path {
        self.temp.as_deref().unwrap_or(Path::new(""))
    }

    /// Rename into place; from now on the file is not ours to remove.
    pub fn publish(&mut self, to: &Path) -> std::io::Result<()> {
        if let Some(temp) = &self.temp {
            std::fs::rename(temp, to)?;
            self.temp = None;
        }
        Ok(())
    }

    /// Publish as `to` unless a file is already published there: link the
    /// temp file to its name, which fails rather than replacing anything
    /// (and does not follow a link planted there). Answers whether this file
    /// is the one published; either way the temp name is removed.
    ///
    /// Two attempts of one map (a retry after a lost report, a speculative
    /// twin) both publish; the first keeps its file, so a reader never sees
    /// a map file change under it.
    pub fn publish_new(&mut self, to: &Path) -> std::io::Result<bool> {
        let Some(temp) = &self.temp else {
            return Ok(false);
        };
        match std::fs::hard_link(temp, to) {
            Ok(()) => Ok(true),
            // Kept only if it is a file another attempt published: a
            // directory or a link planted at the name is an error.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match std::fs::symlink_metadata(to) {
                    Ok(meta) if meta.file_type().is_file() => Ok(false),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
        // Dropping `self` removes the temp name: the published file is the
        // link, and a kept one is another attempt's.
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            // Best effort: the file may never have been created.
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Create `path` for writing, failing if anything exists there.
///
/// Exclusive (`O_CREAT | O_EXCL`, which POSIX says also fails on a symlink,
/// dangling or not) and `O_NOFOLLOW` besides: a file or link planted at a
/// temp name by someone else is an error, never written through. Published
/// names need no such flag: a publish links, which neither follows nor
/// replaces anything at the name.
pub fn create_exclusive(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// As [`create_exclusive`], open for reading too: a spill file is read
/// back through the same handle.
pub fn create_exclusive_rw(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Encode `batches` as one segment: a self-contained Arrow IPC stream
/// (schema, batches, end of stream), its buffers LZ4-compressed unless
/// `compression` is none. Self-contained so a reader needs no other bytes
/// of the file to decode it, dictionaries included.
///
/// # Errors
///
/// The encoder's failure.
pub fn encode_segment(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    compression: ShuffleCompression,
) -> Result<Vec<u8>, String> {
    let codec = match compression {
        ShuffleCompression::Lz4 => Some(CompressionType::LZ4_FRAME),
        ShuffleCompression::None => None,
    };
    let options = IpcWriteOptions::default()
        .try_with_compression(codec)
        .map_err(|e| format!("cannot enable LZ4 compression: {e}"))?;
    // Sized for the batch up front (a coalesced batch owns its buffers, so
    // its memory size is about its encoded size), so that the encoder does
    // not copy what it wrote each time the buffer grows. The schema and
    // message headers are small beside it.
    let capacity: usize = batches
        .iter()
        .map(|batch| batch.get_array_memory_size() + 512)
        .sum::<usize>()
        + 4096;
    let mut writer =
        StreamWriter::try_new_with_options(Vec::with_capacity(capacity), schema, options)
            .map_err(|e| format!("cannot encode a segment: {e}"))?;
    batches
        .iter()
        .try_for_each(|batch| writer.write(batch))
        .and_then(|()| writer.finish())
        .map_err(|e| format!("cannot encode a segment: {e}"))?;
    writer
        .into_inner()
        .map_err(|e| format!("cannot encode a segment: {e}"))
}

/// A map's file while its task writes it: segments appended under a temp
/// name, published by rename. Each segment is written whole by one call, so
/// there is no storm of small writes and no buffer to flush.
///
/// Every failure of its storage is an [`dfx_abi::IO_FAILURE`] error naming
/// the file, and records [`dfx_abi::FailureClass::Io`] for the shuffle
/// location (see [`crate::error`]): another attempt may succeed.
pub struct MapFile {
    file: File,
    temp: TempFile,
    /// The shuffle location the file is under.
    location: PathBuf,
    bytes: u64,
}

impl MapFile {
    /// Create the temp file that will be published as `final_path`, a map
    /// file of the shuffle location `location`.
    ///
    /// # Errors
    ///
    /// The file's creation, naming it (a storage failure).
    pub fn create(location: &Path, final_path: &Path) -> Result<Self, String> {
        let temp = TempFile::new(temp_path(final_path));
        let file = create_exclusive(temp.path()).map_err(|e| {
            io_failure(
                location,
                format!("cannot create {}: {e}", temp.path().display()),
            )
        })?;
        Ok(Self {
            file,
            temp,
            location: location.to_path_buf(),
            bytes: 0,
        })
    }

    /// Bytes written so far: where the next segment starts.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing is written yet.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Append one encoded segment.
    ///
    /// # Errors
    ///
    /// The write's failure (a full disk), naming the file.
    pub fn append(&mut self, segment: &[u8]) -> Result<(), String> {
        self.file.write_all(segment).map_err(|e| {
            io_failure(
                &self.location,
                format!("cannot write {}: {e}", self.temp.path().display()),
            )
        })?;
        self.bytes += segment.len() as u64;
        Ok(())
    }

    /// Append `len` bytes of `from` starting at `offset` (a spilled
    /// segment), copied file to file: on Linux the kernel moves them
    /// between the two files' pages, where a read and a write would pass
    /// them through a fresh buffer of this process.
    ///
    /// # Errors
    ///
    /// A read or write failure, or `from` ending early, naming this file.
    pub fn append_range(&mut self, from: &File, offset: u64, len: u64) -> Result<(), String> {
        let fail = |e: String| {
            io_failure(
                &self.location,
                format!(
                    "cannot copy a spilled segment into {}: {e}",
                    self.temp.path().display()
                ),
            )
        };
        let mut from = from;
        from.seek(SeekFrom::Start(offset))
            .map_err(|e| fail(e.to_string()))?;
        let copied =
            std::io::copy(&mut from.take(len), &mut self.file).map_err(|e| fail(e.to_string()))?;
        if copied != len {
            return Err(fail(format!(
                "the spill file ends {copied} byte(s) into a segment of {len}"
            )));
        }
        self.bytes += len;
        Ok(())
    }

    /// Publish the file as `final_path`, unless another attempt of its map
    /// published one there first (see [`TempFile::publish_new`]); answers
    /// whether this file is the one published.
    ///
    /// No fsync: the readers are processes on this host, which see a
    /// renamed file whole through the page cache, and the rename is what
    /// makes the publish atomic. Durability across a machine crash is not a
    /// property of the shuffle (that query is run again), and a sync per
    /// file was most of an empty task's time.
    ///
    /// # Errors
    ///
    /// The link's failure; the temp file is removed then.
    pub fn publish(mut self, final_path: &Path) -> Result<bool, String> {
        drop(self.file);
        crate::test_hooks::before_publish(final_path);
        self.temp.publish_new(final_path).map_err(|e| {
            io_failure(
                &self.location,
                format!(
                    "cannot publish {} as {}: {e}",
                    self.temp.path().display(),
                    final_path.display()
                ),
            )
        })
    }
}

/// Decode one segment (bytes a marker says hold `bucket`'s rows), checking
/// its framing first (see `ipc_check`) and catching a decoder panic: both
/// are a corrupt file, reported as the returned message.
///
/// # Errors
///
/// Why the bytes are not a readable Arrow IPC stream.
pub fn decode_segment(bytes: Vec<u8>) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    let mut streams = decode_segments(bytes)?;
    match (streams.pop(), streams.is_empty()) {
        (Some(stream), true) => Ok(stream),
        _ => Err("not a readable Arrow IPC stream: it holds more than one".to_string()),
    }
}

/// Decode the segments of `bytes`, one or more self-contained Arrow IPC
/// streams one after the other (a bucket's whole byte range): each
/// stream's schema and batches, in order. Each stream's framing is checked
/// before it is decoded, as [`decode_segment`] does.
///
/// # Errors
///
/// Why the bytes are not readable Arrow IPC streams, with the byte offset
/// of the stream at fault.
pub fn decode_segments(bytes: Vec<u8>) -> Result<Vec<(SchemaRef, Vec<RecordBatch>)>, String> {
    // A stream of one batch is decoded in place: an uncompressed batch's
    // arrays are slices of `bytes`, where a reader over a cursor would copy
    // every message body into a buffer of its own first. A stream of many
    // batches gives each message a buffer of its own: sliced from one
    // buffer, every batch would hold (and a memory pool would charge it)
    // the whole segment.
    let mut rest = Buffer::from_vec(bytes);
    let mut streams = Vec::new();
    let mut at = 0;
    while !rest.is_empty() {
        let ends = check_stream_bytes(rest.as_slice()).map_err(|why| {
            format!("not a readable Arrow IPC stream (the one at byte {at}): {why}")
        })?;
        let len = ends.last().copied().unwrap_or(0);
        // The schema, a batch and the end-of-stream marker: one batch.
        let parts = if ends.len() <= 3 {
            vec![rest.slice_with_length(0, len)]
        } else {
            let mut start = 0;
            ends.iter()
                .map(|&end| {
                    let part = Buffer::from(&rest.as_slice()[start..end]);
                    start = end;
                    part
                })
                .collect()
        };
        rest = rest.slice(len);
        streams.push(decode_stream(parts, at as u64)?);
        at += len;
    }
    some_streams(streams)
}

/// Decode the segments in `len` bytes of `file` from `offset` (a bucket's
/// byte range in its map file), as [`decode_segments`] decodes them in
/// memory: each stream's framing is checked by reading only it, then each
/// of its messages is read into a buffer of its own, which its batch's
/// arrays then slice. So the bytes are copied once, out of the file, and
/// no buffer the size of the range is made.
///
/// # Errors
///
/// A failed read, or why the bytes are not readable Arrow IPC streams,
/// with the byte offset (in the range) of the stream at fault.
pub(crate) fn read_segments(
    file: &File,
    offset: u64,
    len: u64,
) -> Result<Vec<(SchemaRef, Vec<RecordBatch>)>, String> {
    let mut streams = Vec::new();
    let mut at = 0;
    while at < len {
        let stream = FileRange {
            file,
            offset: offset + at,
            len: len - at,
        };
        let ends = check_stream(&stream).map_err(|why| {
            format!("not a readable Arrow IPC stream (the one at byte {at}): {why}")
        })?;
        let mut start = 0;
        let mut parts = Vec::with_capacity(ends.len());
        for end in ends {
            let message = read_range(file, stream.offset + start, end - start)
                .map_err(|e| format!("cannot read the message at byte {}: {e}", at + start))?;
            parts.push(Buffer::from_vec(message));
            start = end;
        }
        streams.push(decode_stream(parts, at)?);
        at += start;
    }
    some_streams(streams)
}

/// The streams decoded, refused when there is none (no bytes at all).
fn some_streams(
    streams: Vec<(SchemaRef, Vec<RecordBatch>)>,
) -> Result<Vec<(SchemaRef, Vec<RecordBatch>)>, String> {
    if streams.is_empty() {
        return Err("not a readable Arrow IPC stream: no bytes".to_string());
    }
    Ok(streams)
}

/// Decode one checked stream, given in consecutive parts, catching a
/// decoder panic; a failure names the stream's byte offset `at` in its
/// bytes, unless it is the first.
fn decode_stream(parts: Vec<Buffer>, at: u64) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    decode_parts(parts).map_err(|why| {
        if at == 0 {
            why
        } else {
            format!("{why} (the stream at byte {at})")
        }
    })
}

/// [`decode_stream`] without the offset in its message.
fn decode_parts(parts: Vec<Buffer>) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    // Arrow's IPC reader panics on some corrupt streams instead of failing
    // (fuzzing found a buffer offset beyond the message body).
    let decoded = guard::catch_decoder(move || -> Result<_, ArrowError> {
        let mut decoder = StreamDecoder::new();
        let mut batches = Vec::new();
        for mut buffer in parts {
            while let Some(batch) = decoder.decode(&mut buffer)? {
                batches.push(batch);
            }
        }
        decoder.finish()?;
        let schema = decoder
            .schema()
            .ok_or_else(|| ArrowError::IpcError("the stream holds no schema".to_string()))?;
        Ok((schema, batches))
    })
    .map_err(|panic| {
        format!("not a readable Arrow IPC stream: the decoder failed on it ({panic})")
    })?;
    decoded.map_err(|e| format!("not a readable Arrow IPC stream: {e}"))
}

/// Field lists agree on names, types and nullability, in order. Metadata is
/// not compared: it does not change how a batch reads.
pub fn same_fields(found: &Fields, expected: &Fields) -> bool {
    found.len() == expected.len()
        && found.iter().zip(expected.iter()).all(|(a, b)| {
            a.name() == b.name()
                && a.data_type() == b.data_type()
                && a.is_nullable() == b.is_nullable()
        })
}

/// `name: type[ not null], ...` for an error message.
pub fn describe_fields(fields: &Fields) -> String {
    fields
        .iter()
        .map(|f| {
            let null = if f.is_nullable() { "" } else { " not null" };
            format!("{}: {}{null}", f.name(), f.data_type())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `len` bytes of `file` from `offset`, into a buffer that is not zeroed
/// first (the read fills it).
pub(crate) fn read_range(mut file: &File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(offset))?;
    file.take(len).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the file ends {} byte(s) into the segment", bytes.len()),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(dir: &Path, final_path: &Path, bytes: &[u8]) -> Result<bool, String> {
        let mut file = MapFile::create(dir, final_path)?;
        file.append(bytes)?;
        file.publish(final_path)
    }

    #[test]
    fn the_first_publish_of_a_map_is_kept_and_a_second_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let stage = dir.path().join("stage-1");
        std::fs::create_dir_all(&stage).unwrap();
        let final_path = stage.join("0-map-0.arrow");
        assert!(publish(dir.path(), &final_path, b"first").unwrap());
        // A second attempt of the same map publishes too, and keeps nothing
        // of its own: the file is the first's.
        assert!(!publish(dir.path(), &final_path, b"second!").unwrap());
        assert_eq!(std::fs::read(&final_path).unwrap(), b"first");
        let names: Vec<_> = std::fs::read_dir(&stage)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["0-map-0.arrow"], "a temp file was left");
    }

    #[test]
    fn a_link_or_directory_at_the_published_name_fails_the_publish() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        let final_path = dir.path().join("0-map-0.arrow");
        std::os::unix::fs::symlink(&target, &final_path).unwrap();
        let err = publish(dir.path(), &final_path, b"rows").unwrap_err();
        assert!(err.contains("cannot publish"), "{err}");
        assert!(!target.exists(), "the publish wrote through a planted link");
        let taken = dir.path().join("1-map-1.arrow");
        std::fs::create_dir(&taken).unwrap();
        let err = publish(dir.path(), &taken, b"rows").unwrap_err();
        assert!(err.contains("cannot publish"), "{err}");
    }

    #[test]
    fn a_spilled_range_is_copied_whole_and_a_short_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().join("spill");
        std::fs::write(&spill, b"..abcdef").unwrap();
        let spill = File::open(&spill).unwrap();
        let final_path = dir.path().join("0-map-0.arrow");
        let mut file = MapFile::create(dir.path(), &final_path).unwrap();
        file.append(b"<").unwrap();
        file.append_range(&spill, 2, 4).unwrap();
        file.append_range(&spill, 6, 2).unwrap();
        assert_eq!(file.len(), 7);
        let err = file.append_range(&spill, 6, 5).unwrap_err();
        assert!(
            err.contains("the spill file ends 2 byte(s) into a segment of 5"),
            "{err}"
        );
        drop(file);
        let mut file = MapFile::create(dir.path(), &final_path).unwrap();
        file.append(b"<").unwrap();
        file.append_range(&spill, 2, 6).unwrap();
        assert!(file.publish(&final_path).unwrap());
        assert_eq!(std::fs::read(&final_path).unwrap(), b"<abcdef");
    }
}
