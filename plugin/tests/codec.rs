//! The codec on real plans: a plan encoded through a chain of the default
//! codec plus dfx's carries each stage inside the reader of it, cuts into
//! its stages, and decodes one stage at a time back into the same tree;
//! nothing but dfx's nodes is claimed.

mod common;

use std::sync::Arc;

use common::*;
use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlanProperties;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{
    ComposedPhysicalExtensionCodec, DefaultPhysicalExtensionCodec, PhysicalExtensionCodec,
};
use dfx_abi::stages::attach_stages;
use dfx_plugin::encoded::split_plan;
use dfx_plugin::wire::READER_NODE_NAME;
use dfx_plugin::{DfxPhysicalCodec, ShuffleReaderExec, ShuffleWriterExec};

fn chain() -> ComposedPhysicalExtensionCodec {
    ComposedPhysicalExtensionCodec::new(vec![
        Arc::new(DefaultPhysicalExtensionCodec {}) as Arc<dyn PhysicalExtensionCodec>,
        Arc::new(DfxPhysicalCodec::default()),
    ])
}

/// The lines of dfx's nodes in `plan`, in pre-order.
fn dfx_lines(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    displayable(plan.as_ref())
        .indent(true)
        .to_string()
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("Shuffle"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_plan_round_trips_through_the_chain_one_stage_at_a_time() -> Result<()> {
    let dir = temp_dir();
    let (ctx, plan) = planned(
        dir.path(),
        "SELECT g, sum(v) FROM t GROUP BY g UNION ALL SELECT g, count(*) FROM u GROUP BY g",
    )
    .await?;
    let planned_stages = stages(&plan);
    assert!(planned_stages.len() > 2, "{}", dfx_lines(&plan).join("\n"));
    let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), &chain())?;
    let head = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &chain())?;
    // Decoded, the readers hold no writers: each carries its stage as bytes.
    assert!(stages(&head).is_empty(), "{}", dfx_lines(&head).join("\n"));
    let cut = split_plan(&bytes)?;
    assert_eq!(cut.len(), planned_stages.len());
    let writers = cut
        .iter()
        .map(|stage| {
            physical_plan_from_bytes_with_extension_codec(stage, &ctx.task_ctx(), &chain())
        })
        .collect::<Result<Vec<_>>>()?;
    // Each stage cut out holds its own nodes only: the stages it reads came
    // out beside it, in pre-order, numbered as the planner numbered them.
    for (writer, original) in writers.iter().zip(&planned_stages) {
        assert_eq!(stages(writer).len(), 1);
        assert_eq!(
            stage_ids(writer),
            stage_ids(&Arc::clone(original))
                .into_iter()
                .take(1)
                .collect::<Vec<_>>()
        );
    }
    // A reader decoded without its writer promises what the planner's did.
    let promises = |plans: &[Arc<dyn ExecutionPlan>]| -> Vec<String> {
        fn walk(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<String>) {
            if let Some(reader) = plan.downcast_ref::<ShuffleReaderExec>() {
                out.push(format!(
                    "stage {}: {} / {}",
                    reader.stage_id(),
                    plan.output_partitioning(),
                    plan.equivalence_properties()
                ));
            }
            for child in plan.children() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for plan in plans {
            walk(plan, &mut out);
        }
        out.sort();
        out
    };
    let mut decoded = vec![Arc::clone(&head)];
    decoded.extend(writers.iter().cloned());
    assert_eq!(promises(&[Arc::clone(&plan)]), promises(&decoded));
    // Given back their writers, the readers make the planner's tree again
    // (the default codec may rewrite projections of its own around a union).
    let whole = attach_stages(&head, READER_NODE_NAME, &writers)?;
    assert_eq!(dfx_lines(&plan), dfx_lines(&whole));
    for (original, decoded) in planned_stages.iter().zip(stages(&whole)) {
        let node = decoded
            .downcast_ref::<ShuffleWriterExec>()
            .expect("a writer");
        let original = original.downcast_ref::<ShuffleWriterExec>().unwrap();
        assert_eq!(node.shuffle_dir(), dir.path());
        assert_eq!(node.deps(), original.deps());
        assert_eq!(node.partitioning_display(), original.partitioning_display());
    }
    Ok(())
}

#[tokio::test]
async fn without_dfx_in_the_chain_a_stage_cannot_be_encoded() -> Result<()> {
    let dir = temp_dir();
    let (_ctx, plan) = planned(dir.path(), "SELECT g, sum(v) FROM t GROUP BY g").await?;
    let stage: Arc<dyn ExecutionPlan> = Arc::clone(&stages(&plan)[0]);
    let err = physical_plan_to_bytes_with_extension_codec(stage, &DefaultPhysicalExtensionCodec {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ShuffleWriterExec") || err.contains("not provided"),
        "{err}"
    );
    Ok(())
}

#[test]
fn dfx_claims_nothing_but_its_nodes() {
    let ctx = datafusion::prelude::SessionContext::new();
    let plan: Arc<dyn ExecutionPlan> =
        Arc::new(datafusion::physical_plan::empty::EmptyExec::new(kv_schema()));
    let mut buf = Vec::new();
    let err = DfxPhysicalCodec::default()
        .try_encode(
            plan,
            &mut buf,
            &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {},
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "dfx codec encodes only ShuffleWriterExec, ShuffleReaderExec, \
             SealedRecursiveQueryExec, SealedInputExec, StoreScanExec, MapScanExec, \
             KeySummaryExec, JoinFilterExec, RecursiveQueryExec and WorkTableExec, not EmptyExec"
        ),
        "{err}"
    );
    assert!(buf.is_empty());
    let err = DfxPhysicalCodec::default()
        .try_decode(
            b"garbage!",
            &[],
            &ctx.task_ctx(),
            &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {},
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("dfx codec"), "{err}");
}

#[tokio::test]
async fn an_encoded_stage_tells_its_id_and_directory_without_decoding() -> Result<()> {
    let dir = temp_dir();
    let (_ctx, plan) = planned(
        dir.path(),
        "SELECT g, sum(v) FROM t GROUP BY g UNION ALL SELECT g, count(*) FROM u GROUP BY g",
    )
    .await?;
    for (index, stage) in stages(&plan).into_iter().enumerate() {
        let writer = stage.downcast_ref::<ShuffleWriterExec>().unwrap();
        let (maps, buckets, deps) = (writer.maps(), writer.buckets(), writer.deps().to_vec());
        let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&stage), &chain())?;
        let payload = dfx_plugin::wire::read_encoded_stage(&bytes)?;
        assert_eq!(payload.stage_id, index as u64 + 1);
        assert_eq!(payload.shuffle_dir, dir.path().to_string_lossy());
        assert_eq!(
            (payload.maps, payload.buckets),
            (maps as u64, buckets as u64)
        );
        assert_eq!(payload.deps, deps);
    }
    // A plan whose root is not a stage is refused, and so is garbage.
    let local = datafusion::prelude::SessionContext::new();
    let other = local.sql("SELECT 1").await?.create_physical_plan().await?;
    let bytes = physical_plan_to_bytes_with_extension_codec(other, &chain())?;
    let err = dfx_plugin::wire::read_encoded_stage(&bytes)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an extension node"), "{err}");
    let err = dfx_plugin::wire::read_encoded_stage(b"\xff\xff garbage")
        .unwrap_err()
        .to_string();
    assert!(err.contains("dfx codec"), "{err}");
    Ok(())
}
