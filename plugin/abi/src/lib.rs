//! The ABI of a dfx plugin file, and the one loader every host uses.
//!
//! A dfx plugin is a `cdylib` exporting one `abi_stable` root module,
//! [`DfxPlugin`]. A host calls [`load()`] with the file's path, which performs
//! the whole handshake before anything in the library is called:
//!
//! 1. open the file as a shared library ([`LoadCheck::Open`]);
//! 2. find the exported root module ([`LoadCheck::NotADfxPlugin`]);
//! 3. let `abi_stable` check its version numbers and the root module's layout
//!    ([`LoadCheck::AbiStableVersion`], [`LoadCheck::RootModuleLayout`]);
//! 4. compare the dfx ABI version and the `datafusion-ffi` major the plugin
//!    declares with this host's ([`LoadCheck::DfxAbiVersion`],
//!    [`LoadCheck::DataFusionMajor`]).
//!
//! Only then does [`Plugin`] hand out the plugin's constructors.
//!
//! ```no_run
//! let plugin = dfx_abi::load(std::path::Path::new("target/debug/libdfx_plugin.so"))?;
//! println!("{} {}", plugin.name(), plugin.version());
//! # Ok::<(), dfx_abi::LoadError>(())
//! ```

pub mod compat;
pub mod failure;
pub mod load;
pub mod location;
pub mod lock;
pub mod map_file;
pub mod map_layout;
pub mod map_ticket;
pub mod module;
pub mod plugin;
pub mod stages;
pub mod tables;

pub use compat::{DFX_ABI_VERSION, LoadCheck, LoadError, host_datafusion_ffi_major};
pub use failure::{FailureClass, IO_FAILURE};
pub use load::{load, plugin_file_name};
pub use location::{LocationError, S3Location, ShuffleLocation};
pub use lock::{DriverLock, S3_LOCK_OBJECT, S3LockHolder};
pub use map_file::{MAP_FOOTER_BYTES, MAP_FOOTER_MAGIC, map_marker_range};
pub use map_layout::{
    BucketRange, MapLayout, SHUFFLE_RANGES, SUMMARY_COLUMNS, SUMMARY_KEYS_COLUMNS, StageLayouts,
};
pub use map_ticket::{
    MAP_COPY_DIR, MAP_SERVER, MAX_TICKET_RANGES, MapTicket, MapTicketAnswer, SHUFFLE_DURABILITY,
};
pub use module::{DfxCounters, DfxPlugin, DfxPluginRef, DfxStageInfo, FfiResult};
pub use plugin::Plugin;
pub use stages::PARTITIONS_PER_TASK;
pub use tables::{MEMORY_TABLE_LIMIT, MEMORY_TABLE_TOO_LARGE, PARQUET_FOOTER_HINT};
