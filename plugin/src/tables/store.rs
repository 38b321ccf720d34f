//! The plugin's object stores for tables: every request on its I/O runtime.
//!
//! object_store's S3 client needs a tokio runtime of the plugin's own copy
//! of tokio, which the host's threads polling a scan do not run (see
//! `crate::exchange::store`). [`IoStore`] runs each request there and hands
//! back what it answers, a byte stream forwarded through a channel, so a
//! host thread only ever waits on a channel.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::mpsc;
use url::Url;

use crate::config::DfxConfig;
use crate::exchange::io::io_runtime;
use crate::exchange::store::{S3Options, s3_store};
use crate::isolation::rebuilt_task_context;

/// Chunks of one response buffered between the I/O runtime and its reader.
const CHUNKS_IN_FLIGHT: usize = 4;

/// A read-only object store whose every request runs on the plugin's I/O
/// runtime. Writing is refused: a table is read, never written, by a stage.
#[derive(Debug)]
pub struct IoStore {
    inner: Arc<dyn ObjectStore>,
}

impl IoStore {
    /// `inner`, reached from the I/O runtime.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self { inner }
    }
}

impl fmt::Display for IoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dfx table store over {}", self.inner)
    }
}

/// An error of the runtime itself (not started, a request task lost).
fn runtime_error(what: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "dfx table store",
        source: what.into(),
    }
}

fn read_only(operation: &str) -> object_store::Error {
    object_store::Error::NotSupported {
        source: format!("{operation}: a table's store is read-only in a dfx stage").into(),
    }
}

/// Run `work` on the I/O runtime and await its answer from any thread.
async fn on_io<T, F>(work: F) -> object_store::Result<T>
where
    F: Future<Output = object_store::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let runtime = io_runtime().map_err(runtime_error)?;
    runtime
        .spawn(work)
        .await
        .map_err(|e| runtime_error(format!("a request task did not finish: {e}")))?
}

/// Drive `stream` on the I/O runtime; its items arrive through a channel.
fn forwarded<T: Send + 'static>(
    stream: impl Stream<Item = object_store::Result<T>> + Send + 'static,
) -> BoxStream<'static, object_store::Result<T>> {
    let (sender, receiver) = mpsc::channel(CHUNKS_IN_FLIGHT);
    match io_runtime() {
        Ok(runtime) => {
            runtime.spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    // The reader went away: stop reading.
                    if sender.send(item).await.is_err() {
                        break;
                    }
                }
            });
        }
        Err(e) => {
            return futures::stream::once(async move { Err(runtime_error(e)) }).boxed();
        }
    }
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
    .boxed()
}

#[async_trait]
impl ObjectStore for IoStore {
    async fn put_opts(
        &self,
        _location: &Path,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(read_only("put"))
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(read_only("multipart upload"))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let inner = Arc::clone(&self.inner);
        let location = location.clone();
        let (payload, meta, range, attributes) = on_io(async move {
            let result = inner.get_opts(&location, options).await?;
            Ok((result.payload, result.meta, result.range, result.attributes))
        })
        .await?;
        let payload = match payload {
            GetResultPayload::Stream(stream) => GetResultPayload::Stream(forwarded(stream)),
            #[allow(unreachable_patterns)]
            other => other,
        };
        Ok(GetResult {
            payload,
            meta,
            range,
            attributes,
        })
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let inner = Arc::clone(&self.inner);
        let location = location.clone();
        let ranges = ranges.to_vec();
        on_io(async move { inner.get_ranges(&location, &ranges).await }).await
    }

    fn delete_stream(
        &self,
        _locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        futures::stream::once(async { Err(read_only("delete")) }).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        forwarded(self.inner.list(prefix))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.cloned();
        on_io(async move { inner.list_with_delimiter(prefix.as_ref()).await }).await
    }

    async fn copy_opts(
        &self,
        _from: &Path,
        _to: &Path,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(read_only("copy"))
    }
}

/// The stores a table scan in the plugin may use: local files, and each S3
/// bucket through an [`IoStore`] over the plugin's client for it.
#[derive(Debug)]
pub struct TableStores {
    options: S3Options,
    local: Arc<dyn ObjectStore>,
    registered: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl TableStores {
    /// The stores for a session with `options`.
    pub fn new(options: S3Options) -> Self {
        Self {
            options,
            local: Arc::new(LocalFileSystem::new()),
            registered: Mutex::default(),
        }
    }
}

/// The key of a store: its scheme and authority (`s3://bucket`).
fn store_key(url: &Url) -> String {
    format!(
        "{}://{}",
        url.scheme(),
        &url[url::Position::BeforeHost..url::Position::AfterPort]
    )
}

impl ObjectStoreRegistry for TableStores {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        let mut registered = self.registered.lock().unwrap_or_else(|e| e.into_inner());
        registered.insert(store_key(url), store)
    }

    fn get_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        let key = store_key(url);
        if let Some(store) = self
            .registered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(Arc::clone(store));
        }
        match url.scheme() {
            "file" => Ok(Arc::clone(&self.local)),
            "s3" => {
                let bucket = url.host_str().unwrap_or_default();
                let client = s3_store(bucket, &self.options).map_err(DataFusionError::Execution)?;
                let store: Arc<dyn ObjectStore> = Arc::new(IoStore::new(client));
                let mut registered = self.registered.lock().unwrap_or_else(|e| e.into_inner());
                Ok(Arc::clone(registered.entry(key).or_insert(store)))
            }
            other => Err(DataFusionError::Execution(format!(
                "dfx reads tables on local files and S3 only, not {other}:// ({url})"
            ))),
        }
    }
}

/// `runtime` with the table stores for `options` in place of its object
/// stores; its memory pool, disk manager and caches kept.
///
/// # Errors
///
/// A runtime DataFusion refuses to build.
pub fn with_table_stores(runtime: &RuntimeEnv, options: S3Options) -> DfResult<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::from_runtime_env(runtime)
        .with_object_store_registry(Arc::new(TableStores::new(options)))
        .build_arc()
}

/// `context` with the table stores its session's S3 settings configure
/// (`dfx_engine.s3_*`), for decoding or running a scan of a table on S3.
///
/// # Errors
///
/// A session whose dfx settings do not parse, or a runtime DataFusion
/// refuses to build.
pub fn with_table_stores_context(context: &TaskContext) -> DfResult<TaskContext> {
    let config = DfxConfig::from_config(context.session_config().options())?;
    let runtime = with_table_stores(&context.runtime_env(), S3Options::from_config(&config))?;
    Ok(rebuilt_task_context(
        context,
        context.session_config().clone(),
        runtime,
    ))
}
