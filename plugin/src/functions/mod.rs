//! The plugin's SQL functions.
//!
//! They travel by *name*: a plan refers to `dfx_net_revenue`, and every
//! session that decodes it (driver and workers) registers these functions.

mod net_revenue;
#[cfg(feature = "test-hooks")]
mod test_panic;
mod weighted_avg;

use std::sync::Arc;

use datafusion::logical_expr::{AggregateUDF, ScalarUDF};

pub use net_revenue::NetRevenue;
#[cfg(feature = "test-hooks")]
pub use test_panic::{TEST_PANIC_NAME, TestPanic};
pub use weighted_avg::WeightedAvg;

/// Every scalar function the plugin ships (and, in a `test-hooks` build,
/// `dfx_test_panic`).
pub fn scalar_udfs() -> Vec<Arc<ScalarUDF>> {
    #[allow(unused_mut)]
    let mut udfs = vec![Arc::new(ScalarUDF::new_from_impl(NetRevenue::default()))];
    #[cfg(feature = "test-hooks")]
    udfs.push(Arc::new(ScalarUDF::new_from_impl(TestPanic::default())));
    udfs
}

/// Every aggregate function the plugin ships.
pub fn aggregate_udfs() -> Vec<Arc<AggregateUDF>> {
    vec![Arc::new(
        AggregateUDF::new_from_impl(WeightedAvg::default()),
    )]
}
