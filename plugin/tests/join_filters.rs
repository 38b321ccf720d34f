//! Filters that cross stages, on small hand-worked Parquet tables: every
//! join type, nulls, a key coerced from another type, a two-column key and
//! an empty build side give the answer of one process, distributed in both
//! split modes with the filters forced on, left to `auto` and off. Each map
//! runs on its own copy of its stage decoded from the bytes a driver ships
//! (as in a worker), deepest stages first; the head then reads the files.
//!
//! The tables (`b` the build side, `p` the probe side, each two files):
//!
//! ```text
//! b(k Int64, s Utf8, w Int64)          p(k Int32, s Utf8, v Int64)
//!   1  'x'  10                           1 'x' 100   3 'z' 300   9 'x' 900
//!   2  'y'  20                           1 'y' 101   null 'x' 400
//!   null 'z' 30                          2 'y' 200   5 'q' 500 (+ 20 000 rows
//!   3  null 40                                        with k = 1000..21000)
//! ```
//!
//! `b JOIN p ON b.k = p.k` matches (1,x,100), (1,y,101), (2,y,200) and
//! (3,z,300) of `p`: four rows; on `(k, s)` only (1,x) and (2,y): two.

mod common;

use std::sync::Arc;

use common::*;
use datafusion::arrow::array::{Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use dfx_plugin::ShuffleWriterExec;
use dfx_plugin::config::JOIN_FILTERS_KEY;

/// The probe side's filler rows (keys no build row holds), so the probe
/// table is large enough for `auto` to filter it.
const FILLER: i32 = 20_000;

fn write(dir: &std::path::Path, name: &str, batches: &[RecordBatch]) {
    let table = dir.join(name);
    std::fs::create_dir_all(&table).unwrap();
    for (i, batch) in batches.iter().enumerate() {
        let out = std::fs::File::create(table.join(format!("part-{i}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(out, batch.schema(), None).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    }
}

/// The two tables of the module doc, under `dir`.
fn tables(dir: &std::path::Path) {
    let b = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("w", DataType::Int64, false),
    ]));
    let b_batch = |k: Vec<Option<i64>>, s: Vec<Option<&str>>, w: Vec<i64>| {
        RecordBatch::try_new(
            Arc::clone(&b),
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(StringArray::from(s)),
                Arc::new(Int64Array::from(w)),
            ],
        )
        .unwrap()
    };
    write(
        dir,
        "b",
        &[
            b_batch(
                vec![Some(1), Some(2)],
                vec![Some("x"), Some("y")],
                vec![10, 20],
            ),
            b_batch(vec![None, Some(3)], vec![Some("z"), None], vec![30, 40]),
        ],
    );
    let p = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, false),
    ]));
    let p_batch = |k: Vec<Option<i32>>, s: Vec<Option<&str>>, v: Vec<i64>| {
        RecordBatch::try_new(
            Arc::clone(&p),
            vec![
                Arc::new(Int32Array::from(k)),
                Arc::new(StringArray::from(s)),
                Arc::new(Int64Array::from(v)),
            ],
        )
        .unwrap()
    };
    let filler_keys: Vec<Option<i32>> = (1000..1000 + FILLER).map(Some).collect();
    let filler_s: Vec<Option<&str>> = filler_keys.iter().map(|_| Some("f")).collect();
    let filler_v: Vec<i64> = (0..i64::from(FILLER)).collect();
    let mut k = vec![Some(1), Some(1), Some(2)];
    k.extend(filler_keys);
    let mut s = vec![Some("x"), Some("y"), Some("y")];
    s.extend(filler_s);
    let mut v = vec![100, 101, 200];
    v.extend(filler_v);
    write(
        dir,
        "p",
        &[
            p_batch(k, s, v),
            p_batch(
                vec![Some(3), None, Some(5), Some(9)],
                vec![Some("z"), Some("x"), Some("q"), Some("x")],
                vec![300, 400, 500, 900],
            ),
        ],
    );
}

/// A session over the tables, distributing into `shuffle` (or not), with
/// `split`, the filters set to `filters`, and joins partitioned or not.
async fn session(
    data: &std::path::Path,
    shuffle: Option<&std::path::Path>,
    split: &str,
    filters: &str,
    partitioned: bool,
) -> Result<SessionContext> {
    let ctx = session_with(shuffle, split)?;
    ctx.sql(&format!("SET {JOIN_FILTERS_KEY} = '{filters}'"))
        .await?;
    if partitioned {
        ctx.sql("SET datafusion.optimizer.hash_join_single_partition_threshold = 0")
            .await?;
        ctx.sql("SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0")
            .await?;
    }
    for name in ["b", "p"] {
        ctx.register_parquet(
            name,
            &data.join(name).to_string_lossy(),
            ParquetReadOptions::default(),
        )
        .await?;
    }
    Ok(ctx)
}

fn sorted(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The answer of `sql` in one process.
async fn local(data: &std::path::Path, sql: &str) -> Result<Vec<String>> {
    let ctx = session(data, None, "exchange", "auto", false).await?;
    Ok(sorted(&ctx.sql(sql).await?.collect().await?))
}

/// What a distributed run of `sql` answered, its plan and the rows each
/// stage published.
struct Run {
    answer: Vec<String>,
    plan: Arc<dyn ExecutionPlan>,
    published: Vec<(u64, u64)>,
}

async fn distributed(
    data: &std::path::Path,
    sql: &str,
    split: &str,
    filters: &str,
    partitioned: bool,
) -> Result<Run> {
    let shuffle = temp_dir();
    let ctx = session(data, Some(shuffle.path()), split, filters, partitioned).await?;
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let published = run_stages(&ctx, &plan).await?;
    let answer = sorted(&collect(Arc::clone(&plan), ctx.task_ctx()).await?);
    Ok(Run {
        answer,
        plan,
        published,
    })
}

fn text(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

const QUERIES: &[(&str, &str)] = &[
    ("inner", "SELECT b.w, p.v FROM b JOIN p ON b.k = p.k"),
    (
        "two-column key",
        "SELECT b.w, p.v FROM b JOIN p ON b.k = p.k AND b.s = p.s",
    ),
    ("left", "SELECT b.w, p.v FROM b LEFT JOIN p ON b.k = p.k"),
    (
        "right",
        "SELECT b.w, p.v FROM b RIGHT JOIN p ON b.k = p.k WHERE p.v < 1000",
    ),
    (
        "full",
        "SELECT b.w, p.v FROM b FULL JOIN p ON b.k = p.k WHERE p.v IS NULL OR p.v < 1000",
    ),
    ("semi", "SELECT p.v FROM p WHERE p.k IN (SELECT k FROM b)"),
    (
        "anti",
        "SELECT count(*), sum(p.v) FROM p WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = p.k)",
    ),
    (
        "null-aware anti",
        "SELECT count(*) FROM p WHERE p.k NOT IN (SELECT k FROM b)",
    ),
    (
        "mark",
        "SELECT count(*) FROM p WHERE p.v = 900 OR EXISTS (SELECT 1 FROM b WHERE b.k = p.k)",
    ),
    (
        "build side semi",
        "SELECT b.w FROM b WHERE EXISTS (SELECT 1 FROM p WHERE p.k = b.k)",
    ),
    (
        "empty build",
        "SELECT b.w, p.v FROM (SELECT * FROM b WHERE w > 1000) b JOIN p ON b.k = p.k",
    ),
    (
        "nulls equal",
        "SELECT b.w, p.v FROM b JOIN p ON b.k IS NOT DISTINCT FROM p.k",
    ),
];

#[tokio::test]
async fn every_join_type_answers_as_one_process_with_filters_on_auto_and_off() -> Result<()> {
    let data = temp_dir();
    tables(data.path());
    for (name, sql) in QUERIES {
        let expected = local(data.path(), sql).await?;
        for split in ["exchange", "aggregate"] {
            for filters in ["on", "auto", "off"] {
                for partitioned in [true, false] {
                    let run = distributed(data.path(), sql, split, filters, partitioned).await?;
                    assert_eq!(
                        run.answer,
                        expected,
                        "{name} ({split}, filters {filters}, partitioned {partitioned}):\n{}",
                        text(&run.plan)
                    );
                }
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_hand_worked_answers() -> Result<()> {
    let data = temp_dir();
    tables(data.path());
    let inner = local(data.path(), QUERIES[0].1).await?;
    assert_eq!(inner.len(), 4, "{inner:?}");
    let two = local(data.path(), QUERIES[1].1).await?;
    assert_eq!(two.len(), 2, "{two:?}");
    let empty = local(data.path(), QUERIES[10].1).await?;
    assert!(empty.is_empty(), "{empty:?}");
    Ok(())
}

/// The probe stage of a partitioned inner join depends on the build stage
/// and publishes only the rows whose key the build side holds (with `on`
/// and with `auto`: 20 007 probe rows against 3 build rows, the keys 1 and
/// 2 of `b.w < 35`, matched by three rows of `p`); with `off` it publishes
/// them all and the plan has no filter.
#[tokio::test]
async fn a_filtered_probe_stage_waits_for_the_build_and_publishes_only_matches() -> Result<()> {
    let data = temp_dir();
    tables(data.path());
    let sql = "SELECT b.w, p.v FROM b JOIN p ON b.k = p.k WHERE b.w < 35";
    assert_eq!(local(data.path(), sql).await?.len(), 3);
    for filters in ["on", "auto", "off"] {
        let run = distributed(data.path(), sql, "exchange", filters, true).await?;
        let plan = text(&run.plan);
        let found = stages(&run.plan);
        let writers: Vec<&ShuffleWriterExec> = found
            .iter()
            .map(|w| w.downcast_ref::<ShuffleWriterExec>().unwrap())
            .collect();
        // The probe stage scans `p` alone, the build stage `b` alone.
        let probe = writers
            .iter()
            .find(|w| text(w.input()).contains("/p/") && !text(w.input()).contains("/b/"))
            .expect("a stage scanning p");
        let build = writers
            .iter()
            .find(|w| text(w.input()).contains("/b/") && !text(w.input()).contains("/p/"))
            .expect("a stage scanning b");
        let probe_rows = run
            .published
            .iter()
            .find(|(id, _)| *id == probe.stage_id())
            .unwrap()
            .1;
        if filters == "off" {
            assert!(!plan.contains("JoinFilterExec"), "{plan}");
            assert!(!probe.deps().contains(&build.stage_id()), "{plan}");
            assert_eq!(probe_rows, 20_007, "{plan}");
        } else {
            assert!(plan.contains("JoinFilterExec"), "{plan}");
            assert!(plan.contains("KeySummaryExec"), "{plan}");
            assert!(probe.deps().contains(&build.stage_id()), "{plan}");
            // The three matching rows; a hash collision could keep a few
            // more, never fewer.
            assert!((3..20).contains(&probe_rows), "{probe_rows} rows\n{plan}");
        }
    }
    Ok(())
}

/// Under `auto`, a build side reading a whole table filters nothing: its
/// keys are every key of its table. Forced `on`, it does.
#[tokio::test]
async fn a_whole_table_build_side_is_not_a_filter_under_auto() -> Result<()> {
    let data = temp_dir();
    tables(data.path());
    let sql = QUERIES[0].1;
    let auto = distributed(data.path(), sql, "exchange", "auto", true).await?;
    assert!(
        !text(&auto.plan).contains("JoinFilterExec"),
        "{}",
        text(&auto.plan)
    );
    let on = distributed(data.path(), sql, "exchange", "on", true).await?;
    assert!(
        text(&on.plan).contains("JoinFilterExec"),
        "{}",
        text(&on.plan)
    );
    assert_eq!(auto.answer, on.answer);
    Ok(())
}

/// Tables whose keys refer to each other, under `dir`: `customers(c)`
/// holds 0..100; `orders(o_k, o_c)` holds 1,000 orders, order `k` of
/// customer `k % 50` (customers 50..100 have none); `items(i_o)` 20,000
/// items, item `i` of order `i % 1000`; `payments(p_c)` 20,000 payments,
/// payment `i` of customer `i % 100`.
fn referring_tables(dir: &std::path::Path) {
    let column = |name: &str, values: Vec<i64>| {
        let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).unwrap()
    };
    write(dir, "customers", &[column("c", (0..100).collect())]);
    let orders = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("o_k", DataType::Int64, false),
            Field::new("o_c", DataType::Int64, false),
        ])),
        vec![
            Arc::new(Int64Array::from((0..1000).collect::<Vec<i64>>())),
            Arc::new(Int64Array::from(
                (0..1000).map(|k| k % 50).collect::<Vec<i64>>(),
            )),
        ],
    )
    .unwrap();
    write(dir, "orders", &[orders]);
    write(
        dir,
        "items",
        &[column("i_o", (0..20_000).map(|i| i % 1000).collect())],
    );
    write(
        dir,
        "payments",
        &[column("p_c", (0..20_000).map(|i| i % 100).collect())],
    );
}

/// Under `auto`, a build side joining whole tables filters nothing when its
/// keys come from the table that refers to the other (every order has its
/// customer, so every order key is there), and does filter when they come
/// from the table referred to (half the customers have no order).
#[tokio::test]
async fn a_build_side_joining_whole_tables_filters_by_the_keys_of_the_referred_table_only()
-> Result<()> {
    let data = temp_dir();
    // The module's own tables too: every session here registers them.
    tables(data.path());
    referring_tables(data.path());
    let every_order = "SELECT count(*) AS n FROM items \
        JOIN (SELECT o_k FROM orders JOIN customers ON o_c = c) oc ON i_o = oc.o_k";
    let customers_with_orders = "SELECT count(*) AS n FROM payments \
        WHERE p_c IN (SELECT c FROM orders JOIN customers ON o_c = c)";
    let cases = [
        (every_order, false, "20000"),
        (customers_with_orders, true, "10000"),
    ];
    for (sql, filtered, answer) in cases {
        let shuffle = temp_dir();
        let ctx = session(data.path(), Some(shuffle.path()), "exchange", "auto", true).await?;
        for name in ["customers", "orders", "items", "payments"] {
            ctx.register_parquet(
                name,
                &data.path().join(name).to_string_lossy(),
                ParquetReadOptions::default(),
            )
            .await?;
        }
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        assert_eq!(
            text(&plan).contains("JoinFilterExec"),
            filtered,
            "{sql}:\n{}",
            text(&plan)
        );
        run_stages(&ctx, &plan).await?;
        let rows = sorted(&collect(Arc::clone(&plan), ctx.task_ctx()).await?);
        assert_eq!(rows, vec![format!("| {answer} |")], "{sql}");
    }
    Ok(())
}

/// A worker's checks accept a stage holding a join filter that reads the
/// spec's shuffle location, and refuse it, naming the filter, when it reads
/// another.
#[tokio::test]
async fn a_worker_vets_the_location_a_join_filter_reads() -> Result<()> {
    use dfx_plugin::vet::{Allowed, vet_encoded_stage};
    let data = temp_dir();
    tables(data.path());
    let shuffle = temp_dir();
    let ctx = session(data.path(), Some(shuffle.path()), "exchange", "on", true).await?;
    let plan = ctx.sql(QUERIES[0].1).await?.create_physical_plan().await?;
    let probe = stages(&plan)
        .into_iter()
        .find(|w| text(w).contains("JoinFilterExec") && !text(w).contains("HashJoinExec"))
        .expect("the filtered probe stage");
    let bytes = datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(
        probe,
        &codec_chain(),
    )?;
    let allowed = |shuffle_dir: &str| Allowed {
        tables: vec![data.path().join("b"), data.path().join("p")],
        shuffle_dir: shuffle_dir.to_string(),
        map: None,
    };
    let here = shuffle.path().to_string_lossy();
    vet_encoded_stage(&bytes, &allowed(&here)).unwrap();
    let err = vet_encoded_stage(&bytes, &allowed("/elsewhere")).unwrap_err();
    assert!(
        err.contains("a join filter") && err.contains(&*here),
        "{err}"
    );
    Ok(())
}

/// A filter that finds a build map's file missing fails its task as lost
/// output of that map, as a reader does, so the host runs the map again
/// before the probe task.
#[tokio::test]
async fn a_missing_build_map_is_lost_output_of_that_map() -> Result<()> {
    use datafusion::physical_plan::ExecutionPlanProperties;
    use dfx_abi::FailureClass::Lost;
    use futures::StreamExt;
    let data = temp_dir();
    tables(data.path());
    let shuffle = temp_dir();
    let ctx = session(data.path(), Some(shuffle.path()), "exchange", "on", true).await?;
    let plan = ctx.sql(QUERIES[0].1).await?.create_physical_plan().await?;
    let found = stages(&plan);
    let writer = |w: &Arc<dyn ExecutionPlan>| -> (u64, Vec<u64>) {
        let w = w.downcast_ref::<ShuffleWriterExec>().unwrap();
        (w.stage_id(), w.deps().to_vec())
    };
    let probe = found
        .iter()
        .find(|w| text(w).contains("JoinFilterExec") && !text(w).contains("HashJoinExec"))
        .expect("the filtered probe stage");
    let build = found
        .iter()
        .find(|w| text(w).contains("KeySummaryExec") && !text(w).contains("HashJoinExec"))
        .expect("the build stage");
    let (build_id, _) = writer(build);
    assert_eq!(writer(probe).1, vec![build_id]);
    for map in 0..build.output_partitioning().partition_count() {
        let mut stream = build.execute(map, ctx.task_ctx())?;
        while let Some(batch) = stream.next().await {
            batch?;
        }
    }
    std::fs::remove_file(
        shuffle
            .path()
            .join(format!("stage-{build_id}"))
            .join("1-map-1.arrow"),
    )
    .unwrap();
    let location = shuffle.path().to_string_lossy().into_owned();
    dfx_plugin::error::take(&location);
    let mut stream = probe.execute(0, ctx.task_ctx())?;
    let mut failed = None;
    while let Some(batch) = stream.next().await {
        if let Err(e) = batch {
            failed = Some(e.to_string());
            break;
        }
    }
    let failed = failed.expect("the probe task fails");
    assert!(failed.contains("lost output"), "{failed}");
    assert_eq!(
        dfx_plugin::error::take(&location),
        vec![Lost([build_id, 1])]
    );
    Ok(())
}

/// Handed the build maps' layouts, a probe task reads each key summary
/// where its layout says, never the marker: with every build marker
/// damaged (its bytes blanked, the file's size kept) the probe still
/// filters; handed nothing, it must read the markers and fails.
#[tokio::test]
async fn a_probe_handed_the_build_layouts_reads_each_summary_without_its_marker() -> Result<()> {
    use datafusion::physical_plan::ExecutionPlanProperties;
    use dfx_abi::{MapLayout, SHUFFLE_RANGES, StageLayouts};
    use dfx_plugin::config::CONFIG_PREFIX;
    let data = temp_dir();
    tables(data.path());
    let shuffle = temp_dir();
    let ctx = session(data.path(), Some(shuffle.path()), "exchange", "on", true).await?;
    let plan = ctx.sql(QUERIES[0].1).await?.create_physical_plan().await?;
    let found = stages(&plan);
    let probe = found
        .iter()
        .find(|w| text(w).contains("JoinFilterExec") && !text(w).contains("HashJoinExec"))
        .expect("the filtered probe stage");
    let build = found
        .iter()
        .find(|w| text(w).contains("KeySummaryExec") && !text(w).contains("HashJoinExec"))
        .expect("the build stage");
    let build_id = build
        .downcast_ref::<ShuffleWriterExec>()
        .unwrap()
        .stage_id();
    let mut layouts = Vec::new();
    for map in 0..build.output_partitioning().partition_count() {
        let summary =
            datafusion::physical_plan::common::collect(build.execute(map, ctx.task_ctx())?).await?;
        let layout = MapLayout::from_summary(&summary).expect("a laid-out summary");
        let (offset, bytes) = layout.keys.expect("a build map says where its keys lie");
        // Blank the marker between the key summary and the footer.
        let path = dfx_plugin::paths::map_path(shuffle.path(), build_id, map);
        let mut file = std::fs::read(&path)?;
        let marker = (offset + bytes) as usize..file.len() - 16;
        assert!(!marker.is_empty());
        file[marker].fill(b' ');
        std::fs::write(&path, &file)?;
        layouts.push(layout);
    }
    let probe_rows = |ctx: SessionContext| {
        let probe = Arc::clone(probe);
        async move {
            let mut rows = 0;
            for map in 0..probe.output_partitioning().partition_count() {
                let stream = probe.execute(map, ctx.task_ctx())?;
                for batch in datafusion::physical_plan::common::collect(stream).await? {
                    let column = batch.column_by_name("rows").unwrap();
                    let column = column
                        .as_any()
                        .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                        .unwrap();
                    rows += column.iter().flatten().sum::<u64>();
                }
            }
            Ok::<u64, datafusion::common::DataFusionError>(rows)
        }
    };
    let blind = probe_rows(ctx.clone()).await;
    let err = blind.expect_err("the damaged markers are read without layouts");
    assert!(
        err.to_string().contains(&format!("stage {build_id}")),
        "{err}"
    );
    let handed = StageLayouts {
        stages: std::collections::BTreeMap::from([(build_id, layouts)]),
    };
    ctx.sql(&format!(
        "SET {CONFIG_PREFIX}.{SHUFFLE_RANGES} = '{}'",
        handed.format()
    ))
    .await?;
    let rows = probe_rows(ctx).await?;
    // The four matching rows of the module doc; a hash collision could
    // keep a few more, never fewer.
    assert!((4..20).contains(&rows), "{rows} rows");
    Ok(())
}
