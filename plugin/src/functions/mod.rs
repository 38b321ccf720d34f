//! The plugin's SQL functions.
//!
//! They travel by *name*: a plan refers to `dfx_net_revenue`, and every
//! session that decodes it (driver and workers) registers these functions.

mod net_revenue;
mod weighted_avg;

use std::sync::Arc;

use datafusion::logical_expr::{AggregateUDF, ScalarUDF};

pub use net_revenue::NetRevenue;
pub use weighted_avg::WeightedAvg;

/// Every scalar function the plugin ships.
pub fn scalar_udfs() -> Vec<Arc<ScalarUDF>> {
    vec![Arc::new(ScalarUDF::new_from_impl(NetRevenue::default()))]
}

/// Every aggregate function the plugin ships.
pub fn aggregate_udfs() -> Vec<Arc<AggregateUDF>> {
    vec![Arc::new(
        AggregateUDF::new_from_impl(WeightedAvg::default()),
    )]
}
