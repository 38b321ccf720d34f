//! The driver: split a query into tasks, fan them out, finish the query.
//!
//! The six rules it keeps (DESIGN.md), each at the line that keeps it:
//!
//! 1. encode each stage with its session's codecs;
//! 2. ship the codec ids, so a worker refuses what it would misread;
//! 3. the shuffle directory lives in the session config, so it travels
//!    inside the encoded stage;
//! 4. wait for every worker before reading;
//! 5. ship every stage, keyed by `(stage_id, partition)`;
//! 6. refuse a shuffle directory that already holds stage output, before
//!    building anything.

use std::path::Path;

use datafusion::arrow::record_batch::RecordBatch;
use dfx_abi::Plugin;

use crate::dispatch::{FanOutOptions, Task, TaskRows, WorkerCommand, fan_out};
use crate::envelope::{Envelope, TASK_DIR, envelope_path, plan_path};
use crate::error::{DataFusionContext, HostError, Result};
use crate::session::{SessionSpec, build_session};
use crate::stages::{render_with_stages, stages};

/// What a distributed run produced, and how.
#[derive(Debug, Clone)]
pub struct DistributedResult {
    /// The query's answer.
    pub batches: Vec<RecordBatch>,
    /// `(stage_id, partition)` of every task dispatched, one per worker, in
    /// dispatch order. Keyed by both: partition 0 of stage 1 and of stage 2
    /// are different pieces of work.
    pub tasks: Vec<(u64, usize)>,
    /// Rows each task reported, keyed as `tasks` is.
    pub task_rows: TaskRows,
}

impl DistributedResult {
    /// Distinct stage ids, in dispatch order.
    pub fn stage_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.tasks.iter().map(|(s, _)| *s).collect();
        ids.dedup();
        ids
    }

    /// Rows in the answer.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A host: a loaded plugin, and how to start its workers.
///
/// ```no_run
/// # async fn demo() -> dfx_host::Result<()> {
/// let plugin = dfx_host::load_plugin(None)?;
/// let host = dfx_host::Host::new(plugin)?;
/// let spec = dfx_host::SessionSpec::new([("t".to_string(), "data/t".into())])
///     .with_shuffle_dir("/tmp/dfx-q1");
/// let result = host.run_distributed("SELECT count(*) FROM t", &spec).await?;
/// println!("{} tasks", result.tasks.len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Host {
    plugin: Plugin,
    worker: WorkerCommand,
    options: FanOutOptions,
}

impl Host {
    /// A host whose workers are this executable (`<exe> worker <envelope>`),
    /// told to load the same plugin file as the driver.
    ///
    /// # Errors
    ///
    /// When the running executable's path is unknown.
    pub fn new(plugin: Plugin) -> Result<Self> {
        let worker = WorkerCommand::current_exe()?;
        Ok(Self::with_worker(plugin, worker))
    }

    /// A host whose workers are started with `worker`. The plugin's path is
    /// passed to them in `DFX_PLUGIN`, so driver and workers load one file.
    pub fn with_worker(plugin: Plugin, worker: WorkerCommand) -> Self {
        let worker = worker.env(crate::loader::PLUGIN_ENV, plugin.path());
        Self {
            plugin,
            worker,
            options: FanOutOptions::default(),
        }
    }

    /// Cap the workers running at once.
    pub fn max_workers(mut self, max: Option<usize>) -> Self {
        self.options.max_workers = max;
        self
    }

    /// Draw a progress bar on stderr while workers run (only on a terminal).
    pub fn progress(mut self, show: bool) -> Self {
        self.options.progress = show;
        self
    }

    /// The plugin.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Run `sql`, each stage partition in its own worker process.
    ///
    /// Needs `spec.shuffle_dir`, which must not already hold stage output.
    ///
    /// # Errors
    ///
    /// No shuffle directory, a reused one, a plan without stages, a stage
    /// that cannot be encoded, any failed worker (all reported together), or
    /// a failure of the final read.
    pub async fn run_distributed(
        &self,
        sql: &str,
        spec: &SessionSpec,
    ) -> Result<DistributedResult> {
        let shuffle_dir = spec.shuffle_dir.clone().ok_or_else(|| {
            HostError::Invalid(
                "a distributed run needs a shuffle directory; the spec has none".into(),
            )
        })?;
        // Rule 6, first of all: nothing is built, planned or written into a
        // directory whose files the stage nodes would read as this query's.
        require_empty_shuffle(&self.plugin, &shuffle_dir)?;

        // Rule 3: the spec's shuffle directory goes into the session config.
        let session = build_session(&self.plugin, spec).await?;
        let plan = session.physical_plan(sql).await?;
        let stages = stages(&self.plugin, &plan);
        if stages.is_empty() {
            return Err(HostError::Invalid(format!(
                "no {} in the plan of {sql:?}; the plugin's planner did not run or its config \
                 extension was not registered",
                self.plugin.stage_node_name()
            )));
        }

        // Rule 2: the ids the workers must carry. The driver's session
        // checked its own against the spec's if the caller set any.
        let shipped = SessionSpec {
            codec_ids: session.codec_ids(),
            ..spec.clone()
        };
        // The driver's scratch lives in `tasks/`, never beside stage output.
        let task_dir = shuffle_dir.join(TASK_DIR);
        std::fs::create_dir_all(&task_dir)
            .map_err(|e| HostError::io("cannot create", &task_dir, e))?;

        // Rule 5: every stage, every partition.
        let mut tasks = Vec::new();
        for stage in &stages {
            // Rule 1: encoded through the session that owns the codecs.
            let bytes = session.encode(stage.plan.clone())?;
            let plan_file = plan_path(&task_dir, stage.stage_id);
            std::fs::write(&plan_file, &bytes)
                .map_err(|e| HostError::io("cannot write", &plan_file, e))?;
            for partition in 0..stage.partitions {
                let envelope = Envelope {
                    spec: shipped.clone(),
                    plan: plan_file.clone(),
                    stage_id: stage.stage_id,
                    partition,
                };
                let path = envelope_path(&task_dir, stage.stage_id, partition);
                envelope.write(&path)?;
                tasks.push(Task {
                    stage_id: stage.stage_id,
                    partition,
                    envelope: path,
                });
            }
        }

        // Rule 4: `fan_out` returns only once every worker has ended.
        let task_rows = fan_out(&self.worker, &tasks, &self.options).await?;

        // The whole query again: every stage partition now has its file, so
        // each stage node streams it and the driver does only the final merge.
        let batches = session
            .ctx()
            .sql(sql)
            .await
            .context(|| format!("cannot plan {sql:?} for the final read"))?
            .collect()
            .await
            .context(|| {
                format!(
                    "cannot read the stage output of {sql:?} in {}",
                    shuffle_dir.display()
                )
            })?;
        Ok(DistributedResult {
            batches,
            tasks: tasks.iter().map(|t| (t.stage_id, t.partition)).collect(),
            task_rows,
        })
    }

    /// Run `sql` in this process with the same session factory and no
    /// shuffle directory, for comparison with a distributed run.
    ///
    /// # Errors
    ///
    /// Whatever building the session, planning or executing reports.
    pub async fn run_local(&self, sql: &str, spec: &SessionSpec) -> Result<Vec<RecordBatch>> {
        let spec = spec.clone().without_shuffle_dir();
        let session = build_session(&self.plugin, &spec).await?;
        session
            .ctx()
            .sql(sql)
            .await
            .context(|| format!("cannot plan {sql:?}"))?
            .collect()
            .await
            .context(|| format!("cannot execute {sql:?}"))
    }

    /// The physical plan of `sql`, each stage marked with its id and
    /// partition count. Writes nothing.
    ///
    /// # Errors
    ///
    /// Whatever building the session or planning reports.
    pub async fn explain(&self, sql: &str, spec: &SessionSpec) -> Result<String> {
        let session = build_session(&self.plugin, spec).await?;
        let plan = session.physical_plan(sql).await?;
        Ok(render_with_stages(&self.plugin, &plan))
    }
}

/// Refuse a directory that already holds stage output.
///
/// A stage node reads a partition's file when it exists and computes it
/// otherwise, and stage ids restart at 1 for every plan: a second query in
/// the same directory would read the first one's files — a confusing schema
/// error at best, silently the old answer at worst. The node cannot tell
/// whose file it sees; the driver, before dispatching anything, can.
/// Only stage output counts (the plugin's glob), not other files a caller
/// keeps there.
///
/// # Errors
///
/// [`HostError::Invalid`] listing the files found.
pub fn require_empty_shuffle(plugin: &Plugin, dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // A directory that does not exist yet holds nothing.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(HostError::io("cannot list", dir, err)),
    };
    let glob = plugin.partition_glob();
    let mut stale: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| glob_match(glob, name))
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    stale.sort();
    Err(HostError::Invalid(format!(
        "shuffle directory {} already holds stage output {stale:?}; a stage reads a partition \
         file when it finds one, so this query would return the previous query's results. \
         Use one shuffle directory per query.",
        dir.display()
    )))
}

/// Match `name` against a glob whose only wildcard is `*`.
fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all: the whole name must match.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn glob() {
        let g = "stage-*-part-*.arrow";
        assert!(glob_match(g, "stage-1-part-0.arrow"));
        assert!(glob_match(g, "stage-12-part-30.arrow"));
        assert!(!glob_match(g, "stage-1-part-0.123-0.arrow.tmp"));
        assert!(!glob_match(g, "tasks"));
        assert!(!glob_match(g, "x-stage-1-part-0.arrow"));
        assert!(glob_match("abc", "abc"));
        assert!(!glob_match("abc", "abcd"));
    }
}
