//! The cut and its reassembly, end to end on encoded plans.

use datafusion_proto::protobuf::{ParquetScanExecNode, PartitionedFile, UnionExecNode};

use datafusion_proto::protobuf;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{
    FileGroup, FileScanExecConf, PhysicalExtensionNode, PhysicalPlanNode,
};
use prost::Message;

use super::map_files::{Slot, map_files, read_map_files};
use super::walk::scan_conf;
use super::*;
use crate::wire::{NO_PARTITION, Payload, UNCUT_MAP, WriterPayload};

fn scan(files: &[&str]) -> PhysicalPlanNode {
    let file_groups = files
        .iter()
        .map(|path| FileGroup {
            files: vec![PartitionedFile {
                path: path.to_string(),
                ..Default::default()
            }],
        })
        .collect();
    PhysicalPlanNode {
        physical_plan_type: Some(PhysicalPlanType::ParquetScan(ParquetScanExecNode {
            base_conf: Some(FileScanExecConf {
                file_groups,
                ..Default::default()
            }),
            ..Default::default()
        })),
    }
}

/// A stage of `maps` maps over `input`, its writer framed as a host's
/// chain frames it.
fn stage(maps: u64, input: PhysicalPlanNode) -> Vec<u8> {
    let mut node = b"frame:".to_vec();
    Payload::Writer(WriterPayload {
        stage_id: 1,
        maps,
        buckets: 1,
        partitions_per_map: 1,
        deps: Vec::new(),
        aligned_deps: Vec::new(),
        shuffle_dir: "/s".into(),
        partitioning_display: "single".into(),
        partitioning: Vec::new(),
    })
    .encode(&mut node)
    .unwrap();
    PhysicalPlanNode {
        physical_plan_type: Some(PhysicalPlanType::Extension(PhysicalExtensionNode {
            node,
            inputs: vec![input],
        })),
    }
    .encode_to_vec()
}

/// Every map scan of `bytes`: (map, partition, the files it holds).
fn map_scans(bytes: &[u8]) -> Vec<(u64, u64, Vec<String>)> {
    fn walk(node: &mut PhysicalPlanNode, out: &mut Vec<(u64, u64, Vec<String>)>) {
        let Some(kind) = node.physical_plan_type.as_mut() else {
            return;
        };
        if let PhysicalPlanType::Extension(extension) = kind
            && let Some((start, Payload::MapScan(payload))) = find_payload(&extension.node)
        {
            assert!(
                extension.node.starts_with(b"frame:"),
                "framed as the writer"
            );
            assert_eq!(start, 6);
            let conf = extension.inputs[0]
                .physical_plan_type
                .as_mut()
                .and_then(scan_conf)
                .unwrap();
            let files = conf
                .file_groups
                .iter()
                .flat_map(|g| g.files.iter().map(|f| f.path.clone()))
                .collect();
            out.push((payload.map, payload.partition, files));
            return;
        }
        for child in children_mut(kind) {
            walk(child, out);
        }
    }
    let mut root = PhysicalPlanNode::decode(bytes).unwrap();
    let mut out = Vec::new();
    walk(&mut root, &mut out);
    out
}

/// `count` file names `<table>/<n>`.
fn names(table: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{table}/{n}")).collect()
}

fn refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

#[test]
fn a_union_gives_each_map_the_group_of_the_input_holding_its_partition() {
    let t = names("t", MIN_GROUPS_TO_CUT);
    let union = PhysicalPlanNode {
        physical_plan_type: Some(PhysicalPlanType::Union(UnionExecNode {
            inputs: vec![scan(&refs(&t)), scan(&["u/0"])],
        })),
    };
    let maps = MIN_GROUPS_TO_CUT as u64 + 1;
    let cut = cut_stage(&stage(maps, union)).unwrap();
    assert_eq!(cut.maps.len() as u64, maps);
    assert!(
        map_scans(&cut.shared)
            .iter()
            .all(|(map, _, files)| *map == UNCUT_MAP && files.is_empty())
    );
    let last = maps - 1;
    let expected = [
        (
            0,
            [(0, 0, vec!["t/0".to_string()]), (0, NO_PARTITION, vec![])],
        ),
        (
            last - 1,
            [
                (last - 1, last - 1, vec![format!("t/{}", last - 1)]),
                (last - 1, NO_PARTITION, vec![]),
            ],
        ),
        (
            last,
            [
                (last, NO_PARTITION, vec![]),
                (last, 0, vec!["u/0".to_string()]),
            ],
        ),
    ];
    for (map, expected) in expected {
        let plan = stage_for_map(&cut.shared, &cut.maps[map as usize], map).unwrap();
        assert_eq!(map_scans(&plan), expected.to_vec(), "map {map}");
    }
    // Files of one map are refused for another.
    let err = stage_for_map(&cut.shared, &cut.maps[1], 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("the files are map 1's, not map 2's"), "{err}");
}

#[test]
fn a_scan_below_a_collected_build_side_stays_whole() {
    let t = names("t", MIN_GROUPS_TO_CUT);
    let join = PhysicalPlanNode {
        physical_plan_type: Some(PhysicalPlanType::CrossJoin(Box::new(
            protobuf::CrossJoinExecNode {
                left: Some(Box::new(scan(&["d/0", "d/1"]))),
                right: Some(Box::new(scan(&refs(&t)))),
            },
        ))),
    };
    let cut = cut_stage(&stage(t.len() as u64, join)).unwrap();
    let plan = stage_for_map(&cut.shared, &cut.maps[1], 1).unwrap();
    // The left, built whole by every map, keeps both files; the right
    // is map 1's file only.
    assert_eq!(map_scans(&plan), vec![(1, 1, vec!["t/1".to_string()])]);
    let text = String::from_utf8_lossy(&plan);
    assert!(text.contains("d/0") && text.contains("d/1"), "{text}");
    assert!(!text.contains("t/0"), "{text}");
}

#[test]
fn a_stage_of_few_files_is_shipped_whole() {
    let t = names("t", MIN_GROUPS_TO_CUT - 1);
    let bytes = stage(t.len() as u64, scan(&refs(&t)));
    let cut = cut_stage(&bytes).unwrap();
    assert!(cut.maps.is_empty());
    assert_eq!(cut.shared, bytes);
}

#[test]
fn map_files_that_are_truncated_are_refused() {
    let slots = [Slot {
        offset: 0,
        groups: vec![FileGroup::default(); 2],
    }];
    let files = map_files(1, &slots).unwrap();
    assert_eq!(read_map_files(&files, 1).unwrap()[0].partition, 1);
    for len in 0..files.len() {
        assert!(read_map_files(&files[..len], 1).is_err(), "{len} bytes");
    }
}

#[test]
fn a_sealed_stage_keeps_its_writer_over_one_node_holding_the_input_unframed() {
    // The input: a framed join filter over a scan, as a host's chain
    // encodes it.
    let mut reader = b"frame:".to_vec();
    Payload::JoinFilter {
        node: b"{}".to_vec(),
    }
    .encode(&mut reader)
    .unwrap();
    let input = PhysicalPlanNode {
        physical_plan_type: Some(PhysicalPlanType::Extension(PhysicalExtensionNode {
            node: reader,
            inputs: vec![scan(&["a.parquet"])],
        })),
    };
    let sealed = seal_stage_input(&stage(1, input.clone())).unwrap();
    let root = PhysicalPlanNode::decode(sealed.as_slice()).unwrap();
    let Some(PhysicalPlanType::Extension(writer)) = root.physical_plan_type else {
        panic!("the root is no longer an extension");
    };
    assert!(matches!(
        find_payload(&writer.node),
        Some((6, Payload::Writer(_)))
    ));
    let [node] = writer.inputs.as_slice() else {
        panic!("the writer has {} inputs", writer.inputs.len());
    };
    let Some(PhysicalPlanType::Extension(node)) = &node.physical_plan_type else {
        panic!("the writer's input is not an extension");
    };
    assert!(node.inputs.is_empty(), "a sealed input is a leaf");
    assert!(node.node.starts_with(b"frame:"), "framed as the writer");
    let Some((6, Payload::SealedInput { plan })) = find_payload(&node.node) else {
        panic!("the writer's input is not a sealed input");
    };
    // The input whole, its filter's payload unframed for the plugin alone.
    let mut unframed = input;
    if let Some(PhysicalPlanType::Extension(reader)) = unframed.physical_plan_type.as_mut() {
        reader.node.drain(..6);
    }
    assert_eq!(PhysicalPlanNode::decode(plan.as_slice()).unwrap(), unframed);

    let err = seal_stage_input(&scan(&["a.parquet"]).encode_to_vec()).unwrap_err();
    assert!(err.to_string().contains("not a writer"), "{err}");
}
