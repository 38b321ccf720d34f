//! Map files kept on worker disks and served over Arrow Flight
//! (`shuffle_durability: local`): the map server's answers and refusals,
//! queries whose readers stream their inputs from the workers that wrote
//! them, and a worker lost mid-query, whose maps, and only those, run
//! again. Real pool workers, the real plugin file, a real gRPC client.

mod common;

use std::collections::BTreeSet;

use arrow_flight::Ticket;
use arrow_flight::flight_service_client::FlightServiceClient;
use common::*;
use dfx_abi::{MapTicket, MapTicketAnswer};
use dfx_host::{Host, SessionSpec, WorkerCommand, WorkerMode};
use dfx_runtime::ShuffleDurability;
use dfx_runtime::flight::MapServer;
use futures::TryStreamExt;

/// `spec` with its map files on the disks of the workers that wrote them.
fn served(mut spec: SessionSpec) -> SessionSpec {
    spec.shuffle_durability = ShuffleDurability::Local;
    spec
}

async fn ask(
    client: &mut FlightServiceClient<tonic::transport::Channel>,
    ticket: Vec<u8>,
) -> Result<(u64, Vec<u8>), tonic::Status> {
    let answer = client
        .do_get(Ticket {
            ticket: ticket.into(),
        })
        .await?;
    let mut stream = answer.into_inner();
    let first = stream
        .try_next()
        .await?
        .ok_or_else(|| tonic::Status::data_loss("the answer ended before its first message"))?;
    let answer = MapTicketAnswer::decode(&first.app_metadata).map_err(tonic::Status::data_loss)?;
    let mut bytes = Vec::new();
    while let Some(data) = stream.try_next().await? {
        bytes.extend_from_slice(&data.data_body);
    }
    Ok((answer.size, bytes))
}

#[tokio::test]
async fn a_map_server_streams_a_tickets_ranges_and_refuses_what_it_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let served_dir = dir.path().join("q1");
    let other_dir = dir.path().join("q2");
    // Past two of the server's messages, so an answer spans several.
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    for location in [&served_dir, &other_dir] {
        std::fs::create_dir_all(location.join("stage-2")).unwrap();
        std::fs::write(location.join("stage-2/1-map-1.arrow"), &bytes).unwrap();
    }
    std::os::unix::fs::symlink("/etc/hostname", served_dir.join("stage-2/3-map-3.arrow")).unwrap();
    let server = MapServer::start(plugin(), "127.0.0.1:0").unwrap();
    server.serve(&served_dir).unwrap();
    let channel = tonic::transport::Endpoint::from_shared(server.address().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FlightServiceClient::new(channel);
    let ticket = |location: &std::path::Path, map: u64, ranges: Vec<(u64, u64)>| MapTicket {
        location: location.display().to_string(),
        stage: 2,
        map,
        ranges,
    };

    // Two ranges, in the order asked, and the file's size.
    let good = ticket(&served_dir, 1, vec![(2_000_000, 1_000_000), (10, 100)]);
    let (size, got) = ask(&mut client, good.encode()).await.unwrap();
    assert_eq!(size, bytes.len() as u64);
    let expected: Vec<u8> = [&bytes[2_000_000..3_000_000], &bytes[10..110]].concat();
    assert!(got == expected, "{} byte(s) back", got.len());

    // Another query's location, though its file is there.
    let err = ask(&mut client, ticket(&other_dir, 1, vec![(0, 10)]).encode())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(
        err.message().contains(&other_dir.display().to_string())
            && err.message().contains("no task of this worker wrote"),
        "{err}"
    );
    // Not a ticket at all, and one with a field a ticket does not have.
    let err = ask(&mut client, b"stage-2/1-map-1.arrow".to_vec())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.message().contains("malformed map ticket"), "{err}");
    let with_path = format!(
        r#"{{"location":"{}","stage":2,"map":1,"ranges":[[0,1]],"path":"/etc/hostname"}}"#,
        served_dir.display()
    );
    let err = ask(&mut client, with_path.into_bytes()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    // Past the file's end.
    let past = ticket(&served_dir, 1, vec![(bytes.len() as u64 - 5, 10)]);
    let err = ask(&mut client, past.encode()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    assert!(err.message().contains("holds 3000000 byte(s)"), "{err}");
    // A map this worker does not hold.
    let err = ask(&mut client, ticket(&served_dir, 7, vec![(0, 1)]).encode())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    assert!(err.message().contains("stage 2 map 7"), "{err}");
    // A link out of the served directory is never followed.
    let err = ask(&mut client, ticket(&served_dir, 3, vec![(0, 1)]).encode())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{err}");
    assert!(err.message().contains("stage 2 map 3"), "{err}");

    let counts = server.counts();
    assert_eq!((counts.streams, counts.refused), (1, 6), "{counts:?}");
    assert_eq!(counts.bytes, 1_000_100);

    // An address other nodes cannot reach is refused before binding.
    let err = MapServer::start(plugin(), "0.0.0.0:0").err().unwrap();
    assert!(err.contains("unspecified"), "{err}");
}

#[tokio::test]
async fn queries_answer_with_their_maps_served_by_the_workers_that_wrote_them() {
    for durability in [ShuffleDurability::Local, ShuffleDurability::Both] {
        answers_with_maps_served(durability).await;
    }
}

async fn answers_with_maps_served(durability: ShuffleDurability) {
    let fixture = Fixture::new();
    let host = host();
    for (sql, expected) in [
        (BY_FLAG, by_flag_expected()),
        (FUNCTIONS, functions_expected()),
        (UNION, union_expected()),
    ] {
        let spec = served(one_task_per_partition(
            fixture.distributed_spec(&format!("served-{}", sql.len())),
        ));
        let result = host.run_distributed(sql, &spec).await.unwrap();
        assert_eq!(rows(&result.batches), expected, "{durability}: {sql}");
        // Every map that published a layout names the server holding it.
        let owners: BTreeSet<&str> = result
            .task_reports
            .values()
            .filter_map(|report| report.layout.as_ref())
            .map(|layout| {
                layout
                    .owner
                    .as_deref()
                    .unwrap_or_else(|| panic!("{sql}: a layout without its owner: {layout:?}"))
            })
            .collect();
        assert!(!owners.is_empty(), "{sql}");
        assert!(
            owners.iter().all(|o| o.starts_with("http://127.0.0.1:")),
            "{owners:?}"
        );
    }
    host.shutdown().await;
}

#[tokio::test]
async fn maps_kept_on_worker_disks_need_pool_workers_and_a_directory() {
    let fixture = Fixture::new();
    let spec = served(fixture.distributed_spec("process"));
    let host = host().worker_mode(WorkerMode::Process);
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("the process executor's workers do not outlive their tasks"),
        "{err}"
    );

    let mut on_s3 = served(fixture.spec().with_shuffle_dir("s3://bucket/q"));
    let err = on_s3.validate().unwrap_err().to_string();
    assert!(err.contains("not a local directory"), "{err}");
    on_s3.shuffle_durability = ShuffleDurability::ObjectStore;
    on_s3.validate().unwrap();
}

/// Two pool workers run the table's four maps under `durability`. The
/// first worker that ran some of them and is then handed a task of the
/// stage reading them dies (SIGKILL, its map server with it), first writing
/// down the maps it ran. The answer is right; returned: the maps it ran,
/// and the maps of that stage that ran again.
async fn lose_a_worker(durability: ShuffleDurability) -> (BTreeSet<usize>, BTreeSet<usize>) {
    let fixture = Fixture::new();
    let mut spec = one_task_per_partition(fixture.distributed_spec("lost"));
    spec.shuffle_durability = durability;
    let (u, r) = leaf_and_reader(&spec).await;
    let died = fixture.root.path().join("died");
    // Requests go through a FIFO to the real worker, so the wrapper sees
    // each task before the worker does.
    let script = format!(
        r#"fifo=$(mktemp -u); mkfifo "$fifo"
"$DFX" worker --serve < "$fifo" & child=$!
exec 3> "$fifo"; rm -f "$fifo"
ran=""
while IFS= read -r line; do
  case "$line" in
    *'"stage_id":{u},'*)
      ran="$ran $(printf '%s' "$line" | sed -n 's/.*"partition":\([0-9]*\).*/\1/p')" ;;
    *'"stage_id":{r},'*)
      if [ -n "$ran" ] && mkdir {died} 2>/dev/null; then
        printf '%s\n' $ran > {died}/maps; kill -KILL $child; kill -KILL $$
      fi ;;
  esac
  printf '%s\n' "$line" >&3
done
exec 3>&-; wait $child"#,
        died = died.display()
    );
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .env("DFX", dfx_bin());
    let host = Host::with_worker(plugin(), command)
        .max_workers(Some(2))
        .max_attempts(5);
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    host.shutdown().await;
    assert_eq!(rows(&result.batches), by_flag_expected());
    let lost: BTreeSet<usize> = std::fs::read_to_string(died.join("maps"))
        .expect("a worker died holding maps")
        .split_whitespace()
        .map(|m| m.parse().unwrap())
        .collect();
    assert!(!lost.is_empty());
    let rerun: BTreeSet<usize> = result
        .attempts
        .iter()
        .filter(|((stage, _), made)| *stage == u && **made > 1)
        .map(|((_, map), _)| *map)
        .collect();
    let retries = result.retries.join("\n");
    for map in &rerun {
        assert!(
            retries.contains(&format!(
                "stage {u} map {map} attempt 1: run again, its output was lost"
            )),
            "{retries}"
        );
    }
    (lost, rerun)
}

/// Under `local`, a dead worker's files are still on this machine's disk,
/// but readers ask its server: its maps, and only those, run again.
#[tokio::test]
async fn a_lost_worker_has_its_maps_and_only_those_run_again() {
    let (lost, rerun) = lose_a_worker(ShuffleDurability::Local).await;
    assert_eq!(rerun, lost);
}

/// Under `both`, readers fall back to the location's files: nothing runs
/// again.
#[tokio::test]
async fn a_lost_worker_costs_no_rerun_when_its_maps_are_also_in_the_location() {
    let (_, rerun) = lose_a_worker(ShuffleDurability::Both).await;
    assert_eq!(rerun, BTreeSet::new());
}
