//! What a worker checks in an encoded stage before it builds anything from it.
//!
//! An envelope is code: its plan can hold any node the host's codecs decode.
//! A worker runs stages of one query, which read that query's tables and
//! shuffle location and write only the shuffle location. So a stage is
//! refused when it holds:
//!
//! - a sink of any kind (`DataSinkExec`: Parquet, CSV, JSON, ...): a stage
//!   writes through its writer only;
//! - a file scan of a path outside the tables the worker's spec names (and
//!   the tables its driver carried into the location's `sources/`), or on
//!   an object store other than the local file system;
//! - a dfx writer aimed at another shuffle location (nested stages too);
//! - an extension node that is not dfx's: nothing here can say what it does;
//! - a scan cut for a map other than the task's, or not cut for any (a
//!   stage's shared part, see [`crate::encoded`]).
//!
//! The plan is walked in its protobuf JSON form, generically: every key that
//! names a sink, every file path and store URL, every extension node, at any
//! depth. A node type added to DataFusion later is still walked (its sinks
//! still end in `Sink`, its files still sit in `fileGroups`), where a match
//! over today's node types would pass it unseen.

use std::path::PathBuf;

use base64::Engine;
use datafusion_proto::protobuf::PhysicalPlanNode;
use object_store::path::Path as ObjectPath;
use prost::Message;
use serde_json::Value;

use crate::exchange::store::canonical_location;
use crate::memory_table::is_source_file;
use crate::wire::{ANY_MAP, PAYLOAD_MAGIC, Payload, UNCUT_MAP};

/// What a worker may touch: its spec's tables and its shuffle location.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    /// Table roots (directories, files, `s3://bucket/prefix`), as the spec
    /// names them.
    pub tables: Vec<PathBuf>,
    /// The shuffle location every dfx writer in the stage must publish into.
    pub shuffle_dir: String,
    /// The task's map, when known: every scan cut for a map must be cut
    /// for this one.
    pub map: Option<u64>,
}

impl Allowed {
    /// Parse the JSON a host passes: `{"tables": [...], "shuffle_dir": "..."}`,
    /// and the task's `"map"` when the host knows it.
    ///
    /// # Errors
    ///
    /// Text that is not that object.
    pub fn from_json(text: &str) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct Wire {
            tables: Vec<PathBuf>,
            shuffle_dir: String,
            #[serde(default)]
            map: Option<u64>,
        }
        let wire: Wire = serde_json::from_str(text).map_err(|e| {
            format!(
                "the allowed locations are not {{\"tables\": [...], \"shuffle_dir\": ...}}: {e}"
            )
        })?;
        Ok(Self {
            tables: wire.tables,
            shuffle_dir: wire.shuffle_dir,
            map: wire.map,
        })
    }
}

/// Refuse the encoded stage `plan_bytes` if it holds anything a worker must
/// not run (see the module doc); every finding is listed in the error.
///
/// # Errors
///
/// Bytes that are not a protobuf physical plan, or one error naming each
/// node refused and where it sits in the plan.
pub fn vet_encoded_stage(plan_bytes: &[u8], allowed: &Allowed) -> Result<(), String> {
    let findings = plan_findings(plan_bytes, allowed)?;
    if findings.is_empty() {
        return Ok(());
    }
    Err(format!(
        "refusing the stage: {}. A worker runs only stages that read its query's tables and \
         shuffle location and publish through dfx's writer",
        findings.join("; ")
    ))
}

/// Everything refused in the encoded plan `plan_bytes`, each naming where.
fn plan_findings(plan_bytes: &[u8], allowed: &Allowed) -> Result<Vec<String>, String> {
    let plan = PhysicalPlanNode::decode(plan_bytes)
        .map_err(|e| format!("not an encoded physical plan: {e}"))?;
    let value =
        serde_json::to_value(&plan).map_err(|e| format!("cannot walk the encoded plan: {e}"))?;
    let roots = TableRoots::new(&allowed.tables);
    let mut walk = Walk {
        allowed,
        roots,
        findings: Vec::new(),
        store: LOCAL_STORE.to_string(),
        path: Vec::new(),
    };
    walk.value(&value);
    Ok(walk.findings)
}

/// Each table root in the spellings a file scan may use: the store it is
/// on (`file://`, `s3://bucket`) and its path there, for a local root both
/// as written made absolute and with symlinks resolved.
struct TableRoots(Vec<(String, ObjectPath)>);

/// The store of local files, as a scan names it.
const LOCAL_STORE: &str = "file://";

impl TableRoots {
    fn new(tables: &[PathBuf]) -> Self {
        let mut roots = Vec::new();
        for table in tables {
            let text = table.to_string_lossy();
            if let Some(rest) = text.strip_prefix(dfx_abi::location::S3_SCHEME) {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if let Ok(prefix) = ObjectPath::parse(prefix.trim_end_matches('/')) {
                    roots.push((format!("s3://{bucket}"), prefix));
                }
                continue;
            }
            let table = match text.strip_prefix(dfx_abi::location::FILE_SCHEME) {
                Some(path) => PathBuf::from(path),
                None => table.clone(),
            };
            if let Ok(absolute) = std::path::absolute(&table)
                && let Ok(path) = ObjectPath::from_absolute_path(&absolute)
            {
                roots.push((LOCAL_STORE.to_string(), path));
            }
            if let Ok(path) = ObjectPath::from_filesystem_path(&table) {
                roots.push((LOCAL_STORE.to_string(), path));
            }
        }
        Self(roots)
    }

    /// Whether `store` (as a scan names it: `file:///`, `s3://bucket/`)
    /// holds a table root.
    fn has_store(&self, store: &str) -> bool {
        let store = store_key(store);
        self.0.iter().any(|(root_store, _)| *root_store == store)
    }

    fn holds(&self, store: &str, file: &str) -> bool {
        let store = store_key(store);
        let Ok(file) = ObjectPath::parse(file) else {
            return false;
        };
        self.0
            .iter()
            .any(|(root_store, root)| *root_store == store && file.prefix_match(root).is_some())
    }
}

/// A scan's store URL as roots key it: `file:///` is `file://`,
/// `s3://bucket/` is `s3://bucket`.
fn store_key(store: &str) -> String {
    if store.starts_with(LOCAL_STORE) && store[LOCAL_STORE.len()..].trim_matches('/').is_empty() {
        return LOCAL_STORE.to_string();
    }
    store.trim_end_matches('/').to_string()
}

struct Walk<'a> {
    allowed: &'a Allowed,
    roots: TableRoots,
    findings: Vec<String>,
    /// The store of the scan being walked (`objectStoreUrl`), which its
    /// files' paths are on.
    store: String,
    /// Where the walk is: object keys and array indices from the root. It is
    /// rendered (`plan.extension.inputs[0]`) only for a finding, since a
    /// stage carries every stage below it and most nodes are fine.
    path: Vec<Step<'a>>,
}

/// One step of [`Walk::path`].
#[derive(Clone, Copy)]
enum Step<'v> {
    Key(&'v str),
    Index(usize),
}

impl<'v> Walk<'v> {
    /// The current position, as `plan.a.b[2].c`.
    fn at(&self) -> String {
        let mut at = String::from("plan");
        for step in &self.path {
            match step {
                Step::Key(key) => {
                    at.push('.');
                    at.push_str(key);
                }
                Step::Index(i) => at.push_str(&format!("[{i}]")),
            }
        }
        at
    }

    fn value(&mut self, value: &'v Value) {
        match value {
            Value::Object(fields) => {
                // A scan's files are on the store it names beside them.
                let outer = fields
                    .get("objectStoreUrl")
                    .and_then(Value::as_str)
                    .map(|store| std::mem::replace(&mut self.store, store.to_string()));
                for (key, field) in fields {
                    self.path.push(Step::Key(key));
                    self.field(key, field);
                    self.path.pop();
                }
                if let Some(outer) = outer {
                    self.store = outer;
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.path.push(Step::Index(i));
                    self.value(item);
                    self.path.pop();
                }
            }
            _ => {}
        }
    }

    fn field(&mut self, key: &str, field: &'v Value) {
        if key.ends_with("Sink") {
            let finding = format!("it holds a sink ({key}, at {})", self.at());
            self.findings.push(finding);
            return;
        }
        match key {
            "extension" => self.extension(field),
            "objectStoreUrl" => {
                let url = field.as_str().unwrap_or_default();
                let shuffle_store = self
                    .allowed
                    .shuffle_dir
                    .strip_prefix(dfx_abi::location::S3_SCHEME)
                    .map(|rest| format!("s3://{}", rest.split('/').next().unwrap_or_default()));
                let on_shuffle_store = shuffle_store.is_some_and(|s| s == store_key(url));
                if store_key(url) != LOCAL_STORE && !self.roots.has_store(url) && !on_shuffle_store
                {
                    let finding = format!(
                        "it scans the object store {url:?} (at {}), which holds none of the \
                         spec's tables {:?}",
                        self.at(),
                        self.allowed.tables
                    );
                    self.findings.push(finding);
                }
            }
            "fileGroups" => {
                self.file_paths(field);
                self.value(field);
            }
            _ => self.value(field),
        }
    }

    /// Every `path` under a scan's file groups must lie under a table root.
    fn file_paths(&mut self, groups: &Value) {
        let mut paths = Vec::new();
        collect_paths(groups, &mut paths);
        for path in paths {
            // A table the driver carried into the location is read as one.
            if !self.roots.holds(&self.store, path)
                && !is_source_file(path, &self.allowed.shuffle_dir)
            {
                let shown = match store_key(&self.store).as_str() {
                    LOCAL_STORE => format!("/{path}"),
                    store => format!("{store}/{path}"),
                };
                let finding = format!(
                    "it reads {shown} (at {}), which is under none of the spec's tables {:?}",
                    self.at(),
                    self.allowed.tables
                );
                self.findings.push(finding);
            }
        }
    }

    fn extension(&mut self, node: &'v Value) {
        let payload = node
            .get("node")
            .and_then(Value::as_str)
            .and_then(|text| base64::engine::general_purpose::STANDARD.decode(text).ok())
            .unwrap_or_default();
        match dfx_payload(&payload) {
            Some(Payload::Writer(writer)) => {
                if !same_location(&writer.shuffle_dir, &self.allowed.shuffle_dir) {
                    let finding = format!(
                        "stage {} (at {}) publishes into {}, not the spec's shuffle location {}",
                        writer.stage_id,
                        self.at(),
                        writer.shuffle_dir,
                        self.allowed.shuffle_dir
                    );
                    self.findings.push(finding);
                }
            }
            // A plan of its own: walked as a whole stage is.
            Some(Payload::Sealed { plan }) => match plan_findings(&plan, self.allowed) {
                Ok(inner) => {
                    let at = self.at();
                    for finding in inner {
                        let finding = format!("in the sealed recursive query at {at}, {finding}");
                        self.findings.push(finding);
                    }
                }
                Err(e) => {
                    let finding = format!("its sealed recursive query (at {}) is {e}", self.at());
                    self.findings.push(finding);
                }
            },
            // A writer's input: walked as a whole stage is.
            Some(Payload::SealedInput { plan }) => match plan_findings(&plan, self.allowed) {
                Ok(inner) => {
                    let at = self.at();
                    for finding in inner {
                        let finding = format!("in the sealed stage input at {at}, {finding}");
                        self.findings.push(finding);
                    }
                }
                Err(e) => {
                    let finding = format!("its sealed stage input (at {}) is {e}", self.at());
                    self.findings.push(finding);
                }
            },
            // A scan of its own: walked as a whole stage is.
            Some(Payload::StoreScan { plan }) => match plan_findings(&plan, self.allowed) {
                Ok(inner) => {
                    let at = self.at();
                    for finding in inner {
                        let finding = format!("in the store scan at {at}, {finding}");
                        self.findings.push(finding);
                    }
                }
                Err(e) => {
                    let finding = format!("its store scan (at {}) is {e}", self.at());
                    self.findings.push(finding);
                }
            },
            // Its files are its input's, walked below like any scan's.
            Some(Payload::MapScan(scan)) => {
                let cut_for = match scan.map {
                    UNCUT_MAP => Some("no map: it is a stage's shared part".to_string()),
                    ANY_MAP => None,
                    map if self.allowed.map.is_some_and(|task| task != map) => {
                        Some(format!("map {map}"))
                    }
                    _ => None,
                };
                if let Some(cut_for) = cut_for {
                    let task = self
                        .allowed
                        .map
                        .map_or_else(|| "the task's".to_string(), |m| format!("map {m}"));
                    let finding = format!(
                        "its scan at {} was cut for {cut_for}, not for {task}",
                        self.at()
                    );
                    self.findings.push(finding);
                }
            }
            // A probe side's filter reads its build stage's markers: from the
            // spec's shuffle location only.
            Some(Payload::JoinFilter { node }) => {
                if let Some(dir) = crate::codec::join_filter::read_location(&node)
                    && !same_location(&dir, &self.allowed.shuffle_dir)
                {
                    let finding = format!(
                        "a join filter (at {}) reads {dir}, not the spec's shuffle location {}",
                        self.at(),
                        self.allowed.shuffle_dir
                    );
                    self.findings.push(finding);
                }
            }
            Some(Payload::Reader(reader)) => {
                if !same_location(&reader.shuffle_dir, &self.allowed.shuffle_dir) {
                    let finding = format!(
                        "a reader (at {}) reads stage {} from {}, not the spec's shuffle \
                         location {}",
                        self.at(),
                        reader.stage_id,
                        reader.shuffle_dir,
                        self.allowed.shuffle_dir
                    );
                    self.findings.push(finding);
                }
            }
            Some(Payload::Recursive { .. } | Payload::WorkTable { .. }) => {}
            None => {
                let finding = format!(
                    "it holds an extension node that is not dfx's (at {}), so what it does \
                     cannot be checked",
                    self.at()
                );
                self.findings.push(finding);
            }
        }
        if let Some(inputs) = node.get("inputs") {
            self.path.push(Step::Key("inputs"));
            self.value(inputs);
            self.path.pop();
        }
    }
}

/// The dfx payload inside an extension node's bytes. A host's codec chain
/// may put its own prefix first, so the payload is looked for by its magic.
fn dfx_payload(bytes: &[u8]) -> Option<Payload> {
    (0..bytes.len().saturating_sub(3))
        .filter(|&i| bytes[i..i + 4] == PAYLOAD_MAGIC)
        .find_map(|start| Payload::decode(&bytes[start..]).ok())
}

fn collect_paths<'v>(value: &'v Value, out: &mut Vec<&'v str>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                match (key.as_str(), field) {
                    ("path", Value::String(path)) => out.push(path),
                    _ => collect_paths(field, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_paths(item, out)),
        _ => {}
    }
}

/// Whether two shuffle locations are the same (see [`canonical_location`]).
fn same_location(a: &str, b: &str) -> bool {
    canonical_location(a) == canonical_location(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_root_holds_its_files_and_nothing_beside_it() {
        let roots = TableRoots::new(&[PathBuf::from("/data/t")]);
        let local = "file:///";
        assert!(roots.holds(local, "data/t/part-0.parquet"));
        assert!(roots.holds(local, "data/t/sub/part-0.parquet"));
        assert!(!roots.holds(local, "data/tt/part-0.parquet"));
        assert!(!roots.holds(local, "etc/passwd"));
        assert!(!roots.holds("s3://data/", "t/part-0.parquet"));
    }

    #[test]
    fn an_s3_root_holds_its_prefix_in_its_bucket_only() {
        let roots = TableRoots::new(&[PathBuf::from("s3://b/tpch/lineitem/")]);
        assert!(roots.has_store("s3://b/"));
        assert!(!roots.has_store("s3://c/"));
        assert!(roots.holds("s3://b/", "tpch/lineitem/part-0.parquet"));
        assert!(!roots.holds("s3://b/", "tpch/lineitem2/part-0.parquet"));
        assert!(!roots.holds("s3://c/", "tpch/lineitem/part-0.parquet"));
        assert!(!roots.holds("file:///", "tpch/lineitem/part-0.parquet"));
    }
}
