//! A shuffle root: where each query of a session gets a fresh shuffle
//! location of its own, removed once its answer has been read. The one
//! rule for both hosts and `dfx gc`.
//!
//! ```text
//! <root>/                         local directory or s3://bucket/prefix
//!   _dfx-shuffle-root             ROOT_MARKER: written when a query first runs
//!                                 under it; `dfx gc` refuses a root without it
//!   q-<unix ms>-<16 hex>/         one query's location (QUERY_PREFIX + time + random)
//!     .dfx-driver.lock            its driver's lock (flock), or _dfx-driver.lock on S3
//!     stage-1/0-map-0.arrow ...     what its workers published
//! ```
//!
//! | what                 | rule                                                                                  |
//! | -------------------- | ------------------------------------------------------------------------------------- |
//! | a query's location   | [`ShuffleRoot::new_query_location`]: the time it was made and 64 random bits           |
//! | after an answer      | removed ([`remove_location`]), unless the spec keeps it (`keep_shuffle`)                |
//! | after a failure      | kept and named in the error, unless it holds nothing but its driver's lock              |
//! | removing, local      | the whole directory                                                                   |
//! | removing, S3         | every object under the prefix, listed, then deleted in batches of [`DELETE_BATCH`]     |
//! | stale                | not held by a live driver, and nothing in it written for the threshold ([`DEFAULT_STALE_AFTER`]) |
//! | held, local          | a driver holds its `flock` ([`is_held`], which writes nothing)                        |
//! | held, S3             | its lock object names a driver on this machine that still runs ([`S3LockHolder`])     |

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dfx_abi::lock::{LOCK_FILE, S3_LOCK_OBJECT, S3LockHolder, is_held};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{Result, RuntimeError};
use crate::spec::SessionSpec;
use crate::spec::location::{S3Location, ShuffleLocation};

/// The marker a root holds, written when a query first runs under it.
pub const ROOT_MARKER: &str = "_dfx-shuffle-root";

/// How the name of every query location under a root starts.
pub const QUERY_PREFIX: &str = "q-";

/// How long a query location must have been left alone before `dfx gc`
/// takes it for a crashed driver's (unless told otherwise).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(3600);

/// The most objects one bulk delete request names (S3's own bound).
pub const DELETE_BATCH: usize = 1000;

/// A parsed shuffle root and how to reach it.
#[derive(Debug, Clone)]
pub struct ShuffleRoot {
    location: ShuffleLocation,
    store_options: BTreeMap<String, String>,
}

/// One query location found under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryLocation {
    /// The location, in its one spelling (a path or `s3://` URL).
    pub location: String,
    /// Bytes of every file or object in it.
    pub bytes: u64,
    /// When anything in it was last written (at least the time in its name).
    pub last_written: SystemTime,
    /// Whether a live driver holds it.
    pub held: bool,
}

impl QueryLocation {
    /// Whether a cleaner may take it for a crashed driver's: not held, and
    /// left alone for `older_than` at `now`.
    pub fn is_stale(&self, older_than: Duration, now: SystemTime) -> bool {
        !self.held
            && now
                .duration_since(self.last_written)
                .is_ok_and(|age| age >= older_than)
    }
}

impl ShuffleRoot {
    /// A root at `root` (a path, `file://` or `s3://bucket/prefix`),
    /// reached on S3 with `store_options` over the AWS environment.
    ///
    /// # Errors
    ///
    /// A location [`ShuffleLocation::parse`] refuses, naming it.
    pub fn new(root: &Path, store_options: &BTreeMap<String, String>) -> Result<Self> {
        Ok(Self {
            location: ShuffleLocation::parse(root)?,
            store_options: store_options.clone(),
        })
    }

    /// The root in its one spelling.
    pub fn canonical(&self) -> String {
        self.location.canonical()
    }

    /// A fresh query location under the root, not yet created: its name
    /// holds the time and 64 random bits, so no two drivers pick one name.
    pub fn new_query_location(&self) -> PathBuf {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        // Seeded per process by the OS; the count and the time make each
        // call's bits differ within one process too.
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u128(now.as_nanos());
        random.write_u32(std::process::id());
        random.write_u64(MADE.fetch_add(1, Ordering::Relaxed));
        let name = format!("{QUERY_PREFIX}{}-{:016x}", now.as_millis(), random.finish());
        PathBuf::from(format!("{}/{name}", self.canonical()))
    }

    /// Make the root dfx's: create it (a local one with mode 0700) and write
    /// [`ROOT_MARKER`]. Again: nothing changes.
    ///
    /// # Errors
    ///
    /// A directory or marker that cannot be written, naming it.
    pub async fn mark(&self) -> Result<()> {
        match &self.location {
            ShuffleLocation::Local(dir) => {
                use std::os::unix::fs::DirBuilderExt as _;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| RuntimeError::io("cannot create the shuffle root", dir, e))?;
                let marker = dir.join(ROOT_MARKER);
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&marker)
                    .map_err(|e| RuntimeError::io("cannot write the root marker", &marker, e))?;
                Ok(())
            }
            ShuffleLocation::S3(s3) => {
                let store = self.s3_store(s3)?;
                let marker = object_under(&s3.prefix, ROOT_MARKER);
                store
                    .put(&marker, PutPayload::from_static(b"dfx shuffle root\n"))
                    .await
                    .map_err(|e| s3_error("cannot write the root marker", s3, &e))?;
                Ok(())
            }
        }
    }

    /// Refuse a root that is not dfx's, saying why.
    ///
    /// # Errors
    ///
    /// A root that does not exist or holds no [`ROOT_MARKER`], naming it.
    pub async fn check_marked(&self) -> Result<()> {
        let root = self.canonical();
        let found = match &self.location {
            ShuffleLocation::Local(dir) => {
                if !dir.is_dir() {
                    return Err(RuntimeError::Invalid(format!(
                        "{root} is not a dfx shuffle root: expected a directory, found none"
                    )));
                }
                dir.join(ROOT_MARKER).is_file()
            }
            ShuffleLocation::S3(s3) => {
                let store = self.s3_store(s3)?;
                match store.head(&object_under(&s3.prefix, ROOT_MARKER)).await {
                    Ok(_) => true,
                    Err(object_store::Error::NotFound { .. }) => false,
                    Err(e) => return Err(s3_error("cannot read the root marker", s3, &e)),
                }
            }
        };
        if found {
            return Ok(());
        }
        Err(RuntimeError::Invalid(format!(
            "{root} is not a dfx shuffle root: expected its marker {ROOT_MARKER}, found none (a \
             root gets one when a query first runs under it); nothing is removed"
        )))
    }

    /// Every query location under the root (names starting with
    /// [`QUERY_PREFIX`] and holding a time), with its bytes, last write and
    /// whether a live driver holds it; anything else there is left alone.
    ///
    /// # Errors
    ///
    /// A root that cannot be listed, naming it.
    pub async fn query_locations(&self) -> Result<Vec<QueryLocation>> {
        let mut found = match &self.location {
            ShuffleLocation::Local(dir) => local_query_locations(dir)?,
            ShuffleLocation::S3(s3) => self.s3_query_locations(s3).await?,
        };
        found.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(found)
    }

    /// Remove the root's stale query locations ([`QueryLocation::is_stale`]
    /// at `older_than`), or only list them when `dry_run`: what `dfx gc`
    /// does. A local one is tested for its driver's lock again just before
    /// it goes (a driver only ever claims a fresh name, so none takes a
    /// stale one in between).
    ///
    /// # Errors
    ///
    /// A root that is not dfx's ([`Self::check_marked`]), or one that
    /// cannot be listed or removed, naming it.
    pub async fn collect_garbage(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Vec<QueryLocation>> {
        self.check_marked().await?;
        let now = SystemTime::now();
        let stale: Vec<QueryLocation> = self
            .query_locations()
            .await?
            .into_iter()
            .filter(|found| found.is_stale(older_than, now))
            .collect();
        if dry_run {
            return Ok(stale);
        }
        let mut removed = Vec::new();
        for found in stale {
            if let ShuffleLocation::Local(dir) = ShuffleLocation::parse(Path::new(&found.location))?
                && is_held(&dir).map_err(RuntimeError::Invalid)?
            {
                continue;
            }
            remove_location(&found.location, &self.store_options).await?;
            removed.push(found);
        }
        Ok(removed)
    }

    fn s3_store(&self, s3: &S3Location) -> Result<std::sync::Arc<dyn ObjectStore>> {
        crate::tables::s3_store(&s3.bucket, &self.store_options)
    }

    async fn s3_query_locations(&self, s3: &S3Location) -> Result<Vec<QueryLocation>> {
        let store = self.s3_store(s3)?;
        let prefix = (!s3.prefix.is_empty()).then(|| ObjectPath::from(s3.prefix.as_str()));
        let listing = store
            .list_with_delimiter(prefix.as_ref())
            .await
            .map_err(|e| s3_error("cannot list the root", s3, &e))?;
        let mut found = Vec::new();
        for location in listing.common_prefixes {
            let Some(made) = location.filename().and_then(query_time) else {
                continue;
            };
            let url = format!("s3://{}/{location}", s3.bucket);
            let objects: Vec<object_store::ObjectMeta> = store
                .list(Some(&location))
                .try_collect()
                .await
                .map_err(|e| s3_error("cannot list", s3, &e))?;
            let bytes = objects.iter().map(|o| o.size).sum();
            let last_written = objects
                .iter()
                .map(|o| SystemTime::from(o.last_modified))
                .fold(made, SystemTime::max);
            let held = match store.get(&location.clone().join(S3_LOCK_OBJECT)).await {
                Ok(lock) => lock
                    .bytes()
                    .await
                    .ok()
                    .and_then(|body| serde_json::from_slice::<S3LockHolder>(&body).ok())
                    .is_some_and(|holder| holder.is_alive_here()),
                Err(_) => false,
            };
            found.push(QueryLocation {
                location: url,
                bytes,
                last_written,
                held,
            });
        }
        Ok(found)
    }
}

/// A local root in a fresh temporary directory, for a session given
/// neither a location nor a root; removed with whatever is left in it
/// (the locations of failed queries) when dropped.
#[derive(Debug)]
pub struct TemporaryRoot {
    dir: tempfile::TempDir,
}

impl TemporaryRoot {
    /// A new temporary root, in the system's temporary directory.
    ///
    /// # Errors
    ///
    /// A directory that cannot be created, naming where.
    pub fn new() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("dfx-root-")
            .tempdir()
            .map_err(|e| RuntimeError::io("cannot create", std::env::temp_dir(), e))?;
        Ok(Self { dir })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `spec` with this root when it names neither a location nor a root;
    /// otherwise `spec` as it is.
    pub fn apply(&self, spec: &SessionSpec) -> SessionSpec {
        if spec.shuffle_dir.is_some() || spec.shuffle_root.is_some() {
            return spec.clone();
        }
        spec.clone().with_shuffle_root(self.path())
    }
}

/// Remove a query location and everything in it: a local directory whole,
/// or every object under an S3 prefix (listed, then deleted in batches of
/// [`DELETE_BATCH`]). Returns the bytes removed. A location already gone
/// removes nothing.
///
/// # Errors
///
/// A file or object that cannot be listed or removed, naming the location.
pub async fn remove_location(
    location: &str,
    store_options: &BTreeMap<String, String>,
) -> Result<u64> {
    match ShuffleLocation::parse(Path::new(location))? {
        ShuffleLocation::Local(dir) => {
            let (bytes, _) = match walk(&dir) {
                Ok(found) => found,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(RuntimeError::io("cannot list", dir, e)),
            };
            std::fs::remove_dir_all(&dir)
                .map_err(|e| RuntimeError::io("cannot remove the shuffle location", dir, e))?;
            Ok(bytes)
        }
        ShuffleLocation::S3(s3) => {
            if s3.prefix.is_empty() {
                // A bucket's root is never a query's location: removing it
                // would empty the bucket.
                return Err(RuntimeError::Invalid(format!(
                    "refusing to remove {}: expected a query location under a root, found a \
                     bucket's root",
                    s3.url()
                )));
            }
            let store = crate::tables::s3_store(&s3.bucket, store_options)?;
            let objects = list_objects(store.as_ref(), &s3).await?;
            let bytes = objects.iter().map(|o| o.size).sum();
            let paths: Vec<ObjectPath> = objects.into_iter().map(|o| o.location).collect();
            for batch in paths.chunks(DELETE_BATCH) {
                let batch: Vec<object_store::Result<ObjectPath>> =
                    batch.iter().cloned().map(Ok).collect();
                store
                    .delete_stream(futures::stream::iter(batch).boxed())
                    .try_collect::<Vec<_>>()
                    .await
                    .map_err(|e| s3_error("cannot delete objects of", &s3, &e))?;
            }
            Ok(bytes)
        }
    }
}

/// Whether a failed query's location holds evidence worth keeping: anything
/// beside its driver's lock (envelopes, plans, stage output).
///
/// # Errors
///
/// A location that cannot be listed, naming it.
pub async fn holds_evidence(
    location: &str,
    store_options: &BTreeMap<String, String>,
) -> Result<bool> {
    match ShuffleLocation::parse(Path::new(location))? {
        ShuffleLocation::Local(dir) => match std::fs::read_dir(&dir) {
            Ok(entries) => Ok(entries.flatten().any(|e| e.file_name() != LOCK_FILE)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(RuntimeError::io("cannot list", dir, e)),
        },
        ShuffleLocation::S3(s3) => {
            let store = crate::tables::s3_store(&s3.bucket, store_options)?;
            let objects = list_objects(store.as_ref(), &s3).await?;
            Ok(objects
                .iter()
                .any(|o| o.location.filename() != Some(S3_LOCK_OBJECT)))
        }
    }
}

/// Every object under the S3 location `s3`.
async fn list_objects(
    store: &dyn ObjectStore,
    s3: &S3Location,
) -> Result<Vec<object_store::ObjectMeta>> {
    let prefix = ObjectPath::from(s3.prefix.as_str());
    store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| s3_error("cannot list", s3, &e))
}

/// The time a query location's name was made at, or `None` for a name
/// that is not a query location's (`q-<unix ms>-<hex>`).
fn query_time(name: &str) -> Option<SystemTime> {
    let (millis, random) = name.strip_prefix(QUERY_PREFIX)?.split_once('-')?;
    if random.is_empty() || !random.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let millis: u64 = millis.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

fn local_query_locations(root: &Path) -> Result<Vec<QueryLocation>> {
    let entries =
        std::fs::read_dir(root).map_err(|e| RuntimeError::io("cannot list the root", root, e))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(made) = name.to_str().and_then(query_time) else {
            continue;
        };
        let path = entry.path();
        // A symbolic link is not a location this root made: never followed.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let (bytes, newest) = walk(&path).map_err(|e| RuntimeError::io("cannot list", &path, e))?;
        let held = is_held(&path).map_err(RuntimeError::Invalid)?;
        found.push(QueryLocation {
            location: path.display().to_string(),
            bytes,
            last_written: newest.max(made),
            held,
        });
    }
    Ok(found)
}

/// The bytes of every file below `dir` and the newest modification time,
/// the directories' own included; symbolic links are not followed.
fn walk(dir: &Path) -> std::io::Result<(u64, SystemTime)> {
    let mut bytes = 0;
    let mut newest = std::fs::symlink_metadata(dir)?.modified()?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.path().symlink_metadata()?;
        if meta.is_dir() {
            let (below, when) = walk(&entry.path())?;
            bytes += below;
            newest = newest.max(when);
        } else {
            bytes += meta.len();
            newest = newest.max(meta.modified()?);
        }
    }
    Ok((bytes, newest))
}

/// `prefix/name`, or `name` at a bucket's root.
fn object_under(prefix: &str, name: &str) -> ObjectPath {
    if prefix.is_empty() {
        ObjectPath::from(name)
    } else {
        ObjectPath::from(prefix).join(name)
    }
}

fn s3_error(action: &str, s3: &S3Location, err: &object_store::Error) -> RuntimeError {
    RuntimeError::Invalid(format!("{action} {}: {err}", s3.url()))
}

#[cfg(test)]
mod tests {
    use dfx_abi::lock::DriverLock;

    use super::*;

    /// Every file and directory below `dir`, and `dir`, last written at `when`.
    fn age(dir: &Path, when: SystemTime) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                age(&entry.path(), when);
            } else {
                std::fs::File::options()
                    .write(true)
                    .open(entry.path())
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
            }
        }
        std::fs::File::open(dir)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }

    #[test]
    fn a_query_location_is_named_by_its_time_and_random_bits_under_the_root() {
        let root = ShuffleRoot::new(Path::new("/r/"), &BTreeMap::new()).unwrap();
        let a = root.new_query_location();
        let b = root.new_query_location();
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert_eq!(a.parent(), Some(Path::new("/r")));
        let made = query_time(name).expect(name);
        assert!(SystemTime::now().duration_since(made).unwrap() < Duration::from_secs(60));
        let s3 = ShuffleRoot::new(Path::new("s3://b/p"), &BTreeMap::new()).unwrap();
        let url = s3.new_query_location().display().to_string();
        assert!(url.starts_with("s3://b/p/q-"), "{url}");
    }

    #[test]
    fn only_names_holding_a_time_and_hex_are_query_locations() {
        assert!(query_time("q-1765000000000-00ff").is_some());
        for name in [
            "q-", "q-12", "q-x-00", "q-12-", "q-12-zz", "stage-1", "tasks",
        ] {
            assert!(query_time(name).is_none(), "{name}");
        }
    }

    #[tokio::test]
    async fn a_stale_local_location_is_removed_and_a_fresh_or_held_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = ShuffleRoot::new(dir.path(), &BTreeMap::new()).unwrap();
        let err = root
            .collect_garbage(Duration::ZERO, false)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a dfx shuffle root"), "{err}");
        root.mark().await.unwrap();
        let old = dir.path().join("q-1000-00aa");
        std::fs::create_dir_all(old.join("stage-1")).unwrap();
        std::fs::write(old.join("stage-1/0-map-0.arrow"), b"12345").unwrap();
        age(&old, UNIX_EPOCH + Duration::from_secs(1));
        // Held by a driver, however old.
        let held = PathBuf::from(format!("{}/q-2000-00bb", root.canonical()));
        let _lock = DriverLock::acquire(&held).unwrap();
        age(&held, UNIX_EPOCH + Duration::from_secs(2));
        let fresh = root.new_query_location();
        std::fs::create_dir_all(&fresh).unwrap();
        std::fs::write(dir.path().join("q-1-notes.txt"), b"mine").unwrap();
        let dry = root
            .collect_garbage(Duration::from_secs(600), true)
            .await
            .unwrap();
        assert_eq!(dry.len(), 1, "{dry:?}");
        assert!(old.exists());
        let removed = root
            .collect_garbage(Duration::from_secs(600), false)
            .await
            .unwrap();
        assert_eq!(removed[0].location, old.display().to_string());
        assert_eq!(removed[0].bytes, 5);
        assert!(!old.exists() && held.exists() && fresh.exists());
        assert!(dir.path().join("q-1-notes.txt").exists());
    }
}
