//! The config's keys, each written once: its prefix and the full key of
//! every setting a user gives, as hosts and messages spell them.

/// Prefix of every dfx config key.
pub const CONFIG_PREFIX: &str = "dfx_engine";

/// The full key of the shuffle directory.
pub const SHUFFLE_DIR_KEY: &str = "dfx_engine.shuffle_dir";

/// The full key of the split rule.
pub const SPLIT_KEY: &str = "dfx_engine.split";

/// The full key of the shuffle files' compression.
pub const SHUFFLE_COMPRESSION_KEY: &str = "dfx_engine.shuffle_compression";

/// The full key of the S3 endpoint (overrides `AWS_ENDPOINT_URL`).
pub const S3_ENDPOINT_KEY: &str = "dfx_engine.s3_endpoint";

/// The full key of the S3 region (overrides `AWS_REGION`).
pub const S3_REGION_KEY: &str = "dfx_engine.s3_region";

/// The full key allowing plain http to the S3 endpoint.
pub const S3_ALLOW_HTTP_KEY: &str = "dfx_engine.s3_allow_http";

/// The full key of the in-memory table limit ([`dfx_abi::MEMORY_TABLE_LIMIT`]
/// under [`CONFIG_PREFIX`]).
pub const MEMORY_TABLE_LIMIT_KEY: &str = "dfx_engine.memory_table_limit";

/// The full key of the memory limit of a stage the plugin runs itself.
pub const MEMORY_LIMIT_KEY: &str = "dfx_engine.memory_limit";

/// The full key of the filters that cross stages.
pub const JOIN_FILTERS_KEY: &str = "dfx_engine.join_filters";

/// The full key of the build-to-probe row ratio under which `auto` filters.
pub const JOIN_FILTER_RATIO_KEY: &str = "dfx_engine.join_filter_ratio";

/// The full key of running a plan of one-task stages as one stage.
pub const COLLAPSE_STAGES_KEY: &str = "dfx_engine.collapse_stages";

/// The full key of adaptive coalescing.
pub const COALESCE_KEY: &str = "dfx_engine.coalesce";

/// The full key of the most bytes a coalesced task reads.
pub const COALESCE_TASK_BYTES_KEY: &str = "dfx_engine.coalesce_task_bytes";

/// The full key of adaptive skew splitting.
pub const SKEW_SPLIT_KEY: &str = "dfx_engine.skew_split";

/// The full key of the factor over the median past which a partition is skewed.
pub const SKEW_SPLIT_FACTOR_KEY: &str = "dfx_engine.skew_split_factor";

/// The full key of the fewest bytes a skewed partition has.
pub const SKEW_SPLIT_BYTES_KEY: &str = "dfx_engine.skew_split_bytes";

/// The full key of adaptive broadcast switching.
pub const BROADCAST_SWITCH_KEY: &str = "dfx_engine.broadcast_switch";
