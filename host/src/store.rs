//! The shuffle location as the driver sees it: a local directory (a path or
//! `file://`) or an `s3://bucket/prefix` URL.
//!
//! The plugin does all reading and writing of stage output; the driver only
//! checks a location up front, before any task runs:
//!
//! - a local directory must hold no `stage-*` entry (see
//!   [`crate::driver::require_empty_shuffle`]);
//! - an S3 location is probed by listing its prefix, so an unreachable
//!   endpoint, a missing bucket or refused credentials each fail once, naming
//!   the URL, and it must hold no object under `prefix/stage-*`.
//!
//! Endpoint, region and credentials come from the standard AWS environment
//! variables, then from the spec's `store_options` (the plugin's
//! `dfx_engine.s3_*` keys), as the plugin builds its own client.

use std::path::{Path, PathBuf};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};

use crate::error::{HostError, Result};
use crate::session::SessionSpec;

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

/// How long the probe may take, retries included: a wrong endpoint fails
/// the query in seconds, not after the data path's minutes of retries.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

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
                return Err(HostError::Invalid(format!(
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
            return Err(HostError::Invalid(format!(
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

/// Probe the S3 location `url` (`bucket`, `prefix`) and refuse it when it
/// already holds stage output (any entry under `prefix/` matching `glob`).
///
/// # Errors
///
/// [`HostError::Invalid`] naming the URL: a client that cannot be
/// configured, a listing that fails (unreachable endpoint, missing bucket,
/// refused credentials: each said in words, with the store's message), or
/// stage output found.
pub async fn require_empty_s3(
    url: &str,
    bucket: &str,
    prefix: &str,
    spec: &SessionSpec,
    glob_match: impl Fn(&str) -> bool,
) -> Result<()> {
    let store = probe_client(bucket, spec)
        .map_err(|e| HostError::Invalid(format!("shuffle location {url}: {e}")))?;
    let prefix = (!prefix.is_empty()).then(|| ObjectPath::from(prefix));
    let listing = tokio::time::timeout(PROBE_TIMEOUT, store.list_with_delimiter(prefix.as_ref()))
        .await
        .map_err(|_| {
            HostError::Invalid(format!(
                "shuffle location {url}: cannot reach the S3 endpoint: no answer to a listing in \
                 {PROBE_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| HostError::Invalid(format!("shuffle location {url}: {}", why(&e))))?;
    let mut stale: Vec<String> = listing
        .common_prefixes
        .iter()
        .chain(listing.objects.iter().map(|o| &o.location))
        .filter_map(|p| p.filename().map(str::to_string))
        .filter(|name| glob_match(name))
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    stale.sort();
    Err(HostError::Invalid(format!(
        "shuffle location {url} already holds stage output {stale:?}; a reader takes the \
         objects of its stage when it finds them, so this query would return the previous \
         query's results. Use one shuffle location per query."
    )))
}

/// The failure of the probe in words, then object_store's own message.
fn why(e: &object_store::Error) -> String {
    let text = e.to_string();
    let has = |s: &str| text.contains(s);
    let what = if has("NoSuchBucket") || has("bucket does not exist") {
        "the bucket does not exist"
    } else if has("InvalidAccessKeyId")
        || has("SignatureDoesNotMatch")
        || has("AccessDenied")
        || has("403")
        || has("credential")
    {
        "the S3 endpoint refused the credentials"
    } else if has("error sending request")
        || has("connect")
        || has("Connection refused")
        || has("dns error")
        || has("timed out")
    {
        "cannot reach the S3 endpoint"
    } else {
        "cannot list the location"
    };
    format!("{what}: {text}")
}

/// A client for the probe: the plugin's settings, but few retries and short
/// timeouts, so a bad location fails in seconds.
fn probe_client(bucket: &str, spec: &SessionSpec) -> std::result::Result<impl ObjectStore, String> {
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 1,
            retry_timeout: Duration::from_secs(10),
        })
        // Through config keys: `with_client_options` would replace what the
        // environment set (`AWS_ALLOW_HTTP` among it).
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
            "5s",
        )
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "15s");
    let option = |key: &str| {
        spec.store_options
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    if let Some(endpoint) = option(S3_ENDPOINT) {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = option(S3_REGION) {
        builder = builder.with_region(region);
    }
    if option(S3_ALLOW_HTTP) == Some("true") {
        builder = builder.with_allow_http(true);
    }
    if builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .is_none()
    {
        builder = builder.with_region("us-east-1");
    }
    builder
        .build()
        .map_err(|e| format!("cannot configure S3: {e}"))
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
