//! A check of a segment's Arrow IPC framing, before Arrow decodes it.
//!
//! Arrow's IPC reader trusts the sizes a stream declares: the metadata
//! length, a message's body length and, in a compressed batch, each buffer's
//! uncompressed length are allocated as read. A corrupt file declaring
//! 145 TB (found by fuzzing the reader) makes the allocation fail, and Rust
//! aborts the process on a failed allocation: no `catch_unwind` can save the
//! worker, or the driver reading the final stage. So every declared size is
//! checked against what the file can hold first, reading only the framing
//! (metadata, and the 8-byte prefix of each compressed buffer), never the
//! data:
//!
//! ```text
//! per message: [0xFFFFFFFF] [metadata length i32] [Message flatbuffer] [body]
//!   metadata length, body length  <= bytes left in the file
//!   each buffer (offset, length)  within the body
//!   compressed buffer: [uncompressed length i64] [LZ4 frame]
//!     uncompressed length <= what LZ4 can expand the frame to
//! a metadata length of 0 ends the stream
//! ```
//!
//! A dfx writer writes LZ4 frames or no compression: any other codec is a
//! file dfx did not write, refused too.

use std::fs::File;
use std::os::unix::fs::FileExt;

use datafusion::arrow::ipc::{CompressionType, MessageHeader, RecordBatch, root_as_message};

/// IPC's continuation marker before a message's metadata length.
const CONTINUATION: [u8; 4] = [0xff; 4];

/// An uncompressed-length prefix meaning "this buffer is not compressed".
const NOT_COMPRESSED: i64 = -1;

/// How far one byte of an LZ4 frame can expand: a match of 255 bytes
/// costs at least one byte, so 255, rounded up.
const LZ4_MAX_RATIO: u64 = 256;

/// Room for the frame header and a block's worth of literals.
const LZ4_SLACK: u64 = 1 << 16;

/// Where a stream's framing is read from: bytes in memory, or a range of a
/// file read a field at a time.
pub trait StreamSource {
    /// Bytes in the source.
    fn len(&self) -> u64;

    /// Whether the source holds no byte.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fill `buf` from byte `at` of the source.
    ///
    /// # Errors
    ///
    /// `at` plus `buf`'s length past the source's end, or a failed read.
    fn read_at(&self, at: u64, buf: &mut [u8]) -> Result<(), String>;
}

impl StreamSource for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read_at(&self, at: u64, buf: &mut [u8]) -> Result<(), String> {
        let bytes = usize::try_from(at)
            .ok()
            .and_then(|at| self.get(at..at.checked_add(buf.len())?))
            .ok_or_else(|| past_end(at, buf.len(), StreamSource::len(self)))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// A read of `want` bytes at `at` of a stream `len` long, refused.
fn past_end(at: u64, want: usize, len: u64) -> String {
    format!("cannot read {want} byte(s) at {at}: the stream ends at {len}")
}

/// `len` bytes of a file from `offset`: a bucket's range in its map file.
#[derive(Debug, Clone, Copy)]
pub struct FileRange<'a> {
    /// The file.
    pub file: &'a File,
    /// Where the range starts in it.
    pub offset: u64,
    /// The range's length.
    pub len: u64,
}

impl StreamSource for FileRange<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, at: u64, buf: &mut [u8]) -> Result<(), String> {
        let end = at.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.len) {
            return Err(past_end(at, buf.len(), self.len));
        }
        self.file
            .read_exact_at(buf, self.offset + at)
            .map_err(|e| format!("cannot read {} byte(s) at {at}: {e}", buf.len()))
    }
}

/// Check the framing of the Arrow IPC stream at the start of `data` (a
/// segment, or the first of a bucket's segments read whole); returns where
/// each of its messages ends, in order, the last being its length: up to
/// its end-of-stream marker, or all of `data` without one.
///
/// # Errors
///
/// The first declared size that does not fit, or framing that is not a
/// dfx-written stream, said with its byte offset.
pub fn check_stream_bytes(data: &[u8]) -> Result<Vec<usize>, String> {
    let ends = check_stream(data)?;
    Ok(ends.into_iter().map(|end| end as usize).collect())
}

/// [`check_stream_bytes`] of any [`StreamSource`], reading only the
/// framing: a file's messages are then read each into a buffer of its own.
///
/// # Errors
///
/// As [`check_stream_bytes`].
pub fn check_stream<S: StreamSource + ?Sized>(data: &S) -> Result<Vec<u64>, String> {
    let len = data.len();
    let mut at = 0u64;
    let mut ends = Vec::new();
    loop {
        let left = len.saturating_sub(at);
        if left == 0 {
            // A stream may end without its end-of-stream marker.
            if ends.last() != Some(&len) {
                ends.push(len);
            }
            return Ok(ends);
        }
        let mut word = [0u8; 4];
        data.read_at(at, &mut word)?;
        at += 4;
        if word == CONTINUATION {
            data.read_at(at, &mut word)?;
            at += 4;
        }
        let meta_len = i32::from_le_bytes(word);
        if meta_len == 0 {
            ends.push(at);
            return Ok(ends);
        }
        let left = len.saturating_sub(at);
        if meta_len < 0 || meta_len as u64 > left {
            return Err(format!(
                "a message at byte {at} declares {meta_len} byte(s) of metadata, {left} left"
            ));
        }
        let mut meta = vec![0u8; meta_len as usize];
        data.read_at(at, &mut meta)?;
        at += meta_len as u64;
        let message = root_as_message(&meta)
            .map_err(|e| format!("a message at byte {at} is malformed: {e}"))?;
        let body_len = message.bodyLength();
        let left = len.saturating_sub(at);
        if body_len < 0 || body_len as u64 > left {
            return Err(format!(
                "a message at byte {at} declares a body of {body_len} byte(s), {left} left"
            ));
        }
        let batch = match message.header_type() {
            MessageHeader::RecordBatch => message.header_as_record_batch(),
            MessageHeader::DictionaryBatch => {
                message.header_as_dictionary_batch().and_then(|d| d.data())
            }
            _ => None,
        };
        if let Some(batch) = batch {
            check_buffers(data, at, body_len as u64, &batch)?;
        }
        at += body_len as u64;
        ends.push(at);
    }
}

/// Every buffer of `batch` lies within its body (at `body` in the file,
/// `body_len` long), and no compressed one expands beyond what LZ4 can.
fn check_buffers<S: StreamSource + ?Sized>(
    data: &S,
    body: u64,
    body_len: u64,
    batch: &RecordBatch<'_>,
) -> Result<(), String> {
    let compressed = match batch.compression() {
        None => false,
        Some(c) if c.codec() == CompressionType::LZ4_FRAME => true,
        Some(c) => {
            return Err(format!(
                "a batch at byte {body} is compressed with {:?}; dfx writes LZ4 frames or no \
                 compression",
                c.codec()
            ));
        }
    };
    for buffer in batch.buffers().into_iter().flatten() {
        let (offset, length) = (buffer.offset(), buffer.length());
        if offset < 0 || length < 0 || (offset as u64).saturating_add(length as u64) > body_len {
            return Err(format!(
                "a batch at byte {body} has a buffer of {length} byte(s) at offset {offset}, \
                 outside its body of {body_len}"
            ));
        }
        if !compressed || length < 8 {
            // Empty, or too short for a prefix (Arrow refuses it itself).
            continue;
        }
        let mut prefix = [0u8; 8];
        data.read_at(body + offset as u64, &mut prefix)?;
        let uncompressed = i64::from_le_bytes(prefix);
        let frame = length as u64 - 8;
        let most = frame
            .saturating_mul(LZ4_MAX_RATIO)
            .saturating_add(LZ4_SLACK);
        if uncompressed != NOT_COMPRESSED && (uncompressed < 0 || uncompressed as u64 > most) {
            return Err(format!(
                "a buffer at byte {} declares {uncompressed} uncompressed byte(s) from an LZ4 \
                 frame of {frame}",
                body + offset as u64
            ));
        }
    }
    Ok(())
}
