//! `dfx_engine._internal`: the dfx plugin file, seen from datafusion-python.
//!
//! This module compiles no engine code. It loads the same `libdfx_plugin.so`
//! the Rust host loads, through the same `dfx_abi::load` handshake, and hands
//! the plugin's `datafusion-ffi` structs to datafusion-python as PyCapsules.
//! It also links the runtime the Rust host links (`dfx_runtime`): the scheduler, the
//! task protocol and the session spec, so the Python driver and worker keep
//! only what needs a datafusion-python session (plan, encode, execute).
//!
//! ```text
//! libdfx_plugin.so ──dfx_abi::load──► Plugin ──FFI_* in a PyCapsule──► datafusion-python
//!   (bundled next to this module,        │
//!    or named by DFX_PLUGIN)             └─ constants, counters, paths,
//!                                           stage info of encoded stages,
//!                                           location probe, stage vetting,
//!                                           driver lock ──► dfx_engine.*
//! dfx_runtime ──► spec.rs (SessionSpec), prepare.rs (describe and cut the
//!                 encoded stages), scheduler.rs (pool, process, foreign
//!                 executors, attempts, the root's reruns), worker.rs (serve,
//!                 one task from a file or by value)
//! ```
//!
//! Glossary: a *capsule* is a named `PyCapsule` owning one boxed `FFI_*`
//! struct (dropped with the capsule); a *getter* is the dunder method
//! datafusion-python calls to obtain one (`__datafusion_query_planner__`).

mod blocking;
mod capsule;
mod config;
mod driving;
mod error;
mod extension;
mod functions;
mod location;
mod plugin;
mod prepare;
mod scheduler;
mod settings;
mod spec;
mod stage_info;
mod worker;

use pyo3::prelude::*;

/// The native half of the `dfx_engine` package.
#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<extension::DfxEngineExtension>()?;
    m.add_class::<extension::DfxPhysicalCodec>()?;
    m.add_class::<extension::DfxLogicalCodec>()?;
    m.add_class::<extension::DfxRootCodec>()?;
    m.add("ROOT_CODEC_ID", driving::ROOT_CODEC_ID)?;
    m.add(
        "ROOT_NODE_NAME",
        dfx_runtime::root::distributed_root_exec::DISTRIBUTED_ROOT_NODE_NAME,
    )?;
    m.add_class::<config::DfxEngineConfig>()?;
    m.add_class::<functions::DfxScalarFunction>()?;
    m.add_class::<functions::DfxAggregateFunction>()?;
    m.add_function(wrap_pyfunction!(functions::scalar_functions, m)?)?;
    m.add_function(wrap_pyfunction!(functions::aggregate_functions, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::plugin_path, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::plugin_name, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::plugin_version, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::abi_version, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::datafusion_ffi_major, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::host_datafusion_ffi_major, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::stage_node_name, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::reader_node_name, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::config_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::physical_codec_id, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::map_footer, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::stage_id, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::map_path, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::marker_path, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::bucket_path, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::partition_glob, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::counters, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::take_failures, m)?)?;
    m.add_class::<stage_info::StageInfo>()?;
    m.add_function(wrap_pyfunction!(stage_info::encoded_stage_info, m)?)?;
    m.add_function(wrap_pyfunction!(location::probe_location, m)?)?;
    m.add_function(wrap_pyfunction!(location::vet_stage, m)?)?;
    m.add_function(wrap_pyfunction!(location::temporary_root, m)?)?;
    m.add_function(wrap_pyfunction!(location::remove_temporary_root, m)?)?;
    m.add_class::<location::DriverLock>()?;
    m.add_function(wrap_pyfunction!(spec::normalize_spec, m)?)?;
    m.add_function(wrap_pyfunction!(spec::serving_cluster_durability, m)?)?;
    m.add_function(wrap_pyfunction!(spec::table_statement, m)?)?;
    m.add_function(wrap_pyfunction!(spec::effective_target_partitions, m)?)?;
    m.add_function(wrap_pyfunction!(spec::parse_script, m)?)?;
    m.add_function(wrap_pyfunction!(spec::unreadable_file, m)?)?;
    m.add_function(wrap_pyfunction!(spec::partition_clash, m)?)?;
    m.add_function(wrap_pyfunction!(spec::plugin_settings, m)?)?;
    spec::add_constants(m)?;
    m.add_function(wrap_pyfunction!(settings::session_settings, m)?)?;
    m.add_class::<prepare::PreparedStages>()?;
    m.add_function(wrap_pyfunction!(prepare::prepare, m)?)?;
    m.add_function(wrap_pyfunction!(prepare::plan_stages, m)?)?;
    m.add_class::<scheduler::WorkerPool>()?;
    m.add_class::<scheduler::Scheduler>()?;
    m.add_class::<scheduler::QueryRun>()?;
    m.add_class::<scheduler::ClaimedLocation>()?;
    m.add_class::<driving::SessionDriver>()?;
    m.add("WorkerLost", m.py().get_type::<error::WorkerLost>())?;
    m.add(
        "MALLOC_TUNABLES_VAR",
        dfx_runtime::scheduler::process::MALLOC_TUNABLES_VAR,
    )?;
    m.add(
        "SERVING_MALLOC_TUNABLES",
        dfx_runtime::scheduler::process::SERVING_MALLOC_TUNABLES,
    )?;
    m.add_class::<worker::Task>()?;
    m.add_function(wrap_pyfunction!(worker::serve, m)?)?;
    m.add_function(wrap_pyfunction!(worker::run_task_file, m)?)?;
    m.add_function(wrap_pyfunction!(worker::run_task_value, m)?)?;
    m.add_function(wrap_pyfunction!(worker::start_map_server, m)?)?;
    m.add_function(wrap_pyfunction!(worker::map_server_counts, m)?)?;
    m.add_class::<worker::TaskPlacement>()?;
    m.add_function(wrap_pyfunction!(worker::task_placement, m)?)?;
    m.add("MEMORY_TABLE_LIMIT", dfx_abi::MEMORY_TABLE_LIMIT)?;
    m.add("SHUFFLE_RANGES", dfx_abi::SHUFFLE_RANGES)?;
    m.add("MEMORY_TABLE_TOO_LARGE", dfx_abi::MEMORY_TABLE_TOO_LARGE)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
