//! The `dfx` subcommands the binary defines itself, one module each; `tpch`
//! and `bench` live in the library ([`dfx_host::tpch`], [`dfx_host::bench`]).

pub mod explain;
pub mod gc;
pub mod query;
pub mod run;
pub mod shell;
pub mod worker;
