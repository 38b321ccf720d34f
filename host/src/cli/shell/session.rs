//! The shell's session: the spec every query is planned and run with
//! (tables created so far, settings), the one host whose worker pool runs
//! every query, and where each query gets a fresh location.
//!
//! ```text
//! CREATE EXTERNAL TABLE ─► spec.tables      SET ─► spec's options
//! SELECT ─► --shuffle-root: the runtime's <root>/q-<time>-<random>/
//!           else: <--shuffle-dir or a temporary directory>/query-N-xxxx/
//!        ─► host.run_distributed ─► answer printed, footer
//!        ─► the location removed (a failed query's kept under a root)
//! ```

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use dfx_host::{DistributedResult, Host, HostError, Result, SessionSpec, build_session};
use dfx_runtime::spec::Script;

use super::settings::{self, Setting};

/// The shell's state between inputs.
pub struct ShellSession {
    host: Host,
    spec: SessionSpec,
    /// Where each query's directory is made without a shuffle root; the
    /// temporary one, if the shell made it, is removed when the shell ends.
    root: PathBuf,
    temp_root: Option<tempfile::TempDir>,
    maxrows: usize,
    analyze: bool,
    queries: u64,
    /// The workers (process ids) the last query's tasks ran on.
    last_workers: BTreeSet<u32>,
}

impl ShellSession {
    /// A session over `host` and `spec` (its tables and settings), each
    /// query's location made under `root` (`None`: a temporary directory),
    /// answers printed up to `maxrows` rows.
    ///
    /// # Errors
    ///
    /// A root that is a URL or cannot be created.
    pub fn new(
        host: Host,
        spec: SessionSpec,
        root: Option<&Path>,
        maxrows: usize,
        analyze: bool,
    ) -> Result<Self> {
        let (root, temp_root) = match root {
            Some(dir) if spec.shuffle_root.is_some() => {
                return Err(HostError::Invalid(format!(
                    "dfx shell takes --shuffle-root or --shuffle-dir, not both (got {})",
                    dir.display()
                )));
            }
            // Under a root the runtime makes each query's location itself.
            None if spec.shuffle_root.is_some() => (PathBuf::new(), None),
            Some(url) if dfx_runtime::spec::ShuffleLocation::is_url(url) => {
                return Err(HostError::Invalid(format!(
                    "dfx shell needs a local --shuffle-dir (each query gets a fresh directory \
                     under it, removed after its answer), got {}",
                    url.display()
                )));
            }
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| HostError::io("cannot create", dir, e))?;
                let dir = std::path::absolute(dir)
                    .map_err(|e| HostError::io("cannot resolve", dir, e))?;
                (dir, None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("dfx-shell-")
                    .tempdir()
                    .map_err(|e| HostError::io("cannot create", std::env::temp_dir(), e))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        Ok(Self {
            host,
            spec,
            root,
            temp_root,
            maxrows,
            analyze,
            queries: 0,
            last_workers: BTreeSet::new(),
        })
    }

    /// Run one SQL statement: a query, a `CREATE EXTERNAL TABLE`, `SET` or
    /// `SHOW`.
    ///
    /// # Errors
    ///
    /// What [`Host::run_distributed`] reports for a query (the text
    /// `dfx run` prints), SQL that does not parse or is none of those
    /// statements, a table defined twice or that cannot be registered, a
    /// setting no session takes.
    pub async fn run_statement(&mut self, sql: &str) -> Result<()> {
        let started = Instant::now();
        if let Some(setting) = settings::parse(sql) {
            return self.setting(setting.map_err(HostError::Invalid)?).await;
        }
        let script = Script::parse_statements(sql)?;
        if !script.tables.is_empty() {
            let mut spec = self.spec.clone();
            for (name, table) in script.tables {
                if spec.tables.contains_key(&name) {
                    return Err(HostError::Invalid(format!(
                        "table {name} exists already in this session"
                    )));
                }
                let table = table
                    .absolute()
                    .map_err(|e| HostError::io("cannot resolve", name.as_str(), e))?;
                spec.tables.insert(name.clone(), table);
                // Registered once here, so a location that holds nothing or
                // a bad option is told now, not at the next query.
                build_session(self.host.plugin(), &spec).await?;
                println!("Table {name} created.");
            }
            self.spec = spec;
            println!("Elapsed {:.3} seconds.\n", started.elapsed().as_secs_f64());
        }
        for query in &script.queries {
            self.query(query, started).await?;
        }
        Ok(())
    }

    /// Run `sql` distributed in a fresh location, removed once the answer
    /// is read; print the answer and the footer.
    async fn query(&mut self, sql: &str, started: Instant) -> Result<()> {
        self.queries += 1;
        let result = if self.spec.shuffle_root.is_some() {
            // The shuffle root's rule: the runtime claims a fresh location
            // under it, removes it once read and keeps (and names) it when
            // the query fails.
            self.host.run_distributed(sql, &self.spec).await?
        } else {
            self.query_in_fresh_directory(sql).await?
        };
        self.last_workers = result
            .task_reports
            .values()
            .filter_map(|report| report.worker)
            .collect();
        self.print_answer(&result.batches)?;
        println!(
            "{} row(s) fetched. Elapsed {:.3} seconds. {} stage(s), {} task(s).\n",
            result.rows(),
            started.elapsed().as_secs_f64(),
            result.stages.len(),
            result.tasks.len()
        );
        self.print_analysis(&result);
        Ok(())
    }

    /// Run `sql` in a fresh directory under the shell's own (`--shuffle-dir`
    /// or a temporary one): a location must hold no stage output, and the
    /// pool's workers serve every query of the session.
    async fn query_in_fresh_directory(&self, sql: &str) -> Result<DistributedResult> {
        let location = tempfile::Builder::new()
            .prefix(&format!("query-{}-", self.queries))
            .tempdir_in(&self.root)
            .map_err(|e| HostError::io("cannot create a query location in", &self.root, e))?;
        let spec = self.spec.clone().with_shuffle_dir(location.path());
        let outcome = self.host.run_distributed(sql, &spec).await;
        let path = location.path().to_path_buf();
        location
            .close()
            .map_err(|e| HostError::io("cannot remove", path, e))?;
        outcome
    }

    /// The answer, at most `maxrows` rows of it, saying how many more there
    /// were.
    fn print_answer(&self, batches: &[RecordBatch]) -> Result<()> {
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let mut shown = Vec::new();
        let mut left = self.maxrows;
        for batch in batches {
            if left == 0 {
                break;
            }
            let take = batch.num_rows().min(left);
            shown.push(batch.slice(0, take));
            left -= take;
        }
        // Columns are shown even when no row is.
        if shown.is_empty()
            && let Some(first) = batches.first()
        {
            shown.push(first.slice(0, 0));
        }
        let table = pretty_format_batches(&shown)
            .map_err(|e| HostError::Invalid(format!("cannot print the result: {e}")))?;
        let mut out = std::io::stdout().lock();
        let write = |e| HostError::io("cannot write", "stdout", e);
        writeln!(out, "{table}").map_err(write)?;
        if rows > self.maxrows {
            writeln!(
                out,
                "(first {} of {rows} rows shown, {} more; --maxrows N or --maxrows inf shows \
                 more)",
                self.maxrows,
                rows - self.maxrows
            )
            .map_err(write)?;
        }
        Ok(())
    }

    /// With `--analyze`, each stage's tasks and the critical path.
    fn print_analysis(&self, result: &DistributedResult) {
        if self.analyze {
            eprint!("{}", dfx_host::driver::analyze::render(result));
        }
    }

    /// `SET` changes the spec the next queries use, once a session built
    /// from it accepts the value; `SHOW` prints from such a session.
    async fn setting(&mut self, setting: Setting) -> Result<()> {
        match setting {
            Setting::Set { key, value } => {
                let spec = settings::apply(&self.spec, &key, &value).map_err(HostError::Invalid)?;
                // The plugin and DataFusion judge the key and value: a
                // session that cannot be built from the spec is refused
                // now, not by every worker of the next query.
                build_session(self.host.plugin(), &spec)
                    .await
                    .map_err(|e| HostError::Invalid(format!("cannot SET {key}: {e}")))?;
                self.spec = spec;
                println!("{key} = {value}\n");
            }
            Setting::Show(key) => {
                let session = build_session(self.host.plugin(), &self.spec).await?;
                let entries = session
                    .ctx()
                    .copied_config()
                    .options()
                    .entries()
                    .into_iter()
                    .map(|entry| (entry.key, entry.value));
                let all = settings::settings_of(&self.spec, entries);
                let shown: Vec<(&String, &String)> = match &key {
                    None => all.iter().collect(),
                    Some(key) => match all.get_key_value(key.as_str()) {
                        Some(found) => vec![found],
                        None => {
                            return Err(HostError::Invalid(format!(
                                "no setting {key} (SHOW ALL lists them)"
                            )));
                        }
                    },
                };
                print_pairs(("name", "value"), &shown)?;
            }
        }
        Ok(())
    }

    /// `\d`: the session's tables, their format and location.
    pub fn list_tables(&self) -> Result<()> {
        let rows: Vec<(String, String)> = self
            .spec
            .tables
            .iter()
            .map(|(name, table)| {
                (
                    name.clone(),
                    format!("{} {}", table.format.as_sql(), table.location),
                )
            })
            .collect();
        let rows: Vec<(&String, &String)> = rows.iter().map(|(a, b)| (a, b)).collect();
        print_pairs(("table", "stored as, location"), &rows)
    }

    /// `\d NAME`: the columns of table `name` and their types, as a session
    /// built from the spec registers it.
    ///
    /// # Errors
    ///
    /// No such table, or one that cannot be registered.
    pub async fn describe(&self, name: &str) -> Result<()> {
        if !self.spec.tables.contains_key(name) {
            return Err(HostError::Invalid(format!(
                "no table {name} in this session (\\d lists them)"
            )));
        }
        let session = build_session(self.host.plugin(), &self.spec).await?;
        let provider = session
            .ctx()
            .table_provider(name)
            .await
            .map_err(|e| HostError::datafusion(format!("cannot read table {name}"), e))?;
        let rows: Vec<(String, String)> = provider
            .schema()
            .fields()
            .iter()
            .map(|field| {
                let null = if field.is_nullable() { "" } else { " NOT NULL" };
                (field.name().clone(), format!("{}{null}", field.data_type()))
            })
            .collect();
        let rows: Vec<(&String, &String)> = rows.iter().map(|(a, b)| (a, b)).collect();
        print_pairs(("column", "type"), &rows)
    }

    /// `\stats`: queries run, and the one pool that ran them.
    pub fn stats(&self) -> String {
        let pids = |pids: &mut dyn Iterator<Item = u32>| {
            pids.map(|pid| pid.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let pool = self.host.pool();
        format!(
            "queries run: {}\nworkers started by this session's pool: {}\nworkers alive: {}\n\
             workers that ran the last query: {}\n",
            self.queries,
            pool.started(),
            pids(&mut pool.pids().into_iter()),
            pids(&mut self.last_workers.iter().copied()),
        )
    }

    /// End the pool's workers and remove the temporary root.
    pub async fn close(self) {
        self.host.shutdown().await;
        if let Some(root) = self.temp_root {
            let path = root.path().to_path_buf();
            if let Err(err) = root.close() {
                eprintln!("dfx: cannot remove {}: {err}", path.display());
            }
        }
    }
}

/// Two columns as an aligned table, under `header`.
fn print_pairs(header: (&str, &str), rows: &[(&String, &String)]) -> Result<()> {
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new(header.0, DataType::Utf8, false),
        Field::new(header.1, DataType::Utf8, false),
    ]));
    let first: StringArray = rows.iter().map(|(a, _)| Some(a.as_str())).collect();
    let second: StringArray = rows.iter().map(|(_, b)| Some(b.as_str())).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![std::sync::Arc::new(first), std::sync::Arc::new(second)],
    )
    .map_err(|e| HostError::Invalid(format!("cannot print: {e}")))?;
    let table = pretty_format_batches(&[batch])
        .map_err(|e| HostError::Invalid(format!("cannot print: {e}")))?;
    println!("{table}\n");
    Ok(())
}
