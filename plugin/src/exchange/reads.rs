//! Ranged reads of an object in an S3 shuffle location: a tail (a
//! marker), a byte range, pinned to an entity tag when one is known. Every
//! request runs on the plugin's I/O runtime ([`super::io`]).

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::exchange::io::on_io;

/// Up to the last `len` bytes of object `key` (all of it when it is
/// shorter), and the object's whole size; `None` when there is no such
/// object.
///
/// # Errors
///
/// Any other failure of the GET, for the caller to name the object.
pub async fn get_tail(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    len: u64,
) -> Result<Option<(Vec<u8>, u64)>, String> {
    get_part(store, key, GetRange::Suffix(len)).await
}

/// Like [`get_tail`], with the object's entity tag (when the store gives
/// one), for later reads pinned to this very object ([`get_range_if`]).
///
/// # Errors
///
/// Any other failure of the GET, for the caller to name the object.
pub async fn get_tail_tagged(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    len: u64,
) -> Result<Option<(Vec<u8>, u64, Option<String>)>, String> {
    get_part_if(store, key, GetRange::Suffix(len), None).await
}

/// Bytes `offset..offset + len` of object `key`, and the object's whole
/// size (so a reader can check it against the marker); `None` when there is
/// no such object.
///
/// # Errors
///
/// Any other failure of the GET (a range past the object's end included),
/// for the caller to name the object.
pub async fn get_range(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    offset: u64,
    len: u64,
) -> Result<Option<(Vec<u8>, u64)>, String> {
    get_part(store, key, GetRange::Bounded(offset..offset + len)).await
}

/// Like [`get_range`], from the object whose entity tag is `e_tag` only
/// (`If-Match`), when one is given.
///
/// # Errors
///
/// As [`get_range`]; and an object replaced since its tag was read, which
/// is said so.
pub async fn get_range_if(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    offset: u64,
    len: u64,
    e_tag: Option<String>,
) -> Result<Option<(Vec<u8>, u64)>, String> {
    let range = GetRange::Bounded(offset..offset + len);
    let got = get_part_if(store, key, range, e_tag).await?;
    Ok(got.map(|(bytes, size, _)| (bytes, size)))
}

/// What a GET pinned to an entity tag found.
pub enum Pinned {
    /// The range, and the object's whole size.
    Got(Vec<u8>, u64),
    /// No such object.
    Missing,
    /// Another object now holds the key (its tag no longer matches).
    Replaced,
}

/// Like [`get_range_if`], telling an object replaced since its tag was
/// taken apart from any other failure, for a caller that recovers from it.
///
/// # Errors
///
/// Any other failure of the GET, for the caller to name the object.
pub async fn get_range_pinned(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    offset: u64,
    len: u64,
    e_tag: Option<String>,
) -> Result<Pinned, String> {
    let range = GetRange::Bounded(offset..offset + len);
    match get_part_checked(store, key, range, e_tag).await? {
        Ok(Some((bytes, size, _))) => Ok(Pinned::Got(bytes, size)),
        Ok(None) => Ok(Pinned::Missing),
        Err(Replaced) => Ok(Pinned::Replaced),
    }
}

/// An object replaced since the entity tag a GET was pinned to was taken.
struct Replaced;

async fn get_part(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    range: GetRange,
) -> Result<Option<(Vec<u8>, u64)>, String> {
    let got = get_part_if(store, key, range, None).await?;
    Ok(got.map(|(bytes, size, _)| (bytes, size)))
}

async fn get_part_if(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    range: GetRange,
    if_match: Option<String>,
) -> Result<Option<(Vec<u8>, u64, Option<String>)>, String> {
    let pinned = if_match.clone();
    get_part_checked(store, key, range, if_match)
        .await?
        .map_err(|Replaced| {
            format!(
                "the object was replaced since its commit marker was read (entity tag {} no \
                 longer matches)",
                pinned.unwrap_or_default()
            )
        })
}

/// The GET of [`get_part_if`], an object replaced since `if_match` was
/// taken kept apart.
async fn get_part_checked(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    range: GetRange,
    if_match: Option<String>,
) -> Result<Result<Option<(Vec<u8>, u64, Option<String>)>, Replaced>, String> {
    on_io(async move {
        let options = GetOptions {
            range: Some(range),
            if_match,
            ..GetOptions::default()
        };
        let got = match store.get_opts(&key, options).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(Ok(None)),
            Err(object_store::Error::Precondition { .. }) => return Ok(Err(Replaced)),
            Err(e) => return Err(e.to_string()),
        };
        let size = got.meta.size;
        let e_tag = got.meta.e_tag.clone();
        got.bytes()
            .await
            .map(|b| Ok(Some((b.to_vec(), size, e_tag))))
            .map_err(|e| e.to_string())
    })
    .await?
}
