//! A test-only shared library that exports a function but no root module: a
//! host must refuse it as "not a dfx plugin" without calling anything.

use std::sync::atomic::{AtomicU64, Ordering};

/// Calls of the exported root-module initializer (there is none): stays zero.
#[unsafe(no_mangle)]
pub static DFX_TEST_ROOT_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls of any exported function: must stay zero.
#[unsafe(no_mangle)]
pub static DFX_TEST_CONSTRUCTOR_CALLS: AtomicU64 = AtomicU64::new(0);

/// An ordinary exported function, so the library has something to offer.
#[unsafe(no_mangle)]
pub extern "C" fn dfx_test_not_a_plugin() -> u64 {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst)
}
