//! Where a shuffle lives: a local directory, or a prefix in an S3 bucket.
//!
//! ```text
//! /tmp/q1, file:///tmp/q1   local: temp file + rename (see `files`, `dirs`)
//! s3://bucket/prefix        objects: each map's file uploaded while it is
//!                           written (one PUT when small, a multipart upload
//!                           past PART_SIZE), its marker last, appearing
//!                           whole when complete; readers GET its tail (the
//!                           marker), then the byte ranges of their bucket's
//!                           segments
//! ```
//!
//! A location is parsed and compared by [`dfx_abi::location`], the one rule
//! the plugin and every host share; this module is what the plugin does with
//! a parsed one: object keys, S3 options, the client and its requests.
//!
//! The location travels as a string inside the encoded stage (the writer's
//! and reader's `shuffle_dir`), so the names of [`crate::paths`] apply to
//! both: `s3://bucket/prefix/stage-1/0-map-0.arrow` is both the name
//! in an error and, past `s3://bucket/`, the object's key.
//!
//! Endpoint, region and credentials come from the standard AWS environment
//! variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`), then from the
//! session's `dfx_engine.s3_endpoint`, `dfx_engine.s3_region` and
//! `dfx_engine.s3_allow_http`, which win. Plain http is refused unless one of
//! the two asks for it: it is for local endpoints only. Requests run on
//! the plugin's own I/O runtime ([`super::io`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use dfx_abi::location::{S3_ALLOW_HTTP, S3_ENDPOINT, S3_REGION, S3_SCHEME};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
// The base trait's methods, not `ObjectStoreExt`'s: theirs are not known to
// be `Send`, and every request is spawned onto the I/O runtime.
use crate::config::DfxConfig;
use crate::error::io_failure;
use crate::exchange::io::{join, on_io, spawn};
use object_store::{
    GetOptions, MultipartUpload, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload,
};
use tokio::task::JoinHandle;

// The ranged reads, in a module of their own, named from here too.
pub use crate::exchange::reads::{
    Pinned, get_range, get_range_if, get_range_pinned, get_tail, get_tail_tagged,
};

// Parsed and compared by the rule every host shares: re-exported for the
// exchange, and for `failures` and `vet`, which key and compare locations
// by `canonical_location`.
pub use dfx_abi::location::{S3Location, ShuffleLocation, canonical_location};

/// A bucket's bytes are sent as one part of a multipart upload each time
/// this many are buffered; a smaller bucket is one PUT. S3 needs at least
/// 5 MiB in every part but the last.
pub const PART_SIZE: usize = 8 * 1024 * 1024;

/// Parts of one map's upload in flight at once. One connection to S3
/// carries some 85 MB/s, and a machine-sized task uploads one map file at
/// a time: eight parts (object_store's own `BufWriter` default) let it
/// send 64 MiB at once, what its reads keep in flight by default
/// (`read_bytes_in_flight`). Memory per open upload stays below
/// `(MAX_PARTS_IN_FLIGHT + 1) * PART_SIZE`, 72 MiB.
pub const MAX_PARTS_IN_FLIGHT: usize = 8;

/// The directory (or URL) the names of [`crate::paths`] are built under:
/// the local directory as written, or the S3 location's URL.
pub fn location_root(location: &ShuffleLocation) -> PathBuf {
    match location {
        ShuffleLocation::Local(dir) => dir.clone(),
        ShuffleLocation::S3(s3) => PathBuf::from(s3.url()),
    }
}

/// The plugin's side of an [`S3Location`]: the object key of a name.
pub trait ObjectKey {
    /// The object key of `name`, a name built under [`location_root`].
    ///
    /// # Errors
    ///
    /// A name outside this location, or not a valid object key.
    fn key(&self, name: &Path) -> Result<ObjectPath, String>;
}

impl ObjectKey for S3Location {
    fn key(&self, name: &Path) -> Result<ObjectPath, String> {
        let bucket_root = format!("{S3_SCHEME}{}/", self.bucket);
        let key = name
            .to_str()
            .and_then(|n| n.strip_prefix(&bucket_root))
            .ok_or_else(|| format!("{} is not in bucket {}", name.display(), self.bucket))?;
        ObjectPath::parse(key)
            .map_err(|e| format!("{}: not a valid object key: {e}", name.display()))
    }
}

/// How to reach S3, from the session's `dfx_engine.s3_*` keys (the
/// environment fills in the rest).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct S3Options {
    /// `dfx_engine.s3_endpoint`: overrides `AWS_ENDPOINT_URL`.
    pub endpoint: Option<String>,
    /// `dfx_engine.s3_region`: overrides `AWS_REGION`.
    pub region: Option<String>,
    /// `dfx_engine.s3_allow_http`: plain http, for local endpoints.
    pub allow_http: bool,
}

impl S3Options {
    /// The options a session's config sets.
    pub fn from_config(config: &DfxConfig) -> Self {
        let set = |v: &str| (!v.trim().is_empty()).then(|| v.trim().to_string());
        Self {
            endpoint: set(&config.s3_endpoint),
            region: set(&config.s3_region),
            allow_http: config.s3_allow_http,
        }
    }
}

impl S3Options {
    /// The options a driver's spec holds (`store_options`: `s3_endpoint`,
    /// `s3_region`, `s3_allow_http`), as a JSON object of strings.
    ///
    /// # Errors
    ///
    /// Text that is not such an object, or a key that is none of the three.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let map: HashMap<String, String> = serde_json::from_str(text)
            .map_err(|e| format!("store options are not a JSON object of strings: {e}"))?;
        let mut options = Self::default();
        for (key, value) in map {
            let value = value.trim().to_string();
            match key.as_str() {
                S3_ENDPOINT => options.endpoint = (!value.is_empty()).then_some(value),
                S3_REGION => options.region = (!value.is_empty()).then_some(value),
                S3_ALLOW_HTTP => options.allow_http = value.eq_ignore_ascii_case("true"),
                other => {
                    return Err(format!(
                        "unknown store option {other:?}; expected {S3_ENDPOINT}, {S3_REGION} or \
                         {S3_ALLOW_HTTP}"
                    ));
                }
            }
        }
        Ok(options)
    }
}

/// The client for `bucket`, built once per process for each bucket and
/// options (it pools its connections).
///
/// # Errors
///
/// Settings object_store refuses (a malformed endpoint), naming the bucket.
pub fn s3_store(bucket: &str, options: &S3Options) -> Result<Arc<dyn ObjectStore>, String> {
    type Stores = Mutex<HashMap<(String, S3Options), Arc<dyn ObjectStore>>>;
    static STORES: LazyLock<Stores> = LazyLock::new(|| Mutex::new(HashMap::new()));
    let key = (bucket.to_string(), options.clone());
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(store) = stores.get(&key) {
        return Ok(Arc::clone(store));
    }
    let builder = apply_options(
        AmazonS3Builder::from_env().with_bucket_name(bucket),
        options,
    );
    let store: Arc<dyn ObjectStore> = Arc::new(
        builder
            .build()
            .map_err(|e| format!("cannot configure S3 for bucket {bucket}: {e}"))?,
    );
    stores.insert(key, Arc::clone(&store));
    Ok(store)
}

/// `builder` with the session's options over the environment's settings
/// ([`dfx_abi::location::apply_s3_options`]).
pub fn apply_options(builder: AmazonS3Builder, options: &S3Options) -> AmazonS3Builder {
    dfx_abi::location::apply_s3_options(
        builder,
        options.endpoint.as_deref(),
        options.region.as_deref(),
        options.allow_http,
    )
}

/// PUT `bytes` as object `key`: it appears whole or not at all.
///
/// # Errors
///
/// The PUT's failure, for the caller to name the object.
pub async fn put_bytes(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    bytes: Vec<u8>,
) -> Result<(), String> {
    on_io(async move {
        store
            .put_opts(&key, PutPayload::from(bytes), PutOptions::default())
            .await
    })
    .await?
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// PUT `bytes` as object `key` only if there is none (S3's create-only
/// PUT, `If-None-Match: *`): it appears whole or not at all, and never
/// replaces an object. Answers whether this PUT created it, and then the
/// entity tag the store gave it.
///
/// # Errors
///
/// Any other failure of the PUT, for the caller to name the object.
pub async fn put_new(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    bytes: Vec<u8>,
) -> Result<Option<Option<String>>, String> {
    let put = on_io(async move {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        store.put_opts(&key, PutPayload::from(bytes), options).await
    })
    .await?;
    match put {
        Ok(done) => Ok(Some(done.e_tag)),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether object `key` exists.
///
/// # Errors
///
/// A failure of the HEAD other than the object's absence.
pub async fn exists(store: Arc<dyn ObjectStore>, key: ObjectPath) -> Result<bool, String> {
    let head = on_io(async move {
        let options = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        store.get_opts(&key, options).await
    })
    .await?;
    match head {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// A map's object while its task uploads it: segments appended to a buffer
/// that is sent as a part each time it reaches [`PART_SIZE`]. Dropped
/// unpublished (an error, a cancelled task), its multipart upload is
/// aborted: S3 shows no object for it.
pub struct ObjectMap {
    store: Arc<dyn ObjectStore>,
    /// The shuffle location (`s3://bucket/prefix`), which a failed upload's
    /// class is recorded for.
    location: PathBuf,
    key: ObjectPath,
    buffer: Vec<u8>,
    upload: Option<Box<dyn MultipartUpload>>,
    parts: std::collections::VecDeque<JoinHandle<object_store::Result<()>>>,
    /// Bytes appended so far, sent or buffered.
    bytes: u64,
}

impl ObjectMap {
    /// Start the map's object, to be published as `key` in `location`.
    pub fn create(store: Arc<dyn ObjectStore>, location: &S3Location, key: ObjectPath) -> Self {
        Self {
            store,
            location: PathBuf::from(location.url()),
            key,
            buffer: Vec::new(),
            upload: None,
            parts: Default::default(),
            bytes: 0,
        }
    }

    /// Bytes appended so far: where the next segment starts.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing is appended yet.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Append one encoded segment; sends a part once enough is buffered.
    ///
    /// # Errors
    ///
    /// The upload's failure.
    pub async fn append(&mut self, segment: &[u8]) -> Result<(), String> {
        self.buffer.extend_from_slice(segment);
        self.bytes += segment.len() as u64;
        if self.buffer.len() >= PART_SIZE {
            let part = std::mem::take(&mut self.buffer);
            self.send_part(part).await?;
        }
        Ok(())
    }

    async fn send_part(&mut self, part: Vec<u8>) -> Result<(), String> {
        if self.upload.is_none() {
            let (store, key) = (Arc::clone(&self.store), self.key.clone());
            let upload = on_io(async move {
                store
                    .put_multipart_opts(&key, PutMultipartOptions::default())
                    .await
            })
            .await?
            .map_err(|e| {
                io_failure(
                    &self.location,
                    format!("cannot start a multipart upload: {e}"),
                )
            })?;
            self.upload = Some(upload);
        }
        let upload = self.upload.as_mut().ok_or("no upload")?;
        self.parts
            .push_back(spawn(upload.put_part(PutPayload::from(part)))?);
        while self.parts.len() > MAX_PARTS_IN_FLIGHT {
            self.wait_part().await?;
        }
        Ok(())
    }

    async fn wait_part(&mut self) -> Result<(), String> {
        if let Some(part) = self.parts.pop_front() {
            join(part)
                .await?
                .map_err(|e| io_failure(&self.location, format!("cannot upload a part: {e}")))?;
        }
        Ok(())
    }

    /// Publish the object (one PUT, or the last part and the upload's
    /// completion) unless another attempt of its map published it first;
    /// answers whether this attempt's object is the one published, and
    /// then its entity tag.
    ///
    /// A small map is one create-only PUT, so of two attempts exactly one
    /// creates it. A multipart upload cannot be completed conditionally
    /// through this client, so it is completed only if the object is absent
    /// just before: two attempts finishing within that moment both complete,
    /// with the same rows. A reader pins the object it read the marker of
    /// (its entity tag), so even then it never reads one attempt's marker
    /// with the other's segments.
    ///
    /// # Errors
    ///
    /// The upload's failure; nothing is published then.
    pub async fn publish(mut self) -> Result<(bool, Option<String>), String> {
        crate::test_hooks::before_publish(Path::new(self.key.as_ref()));
        let rest = std::mem::take(&mut self.buffer);
        if self.upload.is_none() {
            // Created, or kept: another attempt's object.
            let created = put_new(Arc::clone(&self.store), self.key.clone(), rest)
                .await
                .map_err(|e| io_failure(&self.location, e))?;
            return Ok(match created {
                Some(e_tag) => (true, e_tag),
                None => (false, None),
            });
        }
        if !rest.is_empty() {
            self.send_part(rest).await?;
        }
        while !self.parts.is_empty() {
            self.wait_part().await?;
        }
        let published = exists(Arc::clone(&self.store), self.key.clone())
            .await
            .map_err(|e| io_failure(&self.location, e))?;
        if published {
            // Dropping the upload aborts it: the object stays the first's.
            return Ok((false, None));
        }
        let mut upload = self.upload.take().ok_or("no upload")?;
        let completed = on_io(async move {
            let done = upload.complete().await;
            if done.is_err() {
                let _ = upload.abort().await;
            }
            done
        })
        .await?;
        let done = completed.map_err(|e| {
            io_failure(
                &self.location,
                format!("cannot complete the multipart upload: {e}"),
            )
        })?;
        Ok((true, done.e_tag))
    }
}

impl Drop for ObjectMap {
    fn drop(&mut self) {
        for part in self.parts.drain(..) {
            part.abort();
        }
        if let Some(mut upload) = self.upload.take() {
            // Best effort: an upload never completed shows no object anyway;
            // aborting frees the parts the store keeps.
            let _ = spawn(async move { upload.abort().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ShuffleLocation {
        ShuffleLocation::parse(Path::new(text)).unwrap()
    }

    #[test]
    fn names_are_built_under_the_directory_as_written_or_the_url() {
        assert_eq!(location_root(&parse("/tmp/q/")), PathBuf::from("/tmp/q/"));
        assert_eq!(
            location_root(&parse("file://rel/q")),
            PathBuf::from("rel/q")
        );
        assert_eq!(
            location_root(&parse("s3://b/p/q/")),
            PathBuf::from("s3://b/p/q")
        );
        assert_eq!(location_root(&parse("s3://b")), PathBuf::from("s3://b"));
    }

    #[test]
    fn keys_are_names_past_the_bucket() {
        let ShuffleLocation::S3(s3) = parse("s3://b/p") else {
            panic!("not s3");
        };
        let name = crate::paths::map_path(&PathBuf::from(s3.url()), 2, 1);
        assert_eq!(s3.key(&name).unwrap().as_ref(), "p/stage-2/1-map-1.arrow");
        let ShuffleLocation::S3(root) = parse("s3://b") else {
            panic!("not s3");
        };
        let name = crate::paths::map_path(&PathBuf::from(root.url()), 1, 0);
        assert_eq!(root.key(&name).unwrap().as_ref(), "stage-1/0-map-0.arrow");
        assert!(root.key(Path::new("s3://other/x")).is_err());
    }

    #[test]
    fn store_options_are_the_specs_keys() {
        let options = S3Options::from_json(
            r#"{"s3_endpoint": " http://h:9000 ", "s3_region": "", "s3_allow_http": "TRUE"}"#,
        )
        .unwrap();
        assert_eq!(
            options,
            S3Options {
                endpoint: Some("http://h:9000".into()),
                region: None,
                allow_http: true,
            }
        );
        let err = S3Options::from_json(r#"{"aws_secret": "x"}"#).unwrap_err();
        assert!(err.contains("\"aws_secret\""), "{err}");
        assert!(
            err.contains("s3_endpoint, s3_region or s3_allow_http"),
            "{err}"
        );
    }
}
