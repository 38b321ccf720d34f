//! Every dfx node's name, written once: the codec, the nodes, the checks
//! and the hosts ask here.

/// Name of the stage writer node.
pub const WRITER_NODE_NAME: &str = "ShuffleWriterExec";

/// Name of the reader node.
pub const READER_NODE_NAME: &str = "ShuffleReaderExec";

/// Name of the node that carries a file scan cut for one map.
pub const MAP_SCAN_NODE_NAME: &str = "MapScanExec";

/// Name of the node that runs a whole recursive query in one process.
pub const SEALED_NODE_NAME: &str = "SealedRecursiveQueryExec";

/// Name of the node that runs a stage's operators inside the plugin, under
/// the session's memory limit.
pub const SEALED_INPUT_NODE_NAME: &str = "SealedInputExec";

/// Name of the node that scans a table on an object store through the
/// worker's stores.
pub const STORE_SCAN_NODE_NAME: &str = "StoreScanExec";

/// Name of the node that filters a probe side by a build stage's keys.
pub const JOIN_FILTER_NODE_NAME: &str = "JoinFilterExec";

/// Name of the node that summarizes a build side's join keys.
pub const KEY_SUMMARY_NODE_NAME: &str = "KeySummaryExec";

/// Name of DataFusion's recursive query node, which the codec carries.
pub const RECURSIVE_QUERY_NODE_NAME: &str = "RecursiveQueryExec";

/// Name of DataFusion's work table node, which the codec carries.
pub const WORK_TABLE_NODE_NAME: &str = "WorkTableExec";

/// Every node the codec encodes, in the order its refusal lists them.
pub const ENCODED_NODE_NAMES: [&str; 10] = [
    WRITER_NODE_NAME,
    READER_NODE_NAME,
    SEALED_NODE_NAME,
    SEALED_INPUT_NODE_NAME,
    STORE_SCAN_NODE_NAME,
    MAP_SCAN_NODE_NAME,
    KEY_SUMMARY_NODE_NAME,
    JOIN_FILTER_NODE_NAME,
    RECURSIVE_QUERY_NODE_NAME,
    WORK_TABLE_NODE_NAME,
];

/// [`ENCODED_NODE_NAMES`] as a sentence: `A, B and C`.
pub fn encoded_node_names() -> String {
    let last = ENCODED_NODE_NAMES.len() - 1;
    format!(
        "{} and {}",
        ENCODED_NODE_NAMES[..last].join(", "),
        ENCODED_NODE_NAMES[last]
    )
}
