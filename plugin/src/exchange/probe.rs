//! A driver's check of its shuffle location, before anything is planned or
//! run: one implementation, which every host calls through the root module.
//!
//! Stage ids restart at 1 for every plan, and a reader takes any committed
//! map it finds for its stage. A second query in the same location would read
//! the first one's buckets (a confusing schema error at best, silently the old
//! answer at worst), and its writers would overwrite objects a reader of the
//! first may still be reading. The nodes cannot tell whose file they see; the
//! driver, before building anything, can. So a location is refused when it
//! holds stage output (an entry matching [`PARTITION_GLOB`]); other entries a
//! caller keeps there do not count.
//!
//! An S3 location is also probed: one listing, with few retries and short
//! timeouts, so an unreachable endpoint, a missing bucket or refused
//! credentials fail once, in seconds, naming the URL, before any worker
//! starts. Two drivers starting on one empty prefix at once are told apart
//! by a lock object created with `If-None-Match: *` (S3's create-only PUT):
//! exactly one of them creates it. A local directory is locked by the host
//! instead (`flock`, held for the run), which S3 has no equivalent of.

use std::sync::mpsc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig,
};

use crate::exchange::store::{S3Location, S3Options, ShuffleLocation};
use crate::paths::PARTITION_GLOB;

/// How long the probe may take, retries included: a wrong endpoint fails the
/// query in seconds, not after the data path's minutes of retries.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Name of the lock object a driver creates in an S3 prefix it runs in.
pub use dfx_abi::lock::S3_LOCK_OBJECT;

/// Refuse `location` if it holds stage output, or, for S3, if it cannot be
/// reached or another driver holds it; lock an S3 prefix for this driver.
///
/// # Errors
///
/// One message naming the location and what is wrong with it.
pub fn probe_location(location: &str, options: &S3Options) -> Result<(), String> {
    match ShuffleLocation::parse(std::path::Path::new(location)).map_err(|e| e.to_string())? {
        ShuffleLocation::Local(dir) => probe_local(&dir),
        ShuffleLocation::S3(s3) => {
            let url = s3.url();
            probe_s3(s3, options.clone()).map_err(|e| format!("shuffle location {url}: {e}"))
        }
    }
}

fn probe_local(dir: &std::path::Path) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // A directory that does not exist yet holds nothing.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(format!("cannot list {}: {err}", dir.display())),
    };
    let stale: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| is_stage_output(name))
        .collect();
    refuse_stale(&dir.display().to_string(), stale, "directory", "files")
}

fn refuse_stale(
    location: &str,
    mut stale: Vec<String>,
    kind: &str,
    what: &str,
) -> Result<(), String> {
    if stale.is_empty() {
        return Ok(());
    }
    stale.sort();
    Err(format!(
        "shuffle {kind} {location} already holds stage output {stale:?}; a reader takes the \
         {what} of its stage when it finds them, so this query would return the previous \
         query's results. Use one shuffle {kind} per query."
    ))
}

/// Whether `name` matches [`PARTITION_GLOB`] (`stage-*`).
fn is_stage_output(name: &str) -> bool {
    let prefix = PARTITION_GLOB.trim_end_matches('*');
    name.starts_with(prefix)
}

/// Run the S3 probe on the plugin's I/O runtime and wait for it here: a
/// driver calls this once, before any task, from any thread.
fn probe_s3(s3: S3Location, options: S3Options) -> Result<(), String> {
    let (done, answer) = mpsc::channel();
    super::io::spawn_detached(async move {
        let _ = done.send(probe_s3_async(&s3, &options).await);
    })?;
    answer
        .recv_timeout(PROBE_TIMEOUT + Duration::from_secs(5))
        .unwrap_or_else(|_| {
            Err(format!(
                "cannot reach the S3 endpoint: no answer in {PROBE_TIMEOUT:?}"
            ))
        })
}

async fn probe_s3_async(s3: &S3Location, options: &S3Options) -> Result<(), String> {
    let store = probe_client(&s3.bucket, options)?;
    let prefix = (!s3.prefix.is_empty()).then(|| ObjectPath::from(s3.prefix.as_str()));
    let listing = tokio::time::timeout(PROBE_TIMEOUT, store.list_with_delimiter(prefix.as_ref()))
        .await
        .map_err(|_| {
            format!("cannot reach the S3 endpoint: no answer to a listing in {PROBE_TIMEOUT:?}")
        })?
        .map_err(|e| why(&e))?;
    let names: Vec<String> = listing
        .common_prefixes
        .iter()
        .chain(listing.objects.iter().map(|o| &o.location))
        .filter_map(|p| p.filename().map(str::to_string))
        .collect();
    let stale: Vec<String> = names
        .iter()
        .filter(|n| is_stage_output(n))
        .cloned()
        .collect();
    refuse_stale(&s3.url(), stale, "location", "objects")?;
    let lock = match &prefix {
        Some(prefix) => prefix.clone().join(S3_LOCK_OBJECT),
        None => ObjectPath::from(S3_LOCK_OBJECT),
    };
    // Who holds it, for a cleaner on this machine to tell a live driver.
    let body = serde_json::to_string(&dfx_abi::lock::S3LockHolder::this_process())
        .map_err(|e| format!("cannot write the lock object's body: {e}"))?;
    let create = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match tokio::time::timeout(
        PROBE_TIMEOUT,
        store.put_opts(&lock, PutPayload::from(body.into_bytes()), create),
    )
    .await
    {
        Err(_) => Err(format!(
            "cannot reach the S3 endpoint: no answer to creating the lock object in \
             {PROBE_TIMEOUT:?}"
        )),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(object_store::Error::AlreadyExists { .. }))
        | Ok(Err(object_store::Error::Precondition { .. })) => Err(format!(
            "another driver holds this location: its lock object {S3_LOCK_OBJECT} exists. A \
             location serves one query; use a fresh prefix"
        )),
        Ok(Err(e)) => Err(format!("cannot create the lock object {lock}: {}", why(&e))),
    }
}

/// The failure in words, then object_store's own message.
fn why(e: &object_store::Error) -> String {
    let text = e.to_string();
    let has = |s: &str| text.contains(s);
    // A status code as a word of its own: "403" also occurs inside the
    // elapsed time object_store prints ("in 105.403377ms").
    let has_word = |w: &str| {
        text.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| word == w)
    };
    let no_keys = std::env::var_os("AWS_ACCESS_KEY_ID").is_none();
    let what = if has("NoSuchBucket") || has("bucket does not exist") {
        "the bucket does not exist"
    } else if no_keys && has("credential") {
        // Without keys the client asks the cloud's instance metadata service
        // for credentials, and that failure is the one it reports.
        "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are unset and no \
         instance credentials answered"
    } else if has("InvalidAccessKeyId")
        || has("SignatureDoesNotMatch")
        || has("AccessDenied")
        || has_word("403")
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

/// A client for the probe: the data path's settings (see
/// [`super::store::s3_store`]), but few retries and short timeouts.
fn probe_client(bucket: &str, options: &S3Options) -> Result<impl ObjectStore, String> {
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
    builder = super::store::apply_options(builder, options);
    builder
        .build()
        .map_err(|e| format!("cannot configure S3: {e}"))
}

#[cfg(test)]
mod tests {
    use super::why;

    fn generic(message: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: message.into(),
        }
    }

    #[test]
    fn a_connection_failure_is_unreachable_even_when_its_time_holds_403() {
        let failed = generic(
            "Error performing list request: Error performing GET http://127.0.0.1:1/b in \
             105.403377ms, after 1 retries - HTTP error: error sending request",
        );
        assert!(
            why(&failed).starts_with("cannot reach the S3 endpoint"),
            "{}",
            why(&failed)
        );
        let denied = generic("Client error with status 403 Forbidden: <Error/>");
        assert!(
            why(&denied).starts_with("the S3 endpoint refused the credentials"),
            "{}",
            why(&denied)
        );
    }
}
