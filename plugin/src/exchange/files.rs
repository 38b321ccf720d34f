//! Bucket files: Arrow IPC streams (LZ4-compressed unless the session turns
//! it off), written under a temp name and published by rename.
//!
//! File I/O happens inline, on the thread polling the stream, rather than on
//! a blocking pool: the plugin has its own copy of tokio and no runtime of its
//! own, so it cannot spawn onto the host's. Writes go through a `BufWriter`,
//! one IPC message per coalesced batch, so there is no storm of small writes.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use datafusion::arrow::datatypes::{Fields, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::CompressionType;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use datafusion::arrow::record_batch::RecordBatch;
use dfx_abi::IO_FAILURE;

use crate::config::ShuffleCompression;
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
/// names need no such flag: a rename replaces a link rather than following it.
pub fn create_exclusive(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Write `bytes` to a temp file beside `path`, then rename it to `path`.
///
/// No fsync, here or for bucket files: the readers are processes on this
/// host, which see a renamed file whole through the page cache, and the
/// rename is what makes the publish atomic. Durability across a machine
/// crash is not a property of the shuffle (that query is run again), and a
/// sync per file was most of an empty task's time.
pub fn publish_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temp = TempFile::new(temp_path(path));
    let mut file = create_exclusive(temp.path())?;
    file.write_all(bytes)?;
    drop(file);
    temp.publish(path)
}

/// One bucket's file while a map task writes it.
pub struct BucketFile {
    writer: StreamWriter<BufWriter<File>>,
    temp: TempFile,
    rows: u64,
}

impl BucketFile {
    /// Start the bucket file that will be published as `final_path`.
    pub fn create(
        final_path: &Path,
        schema: &SchemaRef,
        compression: ShuffleCompression,
    ) -> Result<Self, String> {
        let temp = TempFile::new(temp_path(final_path));
        let file = create_exclusive(temp.path())
            .map_err(|e| format!("{IO_FAILURE}: cannot create {}: {e}", temp.path().display()))?;
        let codec = match compression {
            ShuffleCompression::Lz4 => Some(CompressionType::LZ4_FRAME),
            ShuffleCompression::None => None,
        };
        let options = IpcWriteOptions::default()
            .try_with_compression(codec)
            .map_err(|e| format!("cannot enable LZ4 compression: {e}"))?;
        let writer = StreamWriter::try_new_with_options(BufWriter::new(file), schema, options)
            .map_err(|e| format!("{IO_FAILURE}: cannot start {}: {e}", temp.path().display()))?;
        Ok(Self {
            writer,
            temp,
            rows: 0,
        })
    }

    /// Append one batch.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), String> {
        self.rows += batch.num_rows() as u64;
        self.writer.write(batch).map_err(|e| {
            format!(
                "{IO_FAILURE}: cannot write {}: {e}",
                self.temp.path().display()
            )
        })
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Finish the stream, flush it to the file (not synced: see
    /// [`publish_bytes`]) and rename it to `final_path`; returns the file's
    /// size in bytes.
    pub fn publish(mut self, final_path: &Path) -> Result<u64, String> {
        let temp = self.temp.path().display().to_string();
        self.writer
            .finish()
            .map_err(|e| format!("{IO_FAILURE}: cannot finish {temp}: {e}"))?;
        let file = self
            .writer
            .into_inner()
            .map_err(|e| format!("{IO_FAILURE}: cannot flush {temp}: {e}"))?
            .into_inner()
            .map_err(|e| format!("{IO_FAILURE}: cannot flush {temp}: {}", e.error()))?;
        let bytes = file
            .metadata()
            .map_err(|e| format!("{IO_FAILURE}: cannot stat {temp}: {e}"))?
            .len();
        drop(file);
        self.temp.publish(final_path).map_err(|e| {
            format!(
                "{IO_FAILURE}: cannot publish {temp} as {}: {e}",
                final_path.display()
            )
        })?;
        Ok(bytes)
    }
}

/// Open a published bucket file for reading.
pub fn open_bucket(
    path: &Path,
) -> std::io::Result<Result<StreamReader<BufReader<File>>, ArrowError>> {
    let file = File::open(path)?;
    Ok(StreamReader::try_new(BufReader::new(file), None))
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
