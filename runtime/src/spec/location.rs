//! The shuffle location as the driver sees it: a local directory (a path or
//! `file://`) or an `s3://bucket/prefix` URL.
//!
//! The plugin does all reading and writing of stage output, and checks a
//! location up front for the driver (its `probe_location` export: no
//! `stage-*` entry, an S3 endpoint that answers, a bucket that exists,
//! credentials it accepts). The driver only needs to know where envelopes go
//! and whether two spellings name one location.

use std::path::{Path, PathBuf};

use crate::error::{Result, RuntimeError};

/// Scheme of an S3 location.
pub const S3_SCHEME: &str = "s3://";

/// Scheme of a local location spelled as a URL.
pub const FILE_SCHEME: &str = "file://";

/// The spec's `store_options` key of the S3 endpoint (`dfx_engine.s3_endpoint`).
pub const S3_ENDPOINT: &str = "s3_endpoint";

/// The spec's `store_options` key of the S3 region (`dfx_engine.s3_region`).
pub const S3_REGION: &str = "s3_region";

/// The spec's `store_options` key allowing plain http (`dfx_engine.s3_allow_http`).
pub const S3_ALLOW_HTTP: &str = "s3_allow_http";

/// A parsed shuffle location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShuffleLocation {
    /// A local directory.
    Local(PathBuf),
    /// `s3://bucket/prefix`.
    S3 {
        /// The bucket.
        bucket: String,
        /// The key prefix, without leading or trailing `/`.
        prefix: String,
    },
}

impl ShuffleLocation {
    /// Parse a spec's `shuffle_dir`.
    ///
    /// # Errors
    ///
    /// An `s3://` URL without a bucket, or another scheme.
    pub fn parse(dir: &Path) -> Result<Self> {
        let Some(text) = dir.to_str() else {
            return Ok(Self::Local(dir.to_path_buf()));
        };
        if let Some(rest) = text.strip_prefix(S3_SCHEME) {
            let rest = rest.trim_end_matches('/');
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(RuntimeError::Invalid(format!(
                    "shuffle location {text}: no bucket after s3://"
                )));
            }
            return Ok(Self::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
            });
        }
        if let Some(path) = text.strip_prefix(FILE_SCHEME) {
            return Ok(Self::Local(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = text.split_once("://")
            && !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
        {
            return Err(RuntimeError::Invalid(format!(
                "shuffle location {text}: unsupported scheme {scheme}://; use a local path, \
                 file:// or s3://bucket/prefix"
            )));
        }
        Ok(Self::Local(dir.to_path_buf()))
    }

    /// Whether `dir` names a location by URL (`s3://`, `file://`) rather than
    /// a path: a URL is taken as written, never made absolute.
    pub fn is_url(dir: &Path) -> bool {
        dir.to_str().is_some_and(|d| d.contains("://"))
    }

    /// One spelling per location, to compare two: the local path, or
    /// `s3://bucket/prefix` without a trailing `/`.
    pub fn canonical(&self) -> String {
        match self {
            Self::Local(dir) => dir.components().collect::<PathBuf>().display().to_string(),
            Self::S3 { bucket, prefix } if prefix.is_empty() => format!("{S3_SCHEME}{bucket}"),
            Self::S3 { bucket, prefix } => format!("{S3_SCHEME}{bucket}/{prefix}"),
        }
    }
}

/// Whether `a` and `b` name the same location (as URLs: `file:///x` is `/x`,
/// a trailing `/` does not count).
pub fn same_location(a: &Path, b: &Path) -> bool {
    match (ShuffleLocation::parse(a), ShuffleLocation::parse(b)) {
        (Ok(a), Ok(b)) => a.canonical() == b.canonical(),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_compare_as_urls() {
        assert!(same_location(Path::new("s3://b/p"), Path::new("s3://b/p/")));
        assert!(!same_location(Path::new("s3://b/p"), Path::new("s3://b/q")));
        assert!(!same_location(Path::new("s3://b/p"), Path::new("s3:/b/p")));
        assert!(same_location(
            Path::new("file:///tmp/x"),
            Path::new("/tmp/x")
        ));
        assert!(same_location(Path::new("/tmp/x/"), Path::new("/tmp/x")));
        assert!(ShuffleLocation::parse(Path::new("gs://b/p")).is_err());
        assert!(ShuffleLocation::parse(Path::new("s3://")).is_err());
        assert!(ShuffleLocation::is_url(Path::new("s3://b")));
        assert!(!ShuffleLocation::is_url(Path::new("rel/dir")));
    }
}
