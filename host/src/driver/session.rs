//! A session whose queries run distributed when their plans execute: the
//! host's executor and options behind the runtime's driving planner.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let host = dfx_host::Host::new(dfx_host::load_plugin(None)?)?;
//! let spec = dfx_host::SessionSpec::new([("t".to_string(), "data/t")])
//!     .with_shuffle_root("/tmp/dfx-root");
//! let session = host.session(&spec).await?;
//! let batches = session.ctx().sql("SELECT count(*) FROM t").await?.collect().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec;
use dfx_runtime::root::{EncodeStage, QueryDriver};
use dfx_runtime::scheduler::WorkerMode;

use crate::driver::Host;
use crate::error::Result;
use crate::session::{DfxSession, SessionSpec, build_driving_session};

impl Host {
    /// A session of `spec` whose every plan with stages runs them on this
    /// host's workers when executed (`collect`, `execute_stream`, a write),
    /// then reads its head here: what [`Host::run_distributed`] does, from
    /// DataFusion's own calls.
    ///
    /// Each query runs in `spec.shuffle_dir`, which must hold no stage
    /// output yet, or in a fresh location under `spec.shuffle_root` (under
    /// this host's temporary root when the spec names neither), removed once
    /// its answer is read unless the spec keeps it, kept and named in the
    /// error after a failure.
    ///
    /// # Errors
    ///
    /// What [`crate::build_session`] reports, or a temporary root that cannot
    /// be made.
    pub async fn session(&self, spec: &SessionSpec) -> Result<DfxSession> {
        let spec = self.with_temporary_root(spec)?;
        let plugin = self.plugin.clone();
        let scheduler = self.scheduler();
        let envelope_files = self.mode == WorkerMode::Process;
        let driver_spec = spec.clone();
        let make = Box::new(move |chain: Arc<crate::session::codec_chain::CodecChain>| {
            let ids = chain.ids();
            let encode: EncodeStage = Arc::new(move |plan| {
                physical_plan_to_bytes_with_extension_codec(plan, chain.as_ref())
                    .map(|bytes| bytes.to_vec())
            });
            QueryDriver::new(plugin, driver_spec, scheduler, ids, encode)
                .with_envelope_files(envelope_files)
        });
        build_driving_session(&self.plugin, &spec, make).await
    }
}
