//! The planner of a session that drives its queries: the plugin's, planning
//! in the query's own location, its plan under a [`DistributedRootExec`].

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use dfx_abi::stages::find_stages;

use crate::root::located_session::LocatedSession;
use crate::root::{DistributedRootExec, QueryDriver, location_kept};

/// The host's planner (the plugin's, as the host holds it), each query
/// planned in a location claimed for it, and its plan, when it has stages,
/// under a root node that runs them.
#[derive(Debug)]
pub struct DrivingQueryPlanner {
    inner: Arc<dyn QueryPlanner + Send + Sync>,
    driver: Arc<QueryDriver>,
}

impl DrivingQueryPlanner {
    /// `inner`, driving with `driver`.
    pub fn new(inner: Arc<dyn QueryPlanner + Send + Sync>, driver: Arc<QueryDriver>) -> Self {
        Self { inner, driver }
    }

    /// The driver its plans run with.
    pub fn driver(&self) -> &Arc<QueryDriver> {
        &self.driver
    }
}

#[async_trait]
impl QueryPlanner for DrivingQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let driver = &self.driver;
        // First: a location in use or holding stage output is refused before
        // anything is planned into it (in-memory tables are written at
        // planning).
        let claim = driver.claim().await?;
        let location = claim
            .query_spec(driver.spec())
            .shuffle_dir
            .map(|dir| dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        let prefix = driver.plugin.config_prefix();
        let settings = [
            (format!("{prefix}.shuffle_dir"), location),
            (
                format!("{prefix}.split"),
                driver.spec().split.as_str().to_string(),
            ),
        ];
        let planned = match LocatedSession::new(session, &settings) {
            Ok(located) => {
                self.inner
                    .create_physical_plan(logical_plan, &located)
                    .await
            }
            Err(err) => Err(err),
        };
        let plan = match planned {
            Ok(plan) => plan,
            Err(err) => {
                let kept = driver.finish(claim, false).await?;
                return Err(location_kept(err, kept));
            }
        };
        // A plan reading no table (`SELECT 1`, `EXPLAIN`), or one the plugin
        // keeps whole for the driver (`collapse_stages`), has no stage, so no
        // reader: it runs here, and its location is not needed.
        let reads_stages = driver
            .plugin
            .reader_node_name()
            .is_some_and(|reader| !find_stages(&plan, reader).is_empty());
        if !reads_stages {
            driver.finish(claim, true).await?;
            return Ok(plan);
        }
        match DistributedRootExec::new(plan, Arc::clone(driver), claim) {
            Ok(root) => Ok(Arc::new(root)),
            Err(failed) => {
                let (err, claim) = *failed;
                let kept = driver.finish(claim, false).await?;
                Err(location_kept(err, kept))
            }
        }
    }
}
