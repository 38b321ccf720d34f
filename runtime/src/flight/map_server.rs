//! The map server: Arrow Flight `do_get` of byte ranges of the map files
//! its worker process published (see the module above).
//!
//! One per process, started by the first task that needs it and kept for
//! the process's life, on a runtime of its own: the Python worker has no
//! async runtime, and the Rust worker's may be busy running a stage.
//!
//! A ticket is refused, saying why, when it does not parse, when it names a
//! location no task of this process wrote, or when its ranges reach past
//! the file. The file's path is made from the location this process
//! registered and the ticket's numbers only, through the plugin's naming,
//! so nothing outside a served location is ever read.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use dfx_abi::location::canonical_location;
use dfx_abi::{MapTicket, MapTicketAnswer, Plugin, ShuffleLocation};
use futures::StreamExt;
use futures::stream::BoxStream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// Bytes of one message of an answer: well under gRPC's 4 MiB default.
pub const CHUNK_BYTES: u64 = 1024 * 1024;

/// What a map server sent since it started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServedCounts {
    /// `do_get` streams answered with bytes.
    pub streams: u64,
    /// File bytes sent.
    pub bytes: u64,
    /// Tickets refused.
    pub refused: u64,
}

#[derive(Default)]
struct Counters {
    streams: AtomicU64,
    bytes: AtomicU64,
    refused: AtomicU64,
}

/// The locations this process wrote, by canonical spelling, with the
/// directory each is.
type Served = Mutex<BTreeMap<String, PathBuf>>;

/// A running map server.
pub struct MapServer {
    address: String,
    served: Arc<Served>,
    counters: Arc<Counters>,
    /// Where this process keeps copies of the map files it publishes to
    /// locations it does not serve from (shuffle durability `both`): made
    /// on first use, one directory per location below it.
    copies: Mutex<Option<tempfile::TempDir>>,
}

/// The server's own runtime: two threads, enough to stream files while
/// the process runs a stage on all of its cores.
static RUNTIME: LazyLock<std::io::Result<tokio::runtime::Runtime>> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("dfx-map-server")
        .enable_all()
        .build()
});

/// The process's server, once started.
static RUNNING: Mutex<Option<Arc<MapServer>>> = Mutex::new(None);

impl MapServer {
    /// The process's map server, started on `bind` (`host:port`; port 0
    /// for any) by the first call; later calls get the same one, wherever
    /// they would bind.
    ///
    /// # Errors
    ///
    /// An address that does not parse or is unspecified (`0.0.0.0`: readers
    /// need one to reach), or a bind that fails, naming the address.
    pub fn running(plugin: &Plugin, bind: &str) -> Result<Arc<Self>, String> {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(server) = running.as_ref() {
            return Ok(Arc::clone(server));
        }
        let server = Arc::new(Self::start(plugin.clone(), bind)?);
        *running = Some(Arc::clone(&server));
        Ok(server)
    }

    /// A server of its own on `bind`, for a test that runs several.
    ///
    /// # Errors
    ///
    /// As [`MapServer::running`].
    pub fn start(plugin: Plugin, bind: &str) -> Result<Self, String> {
        let addr: SocketAddr = bind.parse().map_err(|e| {
            format!("the map server's address {bind:?} is not host:port ({e}), say 127.0.0.1:0")
        })?;
        if addr.ip().is_unspecified() {
            return Err(format!(
                "the map server's address {bind:?} is unspecified: name the address other \
                 nodes reach this one at"
            ));
        }
        let runtime = RUNTIME
            .as_ref()
            .map_err(|e| format!("cannot start the map server's runtime: {e}"))?;
        let _entered = runtime.enter();
        // No Nagle: an answer's first message is small, and waiting for its
        // acknowledgement would hold each stream a delayed ACK (40 ms).
        let incoming = TcpIncoming::bind(addr)
            .map_err(|e| format!("the map server cannot listen on {bind}: {e}"))?
            .with_nodelay(Some(true));
        let local = incoming
            .local_addr()
            .map_err(|e| format!("the map server's listener on {bind} has no address: {e}"))?;
        let served: Arc<Served> = Arc::default();
        let counters: Arc<Counters> = Arc::default();
        let service = MapService {
            plugin,
            address: format!("http://{local}"),
            served: Arc::clone(&served),
            counters: Arc::clone(&counters),
        };
        runtime.spawn(
            Server::builder()
                .add_service(FlightServiceServer::new(service))
                .serve_with_incoming(incoming),
        );
        Ok(Self {
            address: format!("http://{local}"),
            served,
            counters,
            copies: Mutex::new(None),
        })
    }

    /// Where readers reach it: `http://host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Serve the map files of `location` from now on.
    ///
    /// # Errors
    ///
    /// A location that is not a local directory: an object store's files
    /// are read from the store.
    pub fn serve(&self, location: &Path) -> Result<(), String> {
        let parsed = ShuffleLocation::parse(location).map_err(|e| e.to_string())?;
        let ShuffleLocation::Local(dir) = &parsed else {
            return Err(format!(
                "a map server serves a local directory's map files, not {}",
                location.display()
            ));
        };
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        served.insert(parsed.canonical(), dir.clone());
        Ok(())
    }

    /// Serve the copies this process keeps of the map files it publishes
    /// to `location` (any location: its files stay there too), from a
    /// directory of this process's own; that directory, for its writers.
    ///
    /// # Errors
    ///
    /// A location that does not parse, or a directory that cannot be made.
    pub fn keep_copies(&self, location: &Path) -> Result<PathBuf, String> {
        let canonical = ShuffleLocation::parse(location)
            .map_err(|e| e.to_string())?
            .canonical();
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = served.get(&canonical) {
            return Ok(dir.clone());
        }
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        if copies.is_none() {
            let made = tempfile::Builder::new()
                .prefix("dfx-map-copies-")
                .tempdir()
                .map_err(|e| format!("cannot make a directory for the map files' copies: {e}"))?;
            *copies = Some(made);
        }
        let base = copies
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        let dir = base.join(format!("location-{}", served.len()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        served.insert(canonical, dir.clone());
        Ok(dir)
    }

    /// Remove every copy this process kept: its serving is over.
    pub fn drop_copies(&self) {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        *copies = None;
    }

    /// The process's server when one was started.
    pub fn started() -> Option<Arc<Self>> {
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Arc::clone)
    }

    /// What it sent so far.
    pub fn counts(&self) -> ServedCounts {
        ServedCounts {
            streams: self.counters.streams.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            refused: self.counters.refused.load(Ordering::Relaxed),
        }
    }
}

/// The Flight service behind a [`MapServer`].
struct MapService {
    plugin: Plugin,
    address: String,
    served: Arc<Served>,
    counters: Arc<Counters>,
}

impl MapService {
    /// The open file a ticket names, with its size, once the ticket is
    /// checked; the status that refuses it otherwise.
    fn open(&self, ticket: &MapTicket) -> Result<(File, u64, PathBuf), Status> {
        let dir = {
            let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
            served
                .get(&canonical_location(&ticket.location))
                .cloned()
                .ok_or_else(|| {
                    Status::permission_denied(format!(
                        "map server {}: the ticket names location {}, which no task of this \
                         worker wrote (it serves {})",
                        self.address,
                        ticket.location,
                        describe(&served)
                    ))
                })?
        };
        let map = usize::try_from(ticket.map)
            .map_err(|_| Status::invalid_argument(format!("map {} is out of range", ticket.map)))?;
        let path = self.plugin.map_path(&dir, ticket.stage, map);
        let place = format!("stage {} map {} ({})", ticket.stage, map, path.display());
        let file = open_no_follow(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Status::not_found(format!(
                "map server {}: {place} is not here (lost, or never written on this worker)",
                self.address
            )),
            _ => Status::internal(format!(
                "map server {}: cannot open {place}: {e}",
                self.address
            )),
        })?;
        let size = file
            .metadata()
            .map_err(|e| Status::internal(format!("cannot stat {place}: {e}")))?
            .len();
        if let Some((offset, len)) = ticket.ranges.iter().find(|(o, l)| o + l > size) {
            return Err(Status::out_of_range(format!(
                "map server {}: {place} holds {size} byte(s); the ticket asks for bytes \
                 {offset}..{}",
                self.address,
                offset + len
            )));
        }
        Ok((file, size, path))
    }

    fn refuse(&self, status: Status) -> Status {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        status
    }
}

fn describe(served: &BTreeMap<String, PathBuf>) -> String {
    if served.is_empty() {
        return "no location yet".to_string();
    }
    served.keys().cloned().collect::<Vec<_>>().join(", ")
}

/// A map file opened for reading, refused when it is a symbolic link: a
/// link in a served directory must not lead the server out of it.
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// One range's chunks: `(offset, len)` pieces of at most [`CHUNK_BYTES`].
fn chunks(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(offset, len) in ranges {
        let mut at = 0;
        while at < len {
            let take = CHUNK_BYTES.min(len - at);
            out.push((offset + at, take));
            at += take;
        }
    }
    out
}

type Answer<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl FlightService for MapService {
    type HandshakeStream = Answer<HandshakeResponse>;
    type ListFlightsStream = Answer<FlightInfo>;
    type DoGetStream = Answer<FlightData>;
    type DoPutStream = Answer<PutResult>;
    type DoActionStream = Answer<arrow_flight::Result>;
    type ListActionsStream = Answer<ActionType>;
    type DoExchangeStream = Answer<FlightData>;

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = MapTicket::decode(&request.into_inner().ticket).map_err(|e| {
            self.refuse(Status::invalid_argument(format!(
                "map server {}: {e}",
                self.address
            )))
        })?;
        let (file, size, path) = self.open(&ticket).map_err(|s| self.refuse(s))?;
        self.counters.streams.fetch_add(1, Ordering::Relaxed);
        let first = FlightData {
            app_metadata: MapTicketAnswer { size }.encode().into(),
            ..FlightData::default()
        };
        let file = Arc::new(file);
        let counters = Arc::clone(&self.counters);
        let body = futures::stream::iter(chunks(&ticket.ranges)).then(move |(offset, len)| {
            let file = Arc::clone(&file);
            let path = path.clone();
            let counters = Arc::clone(&counters);
            async move {
                let bytes = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0; len as usize];
                    file.read_exact_at(&mut buf, offset).map(|()| buf)
                })
                .await
                .map_err(|e| {
                    Status::internal(format!("a read of {} panicked: {e}", path.display()))
                })?
                .map_err(|e| {
                    Status::internal(format!(
                        "cannot read bytes {offset}..{} of {}: {e}",
                        offset + len,
                        path.display()
                    ))
                })?;
                counters.bytes.fetch_add(len, Ordering::Relaxed);
                Ok(FlightData {
                    data_body: bytes.into(),
                    ..FlightData::default()
                })
            }
        });
        let answer = futures::stream::once(async move { Ok(first) }).chain(body);
        Ok(Response::new(answer.boxed()))
    }

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(only_do_get("handshake"))
    }

    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(only_do_get("list_flights"))
    }

    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(only_do_get("get_flight_info"))
    }

    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(only_do_get("poll_flight_info"))
    }

    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(only_do_get("get_schema"))
    }

    async fn do_put(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        Err(only_do_get("do_put"))
    }

    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        Err(only_do_get("do_action"))
    }

    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Err(only_do_get("list_actions"))
    }

    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(only_do_get("do_exchange"))
    }
}

fn only_do_get(method: &str) -> Status {
    Status::unimplemented(format!(
        "a map server answers do_get of a map ticket only, not {method}"
    ))
}
