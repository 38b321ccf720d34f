//! The plugin's functions called through FFI give the answers the host
//! computes itself, and the aggregate's state survives a partial/final split
//! across processes.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Array, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::collect;
use dfx_ffi_tests::fixtures::{write_lineitem, write_lineitem_with_price_factor};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{
    plan_display, run_in_child, run_stage, run_stages, stage_display, stages, waves,
};
use dfx_ffi_tests::session::{SPLIT_AGGREGATE, SPLIT_EXCHANGE, SessionOptions, TestSession};

const CHILD: &str = env!("CARGO_BIN_EXE_dfx-ffi-child");

/// Weighted average price by quantity, per flag, worked out by hand:
/// A (100·1 + 200·2 + 70·7) / 10 = 99; N (400·4 + 60·6 + 80·8) / 18 = 2600/18;
/// R (300·3 + 50·5) / 8 = 143.75.
const WEIGHTED_AVG: [(&str, f64); 3] = [("A", 99.0), ("N", 2600.0 / 18.0), ("R", 143.75)];

const WEIGHTED_AVG_SQL: &str = "SELECT l_returnflag, dfx_weighted_avg(l_extendedprice, l_quantity) AS w \
     FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";

/// Relative float comparison (1e-9: one rounding order against another).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Rows of (string column 0, float columns 1..) from `batches`.
fn rows(batches: &[RecordBatch]) -> Vec<(String, Vec<f64>)> {
    let mut out = Vec::new();
    for batch in batches {
        let keys = cast(batch.column(0), &DataType::Utf8).unwrap();
        let keys = keys.as_any().downcast_ref::<StringArray>().unwrap();
        let values: Vec<Arc<dyn Array>> = (1..batch.num_columns())
            .map(|i| cast(batch.column(i), &DataType::Float64).unwrap())
            .collect();
        for row in 0..batch.num_rows() {
            let floats = values
                .iter()
                .map(|v| {
                    v.as_any()
                        .downcast_ref::<Float64Array>()
                        .unwrap()
                        .value(row)
                })
                .collect();
            out.push((keys.value(row).to_string(), floats));
        }
    }
    out
}

/// Plan `sql`, run its stages (if any) in this process, collect the root.
async fn query(session: &TestSession, sql: &str) -> Vec<(String, Vec<f64>)> {
    let plan = session.plan(sql).await.unwrap();
    run_stages(plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();
    rows(&collect(plan, session.ctx.task_ctx()).await.unwrap())
}

fn assert_weighted_avg(found: &[(String, Vec<f64>)]) {
    assert_eq!(found.len(), WEIGHTED_AVG.len(), "{found:?}");
    for ((flag, values), (expected_flag, expected)) in found.iter().zip(WEIGHTED_AVG) {
        assert_eq!(flag, expected_flag);
        assert!(
            close(values[0], expected),
            "{flag}: {} != {expected}",
            values[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scalar_function_equals_the_hosts_own_arithmetic() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let found = query(
        &session,
        "SELECT l_returnflag, dfx_net_revenue(l_extendedprice, l_discount, l_tax), \
         l_extendedprice * (1 - l_discount) * (1 + l_tax) FROM lineitem",
    )
    .await;
    assert_eq!(found.len(), 8);
    for (flag, values) in &found {
        assert!(
            close(values[0], values[1]),
            "{flag}: plugin {} host {}",
            values[0],
            values[1]
        );
    }
    // By hand: 90 + 220 + 150 + 450 + 50 + 45 + 140 + 60.
    let total: f64 = found.iter().map(|(_, v)| v[0]).sum();
    assert!(close(total, 1205.0), "{total}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scalar_function_passes_nulls_through() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session
        .plan("SELECT dfx_net_revenue(CAST(NULL AS DOUBLE), 0.5, 0.0) AS r")
        .await
        .unwrap();
    let batches = collect(plan, session.ctx.task_ctx()).await.unwrap();
    assert_eq!(batches[0].num_rows(), 1);
    assert!(batches[0].column(0).is_null(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_equals_the_hosts_own_arithmetic_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let found = query(
        &session,
        "SELECT l_returnflag, dfx_weighted_avg(l_extendedprice, l_quantity), \
         sum(l_extendedprice * l_quantity) / sum(l_quantity) \
         FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag",
    )
    .await;
    for (flag, values) in &found {
        assert!(
            close(values[0], values[1]),
            "{flag}: plugin {} host {}",
            values[0],
            values[1]
        );
    }
    assert_weighted_avg(&found);
}

/// The partial aggregate's stage runs in another process; the table is then
/// changed under the plan; the rest of the stages and the root run here.
async fn partial_in_a_child_final_here(split: &str) {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let table = write_lineitem(dir.path());
    let options = SessionOptions::distributed(&shuffle)
        .with_table("lineitem", &table)
        .with_split(split);
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(WEIGHTED_AVG_SQL).await.unwrap();
    let display = plan_display(&plan);
    let all = stages(plugin(), &plan).unwrap();
    let reader = plugin().reader_node_name().unwrap();
    // Exactly one stage holds the partial aggregate among its own operators,
    // and it reads no other stage (it reads the table).
    let partial: Vec<usize> = (0..all.len())
        .filter(|&i| stage_display(&all[i].writer, reader).contains("mode=Partial"))
        .collect();
    assert_eq!(partial.len(), 1, "{split}: {display}");
    let partial = &all[partial[0]];
    assert!(partial.info.deps.is_empty(), "{:?}", partial.info);

    // The partial aggregate runs in another process and publishes its state.
    let bytes = session.encode(Arc::clone(&partial.writer)).unwrap();
    let report =
        run_in_child(Path::new(CHILD), &bytes, dir.path()).unwrap_or_else(|err| panic!("{err}"));
    assert!(report.rows.iter().sum::<usize>() >= 3, "{report:?}");

    // Change the table under the plan: if anything here recomputed the
    // partial aggregate instead of reading the child's state, prices would
    // be 10x.
    write_lineitem_with_price_factor(dir.path(), 10.0);
    for wave in waves(&all).unwrap() {
        for index in wave {
            if all[index].info.stage_id != partial.info.stage_id {
                run_stage(&all[index], session.ctx.task_ctx())
                    .await
                    .unwrap();
            }
        }
    }
    let found = rows(&collect(plan, session.ctx.task_ctx()).await.unwrap());
    assert_weighted_avg(&found);

    // And the local answer of the rewritten table is indeed different.
    let local = TestSession::new(
        plugin(),
        &SessionOptions::default().with_table("lineitem", &table),
    )
    .await
    .unwrap();
    let scaled = query(&local, WEIGHTED_AVG_SQL).await;
    assert!(close(scaled[0].1[0], 990.0), "{scaled:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_state_survives_a_partial_final_split_across_processes() {
    partial_in_a_child_final_here(SPLIT_EXCHANGE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_state_survives_the_aggregate_split_across_processes() {
    partial_in_a_child_final_here(SPLIT_AGGREGATE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_and_local_answers_agree() {
    let dir = tempfile::tempdir().unwrap();
    let table = write_lineitem(dir.path());
    let local = TestSession::new(
        plugin(),
        &SessionOptions::default().with_table("lineitem", &table),
    )
    .await
    .unwrap();
    let distributed = TestSession::new(
        plugin(),
        &SessionOptions::distributed(&dir.path().join("shuffle")).with_table("lineitem", &table),
    )
    .await
    .unwrap();
    let sql = "SELECT l_returnflag, dfx_weighted_avg(l_extendedprice, l_quantity), \
               sum(dfx_net_revenue(l_extendedprice, l_discount, l_tax)) \
               FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";
    let a = query(&local, sql).await;
    let b = query(&distributed, sql).await;
    let plan = distributed.plan(sql).await.unwrap();
    assert!(
        !stages(plugin(), &plan).unwrap().is_empty(),
        "{}",
        plan_display(&plan)
    );
    assert_eq!(a.len(), 3);
    assert_eq!(b.len(), 3);
    for ((flag_a, va), (flag_b, vb)) in a.iter().zip(&b) {
        assert_eq!(flag_a, flag_b);
        assert!(
            va.iter().zip(vb).all(|(x, y)| close(*x, *y)),
            "{flag_a}: {va:?} vs {vb:?}"
        );
    }
}
