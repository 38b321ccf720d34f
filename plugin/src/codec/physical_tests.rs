//! The physical codec's tests.

use crate::wire::{
    MapScanPayload, PAYLOAD_MAGIC, PAYLOAD_VERSION, Payload, ReadMode, ReaderPayload, WriterPayload,
};

fn sample() -> Vec<u8> {
    let mut buf = Vec::new();
    Payload::Writer(WriterPayload {
        stage_id: 7,
        maps: 4,
        buckets: 3,
        partitions_per_map: 2,
        deps: vec![8, 9],
        aligned_deps: vec![9],
        shuffle_dir: "/tmp/shuffle-ä".into(),
        partitioning_display: "hash([k@0], 3)".into(),
        partitioning: vec![1, 2, 3],
    })
    .encode(&mut buf)
    .unwrap();
    buf
}

#[test]
fn the_recursive_query_and_map_scan_kinds_round_trip_and_refuse_truncation() {
    let payloads = [
        Payload::Recursive {
            name: "r".into(),
            distinct: true,
            schema: vec![1, 2, 3],
        },
        Payload::WorkTable {
            name: "r".into(),
            schema: vec![4, 5],
        },
        Payload::Sealed { plan: vec![9; 7] },
        Payload::MapScan(MapScanPayload {
            map: 3,
            partitions: 10,
            partition: 3,
            slot: 1,
        }),
    ];
    for payload in payloads {
        let mut buf = Vec::new();
        payload.encode(&mut buf).unwrap();
        assert_eq!(Payload::decode(&buf).unwrap(), payload);
        for len in 0..buf.len() {
            let err = Payload::decode(&buf[..len]).unwrap_err().to_string();
            assert!(err.contains("truncated payload"), "{len}: {err}");
        }
    }
    // Only 0 and 1 say whether a recursive query is distinct.
    let mut buf = Vec::new();
    Payload::Recursive {
        name: "r".into(),
        distinct: false,
        schema: Vec::new(),
    }
    .encode(&mut buf)
    .unwrap();
    buf[7] = 2;
    let err = Payload::decode(&buf).unwrap_err().to_string();
    assert!(err.contains("distinct is 2"), "{err}");
}

#[test]
fn round_trip() {
    let Payload::Writer(payload) = Payload::decode(&sample()).unwrap() else {
        panic!("a writer");
    };
    assert_eq!(payload.stage_id, 7);
    assert_eq!((payload.maps, payload.buckets), (4, 3));
    assert_eq!(payload.deps, vec![8, 9]);
    assert_eq!(payload.shuffle_dir, "/tmp/shuffle-ä");
    let reader = Payload::Reader(ReaderPayload {
        mode: ReadMode::Broadcast,
        stage_id: 3,
        maps: 2,
        buckets: 1,
        shuffle_dir: "/tmp/s".into(),
        properties: b"{}".to_vec(),
        stage: vec![7; 5],
    });
    let mut buf = Vec::new();
    reader.encode(&mut buf).unwrap();
    assert_eq!(Payload::decode(&buf).unwrap(), reader);
    for len in 0..buf.len() {
        let err = Payload::decode(&buf[..len]).unwrap_err().to_string();
        assert!(err.contains("truncated payload"), "{len}: {err}");
    }
}

#[test]
fn every_truncation_is_an_error_naming_dfx() {
    let buf = sample();
    for len in 0..buf.len() {
        let err = Payload::decode(&buf[..len]).unwrap_err().to_string();
        assert!(err.contains("dfx codec"), "len {len}: {err}");
        assert!(err.contains("truncated"), "len {len}: {err}");
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    let mut buf = sample();
    buf.push(0);
    let err = Payload::decode(&buf).unwrap_err().to_string();
    assert!(err.contains("trailing bytes"), "{err}");
}

#[test]
fn unknown_version_is_named() {
    let mut buf = sample();
    buf[4..6].copy_from_slice(&2u16.to_le_bytes());
    let err = Payload::decode(&buf).unwrap_err().to_string();
    assert!(err.contains("version 2 is not supported"), "{err}");
    assert!(err.contains("carries it as a blob"), "{err}");
    assert!(err.contains("dfx codec"), "{err}");
}

#[test]
fn random_bytes_never_panic() {
    // A small deterministic generator: the property is "no panic, an
    // error naming dfx", whatever the bytes (with and without the magic).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for round in 0..4000 {
        let len = round % 96;
        let mut bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        if round % 2 == 0 && bytes.len() >= 7 {
            bytes[..4].copy_from_slice(&PAYLOAD_MAGIC);
            bytes[4..6].copy_from_slice(&PAYLOAD_VERSION.to_le_bytes());
            bytes[6] = 1 + (round % 3) as u8;
        }
        if let Err(err) = Payload::decode(&bytes) {
            assert!(err.to_string().contains("dfx codec"), "{err}");
        }
    }
}

#[test]
fn foreign_magic_is_not_ours() {
    let err = Payload::decode(b"PAR1 and then some more bytes")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a dfx payload"), "{err}");
}
