//! A map file on the disk of the worker that wrote it, read through that
//! worker's map server (Arrow Flight `do_get`, see `dfx_runtime::flight`),
//! seen as a read-only object store: a ranged GET of
//! `stage-<S>/<K>-map-<M>.arrow` is one stream of a [`MapTicket`] naming the
//! range. So the fetcher, its coalescing, its bound on bytes in flight and
//! the reads a slice's partitions share serve Flight as they serve S3.
//!
//! ```text
//! RangeFetcher ─► get_opts("stage-2/0-map-0.arrow", bytes a..b)
//!                   └─► do_get(ticket{location, stage 2, map 0, [(a, b-a)]})
//!                         ◄─ {"size": n} then the bytes, in chunks
//! ```
//!
//! An owner that cannot be reached, or that no longer has the file, is
//! object_store's `NotFound`: the map's output is lost, and the driver runs
//! the map again elsewhere.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use arrow_flight::Ticket;
use arrow_flight::flight_service_client::FlightServiceClient;
use async_trait::async_trait;
use bytes::Bytes;
use dfx_abi::{MapTicket, MapTicketAnswer};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{
    Attributes, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult,
};
use tonic::transport::{Channel, Endpoint};

use crate::paths::parse_map_name;

/// How long a reader waits to connect to an owner before its maps count
/// as lost.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest message a reader takes: a chunk of the server's, with room.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Whether `status` says the owner is gone rather than refusing the
/// ticket: it holds no such map, cannot be reached, or its connection
/// broke (a status made from a transport error carries that error as its
/// source; one the server answered with does not).
fn owner_gone(status: &tonic::Status) -> bool {
    use tonic::Code;
    match status.code() {
        Code::NotFound | Code::Unavailable | Code::Cancelled | Code::Aborted => true,
        Code::Unknown | Code::Internal => std::error::Error::source(status).is_some(),
        _ => false,
    }
}

/// The store of the map files `owner` (`http://host:port`) serves of the
/// location `location` (canonical): one per pair while any reader holds it,
/// so a slice's partitions share its reads (a shared read is keyed by its
/// store). A pair no reader holds any more is dropped when another is made;
/// its owner's connection stays (see [`client_of`]).
pub(crate) fn owner_store(owner: &str, location: &str) -> Arc<dyn ObjectStore> {
    type Stores = Mutex<HashMap<(String, String), Arc<dyn ObjectStore>>>;
    static STORES: LazyLock<Stores> = LazyLock::new(|| Mutex::new(HashMap::new()));
    let key = (owner.to_string(), location.to_string());
    let mut stores = STORES.lock().unwrap_or_else(|p| p.into_inner());
    if !stores.contains_key(&key) {
        stores.retain(|_, store| Arc::strong_count(store) > 1);
    }
    let store = stores.entry(key).or_insert_with(|| {
        Arc::new(OwnerStore {
            owner: owner.to_string(),
            location: location.to_string(),
        })
    });
    Arc::clone(store)
}

/// The client of `owner`'s map server: one per owner for the process's
/// life, connected on its first request (on the plugin's I/O runtime), so
/// each query's stores of that owner share one connection rather than
/// opening their own.
fn client_of(owner: &str) -> object_store::Result<FlightServiceClient<Channel>> {
    type Clients = Mutex<HashMap<String, FlightServiceClient<Channel>>>;
    static CLIENTS: LazyLock<Clients> = LazyLock::new(|| Mutex::new(HashMap::new()));
    let mut clients = CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(client) = clients.get(owner) {
        return Ok(client.clone());
    }
    let endpoint = Endpoint::from_shared(owner.to_string())
        .map_err(|e| generic(format!("the owner {owner:?} is not an address: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let made = FlightServiceClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    clients.insert(owner.to_string(), made.clone());
    Ok(made)
}

/// Map files of one location on one worker (see the module doc).
struct OwnerStore {
    owner: String,
    location: String,
}

impl fmt::Debug for OwnerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnerStore")
            .field("owner", &self.owner)
            .field("location", &self.location)
            .finish()
    }
}

impl fmt::Display for OwnerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "map server {} ({})", self.owner, self.location)
    }
}

/// The error an object store gives for `path` with `message`.
fn generic(message: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "map server",
        source: message.into(),
    }
}

fn not_supported(what: &str) -> object_store::Error {
    object_store::Error::NotSupported {
        source: format!("a map server's files are only read, never {what}").into(),
    }
}

impl OwnerStore {
    /// Bytes `offset..offset + len` of `name` and the file's size.
    async fn fetch(&self, name: &str, offset: u64, len: u64) -> object_store::Result<(Bytes, u64)> {
        let Some((stage, map)) = parse_map_name(name) else {
            return Err(generic(format!("{name} is not a map file's name")));
        };
        let ticket = MapTicket {
            location: self.location.clone(),
            stage,
            map: map as u64,
            ranges: vec![(offset, len)],
        };
        let place = format!("stage {stage} map {map} on {}", self.owner);
        let lost = |why: String| object_store::Error::NotFound {
            path: name.to_string(),
            source: why.into(),
        };
        let answer = client_of(&self.owner)?
            .do_get(Ticket {
                ticket: ticket.encode().into(),
            })
            .await
            .map_err(|status| match owner_gone(&status) {
                true => lost(format!("{place}: {}", status.message())),
                false => generic(format!("{place}: {}", status.message())),
            })?;
        // A stream that breaks is an owner lost mid-answer.
        let broke = |status: tonic::Status| match owner_gone(&status) {
            true => lost(format!("{place}: the stream broke: {}", status.message())),
            false => generic(format!("{place}: the stream broke: {}", status.message())),
        };
        let mut stream = answer.into_inner();
        let first = stream.try_next().await.map_err(broke)?.ok_or_else(|| {
            generic(format!(
                "{place}: the answer ended before its first message"
            ))
        })?;
        let size = MapTicketAnswer::decode(&first.app_metadata)
            .map_err(|e| generic(format!("{place}: {e}")))?
            .size;
        let mut bytes = Vec::with_capacity(len as usize);
        while let Some(data) = stream.try_next().await.map_err(broke)? {
            bytes.extend_from_slice(&data.data_body);
        }
        if bytes.len() as u64 != len {
            return Err(generic(format!(
                "{place}: {} byte(s) came for bytes {offset}..{} ({len} asked)",
                bytes.len(),
                offset + len
            )));
        }
        Ok((Bytes::from(bytes), size))
    }
}

#[async_trait]
impl ObjectStore for OwnerStore {
    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let Some(GetRange::Bounded(range)) = options.range else {
            return Err(generic(format!(
                "{location}: a map server answers a bounded range of a file, not {:?}",
                options.range
            )));
        };
        let (bytes, size) = self
            .fetch(location.as_ref(), range.start, range.end - range.start)
            .await?;
        let meta = ObjectMeta {
            location: location.clone(),
            last_modified: chrono::DateTime::UNIX_EPOCH,
            size,
            e_tag: None,
            version: None,
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::once(async { Ok(bytes) }).boxed()),
            meta,
            range,
            attributes: Attributes::default(),
        })
    }

    async fn put_opts(
        &self,
        _: &ObjectPath,
        _: PutPayload,
        _: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(not_supported("written"))
    }

    async fn put_multipart_opts(
        &self,
        _: &ObjectPath,
        _: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(not_supported("written"))
    }

    fn delete_stream(
        &self,
        _: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        futures::stream::once(async { Err(not_supported("deleted")) }).boxed()
    }

    fn list(&self, _: Option<&ObjectPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        futures::stream::once(async { Err(not_supported("listed")) }).boxed()
    }

    async fn list_with_delimiter(
        &self,
        _: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        Err(not_supported("listed"))
    }

    async fn copy_opts(
        &self,
        _: &ObjectPath,
        _: &ObjectPath,
        _: CopyOptions,
    ) -> object_store::Result<()> {
        Err(not_supported("copied"))
    }
}
