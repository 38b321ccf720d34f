//! An `s3://` shuffle location, end to end through the `dfx` binary and its
//! local workers, against `moto_server` (moto's S3 over real HTTP) started
//! on 127.0.0.1 with a free port and stopped afterwards.
//!
//! moto comes from a venv these tests create once under Cargo's target
//! temp directory (`pip install 'moto[server]'`, needing python3.11 or
//! python3 and the package index) and reuse on later runs.

mod common;

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;

/// The bucket every test creates in its own server.
const BUCKET: &str = "dfx-shuffle";

/// Keys moto accepts when it checks none.
const ACCESS_KEY: &str = "test";

/// The venv holding moto, created on first use.
fn moto_venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moto-venv");
        let server = venv.join("bin/moto_server");
        if server.is_file() {
            return venv;
        }
        let python = ["python3.11", "python3"]
            .into_iter()
            .find(|p| Command::new(p).arg("--version").output().is_ok())
            .expect("python3.11 or python3 on PATH, to install moto");
        let status = Command::new(python)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python runs");
        assert!(
            status.success(),
            "cannot create a venv at {}",
            venv.display()
        );
        let output = Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "moto[server]"])
            .output()
            .expect("pip runs");
        assert!(
            output.status.success() && server.is_file(),
            "pip install 'moto[server]' failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        venv
    })
}

/// A port nothing listens on right now, never one handed out before in
/// this process: the tests run in parallel, and the kernel may give a port
/// just released by one test's probe to the next test's probe.
fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if HANDED_OUT.lock().expect("port set").insert(port) {
            return port;
        }
    }
}

/// A running `moto_server`, killed and reaped on drop; its request log
/// (one line per request, on its stderr) kept in a file.
struct Moto {
    child: Child,
    endpoint: String,
    log: tempfile::NamedTempFile,
}

impl Moto {
    /// Start a server; with `check_keys`, it refuses every request whose
    /// keys it does not know (all of them: it has no IAM users).
    fn start(check_keys: bool) -> Self {
        let venv = moto_venv();
        // A server that cannot bind its port exits; whatever else holds the
        // port would then answer in its place and vanish under the test.
        // So a listening port counts only while our own child still runs.
        for _ in 0..5 {
            let port = free_port();
            let log = tempfile::NamedTempFile::new().expect("a log file");
            let mut command = Command::new(venv.join("bin/moto_server"));
            command
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(log.reopen().expect("the log file"));
            if check_keys {
                command.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
            }
            let child = command.spawn().expect("moto_server starts");
            let mut moto = Self {
                child,
                endpoint: format!("http://127.0.0.1:{port}"),
                log,
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if moto.child.try_wait().expect("moto_server status").is_some() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    // Give a server that lost the port a moment to exit.
                    std::thread::sleep(Duration::from_millis(200));
                    if moto.child.try_wait().expect("moto_server status").is_none() {
                        return moto;
                    }
                    break;
                }
                assert!(Instant::now() < deadline, "moto_server did not listen");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("moto_server exited five times before listening: no port it could hold")
    }

    /// Run a boto3 snippet against this server; `s3` is its client, `args`
    /// are `sys.argv[1:]`. Returns stdout.
    fn boto3(&self, snippet: &str, args: &[&str]) -> String {
        let script = format!(
            "import sys, boto3\n\
             s3 = boto3.client('s3', endpoint_url={:?}, aws_access_key_id={ACCESS_KEY:?}, \
             aws_secret_access_key={ACCESS_KEY:?}, region_name='us-east-1')\n{snippet}",
            self.endpoint
        );
        let output = Command::new(moto_venv().join("bin/python"))
            .arg("-c")
            .arg(script)
            .args(args)
            .output()
            .expect("python runs");
        assert!(
            output.status.success(),
            "boto3: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The GETs of each stage's map objects under `prefix` (of [`BUCKET`])
    /// the server has logged so far, by stage.
    fn map_gets(&self, prefix: &str) -> std::collections::BTreeMap<u64, usize> {
        let log = std::fs::read_to_string(self.log.path()).expect("the request log");
        let start = format!("GET /{BUCKET}/{prefix}/stage-");
        let mut gets = std::collections::BTreeMap::new();
        for line in log.lines() {
            let Some((_, rest)) = line.split_once(&start) else {
                continue;
            };
            let Some((stage, _)) = rest.split_once('/') else {
                continue;
            };
            *gets.entry(stage.parse().expect("a stage id")).or_default() += 1;
        }
        gets
    }

    /// The commit marker (JSON) of object `key` of [`BUCKET`].
    fn marker(&self, key: &str) -> serde_json::Value {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("map.arrow");
        self.boto3(
            "s3.download_file(sys.argv[1], sys.argv[2], sys.argv[3])",
            &[BUCKET, key, file.to_str().unwrap()],
        );
        let bytes = std::fs::read(&file).unwrap();
        let range = dfx_abi::map_marker_range(&bytes).expect("a map file");
        serde_json::from_slice(&bytes[range]).unwrap()
    }

    fn create_bucket(&self, bucket: &str) {
        self.boto3("s3.create_bucket(Bucket=sys.argv[1])", &[bucket]);
    }

    /// Every key under `prefix`, sorted.
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let out = self.boto3(
            "for page in s3.get_paginator('list_objects_v2').paginate(Bucket=sys.argv[1], \
             Prefix=sys.argv[2]):\n    for o in page.get('Contents', []): print(o['Key'])",
            &[bucket, prefix],
        );
        let mut keys: Vec<String> = out.lines().map(str::to_string).collect();
        keys.sort();
        keys
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dfx args` reaching `endpoint` with the AWS variables a user would set.
fn dfx_s3(endpoint: &str, key: &str, args: &[&str]) -> Output {
    Command::new(dfx_bin())
        .args(args)
        .env("DFX_PLUGIN", plugin_path())
        .env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", key)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .output()
        .expect("dfx starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The keys under `prefix` of [`BUCKET`], having checked that each of the 4
/// maps of stages 1 and 2 has its object there.
fn every_map_object(moto: &Moto, prefix: &str) -> Vec<String> {
    let keys = moto.keys(BUCKET, &format!("{prefix}/"));
    for (stage, map) in [1, 2].into_iter().flat_map(|s| (0..4).map(move |m| (s, m))) {
        let object = map_file(Path::new(prefix), stage, map)
            .display()
            .to_string();
        assert!(keys.contains(&object), "{object} missing in {keys:#?}");
    }
    keys
}

#[test]
fn stage_files_and_markers_land_as_objects_and_the_answer_is_the_local_one() {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let url = format!("s3://{BUCKET}/queries/by-flag");
    let run = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &[
            "run",
            "--partitions-per-task",
            "1",
            "--table",
            &table,
            "--shuffle-dir",
            &url,
            BY_FLAG,
        ],
    );
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let local = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &["run", "--local", "--table", &table, BY_FLAG],
    );
    assert!(local.status.success(), "{}", text(&local.stderr));
    assert_eq!(text(&run.stdout), text(&local.stdout));
    assert!(stderr.contains(&url), "{stderr}");

    // Four files, so four maps in stage 2, the stage over the table, and
    // four in stage 1, which reads it: every map of both has its object
    // (a map of stage 1 with no flag to aggregate too: its marker alone).
    let keys = every_map_object(&moto, "queries/by-flag");
    // Envelopes and plans stay on this machine, where its workers run;
    // nothing half-written is left behind. Besides stage output there is
    // only the driver's lock object.
    assert!(
        keys.iter().all(|k| (k.starts_with("queries/by-flag/stage-")
            || k == "queries/by-flag/_dfx-driver.lock")
            && !k.contains(".tmp")),
        "{keys:#?}"
    );

    // The same location again is refused: it holds stage output.
    let again = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &["run", "--table", &table, "--shuffle-dir", &url, BY_FLAG],
    );
    let stderr = text(&again.stderr);
    assert!(!again.status.success());
    assert!(
        stderr.contains(&url) && stderr.contains("already holds stage output"),
        "{stderr}"
    );
}

#[test]
fn a_prefix_another_driver_holds_is_refused_before_any_task() {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    // Another driver started on this empty prefix first: its lock object is
    // there, and no stage output yet, so only the lock tells the two apart.
    moto.boto3(
        "s3.put_object(Bucket=sys.argv[1], Key=sys.argv[2], Body=b'{}')",
        &[BUCKET, "queries/held/_dfx-driver.lock"],
    );
    let url = format!("s3://{BUCKET}/queries/held");
    let run = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &["run", "--table", &table, "--shuffle-dir", &url, BY_FLAG],
    );
    let stderr = text(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains(&url) && stderr.contains("another driver holds this location"),
        "{stderr}"
    );
    assert_eq!(
        moto.keys(BUCKET, "queries/held/"),
        vec!["queries/held/_dfx-driver.lock"]
    );
}

#[test]
fn tpch_q1_q3_q9_q18_give_the_local_answer_through_s3() {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    let data = tempfile::Builder::new()
        .prefix("dfx-s3-tpch-")
        .tempdir()
        .unwrap();
    let json = data.path().join("report.json");
    let url = format!("s3://{BUCKET}/tpch");
    let out = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &[
            "tpch",
            "--scale",
            "0.01",
            "--partitions",
            "2",
            "--queries",
            "1,3,9,18",
            "--runs",
            "1",
            "--data-dir",
            data.path().join("data").to_str().unwrap(),
            "--shuffle-dir",
            &url,
            "--json",
            json.to_str().unwrap(),
            // Cut, so each exchange goes through the bucket; two partitions
            // in slices of this machine's cores would be kept whole.
            "--set",
            "collapse_stages=off",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let report = report.to_string();
    for q in [1, 3, 9, 18] {
        let keys = moto.keys(BUCKET, &format!("tpch/dfx-tpch-q{q}-"));
        assert!(
            keys.iter().any(|k| k.ends_with(".arrow")),
            "q{q}: no stage output in the bucket: {keys:#?}\n{report}"
        );
    }
}

/// TPC-H with its tables on S3: copied there by `dfx tpch --tables-on`,
/// then read from the bucket by stock DataFusion, by the dfx session in one
/// process and by the workers, with stage output on S3 and on a local
/// directory; every answer agrees with stock's.
#[test]
fn tpch_with_its_tables_on_s3_agrees_with_stock_reading_the_same_bucket() {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    moto.create_bucket("dfx-tables");
    let data = tempfile::Builder::new()
        .prefix("dfx-s3-tables-")
        .tempdir()
        .unwrap();
    let shuffle_on_s3 = format!("s3://{BUCKET}/tables-run");
    let local_shuffle = data.path().join("shuffle").display().to_string();
    for shuffle in [shuffle_on_s3.as_str(), local_shuffle.as_str()] {
        let json = data.path().join("report.json");
        let out = dfx_s3(
            &moto.endpoint,
            ACCESS_KEY,
            &[
                "tpch",
                "--scale",
                "0.01",
                "--partitions",
                "2",
                "--queries",
                "1,3,5,9,18",
                "--runs",
                "1",
                "--data-dir",
                data.path().join("data").to_str().unwrap(),
                "--tables-on",
                "s3://dfx-tables/tpch",
                "--shuffle-dir",
                shuffle,
                "--json",
                json.to_str().unwrap(),
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{shuffle}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("tables on s3://dfx-tables/tpch"),
            "{stdout}"
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert!(report.to_string().contains("agree"), "{report}");
    }
    // Every table's files are objects of the bucket.
    let keys = moto.keys("dfx-tables", "tpch/");
    for table in ["lineitem", "orders", "nation"] {
        assert!(
            keys.iter()
                .any(|k| k.contains(&format!("/{table}/")) && k.ends_with(".parquet")),
            "{table}: {keys:#?}"
        );
    }
}

/// A table on a bucket that does not exist: refused while the driver
/// registers it, naming the table, before any task.
#[test]
fn a_table_on_a_missing_bucket_is_refused_by_name() {
    let moto = Moto::start(false);
    let out = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &[
            "run",
            "--table",
            "t=s3://no-such-bucket/t/",
            "SELECT count(*) FROM t",
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("table t (s3://no-such-bucket/t/)"),
        "{stderr}"
    );
    assert!(!stderr.contains("map 0"), "{stderr}");
}

/// `dfx run` over `url` through `endpoint` with `key`, with workers that
/// would leave a trace if one ever started: it must fail before any task,
/// naming the URL and `reason`.
fn refused_before_any_task(endpoint: &str, key: &str, url: &str, reason: &str) {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let trace = fixture.root.path().join("a-worker-started");
    let started = Instant::now();
    let out = dfx_s3(
        endpoint,
        key,
        &[
            "run",
            "--table",
            &table,
            "--shuffle-dir",
            url,
            "--worker",
            "/bin/sh",
            "--worker-arg",
            "-c",
            "--worker-arg",
            r#"touch "$0"; exec tail -f /dev/null"#,
            "--worker-arg",
            trace.to_str().unwrap(),
            BY_FLAG,
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(url),
        "{reason}: the error names no URL: {stderr}"
    );
    assert!(stderr.contains(reason), "expected {reason:?}: {stderr}");
    // One error: not one per task.
    assert!(!stderr.contains("map 0"), "{stderr}");
    assert!(!trace.exists(), "a worker started: {stderr}");
    assert!(
        live_processes_mentioning(trace.to_str().unwrap()).is_empty(),
        "a worker is still running"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{reason}: took {:?}",
        started.elapsed()
    );
}

#[test]
fn an_unreachable_endpoint_fails_once_before_any_task() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    refused_before_any_task(
        &endpoint,
        ACCESS_KEY,
        "s3://nowhere/q",
        "cannot reach the S3 endpoint",
    );
}

#[test]
fn a_missing_bucket_fails_once_before_any_task() {
    let moto = Moto::start(false);
    refused_before_any_task(
        &moto.endpoint,
        ACCESS_KEY,
        "s3://no-such-bucket/q",
        "the bucket does not exist",
    );
}

#[test]
fn wrong_credentials_fail_once_before_any_task() {
    let moto = Moto::start(true);
    refused_before_any_task(
        &moto.endpoint,
        "not-a-key",
        &format!("s3://{BUCKET}/q"),
        "the S3 endpoint refused the credentials",
    );
}

/// A table `big` of `rows` distinct keys in one Parquet file, scrambled so
/// that LZ4 cannot shrink them.
fn big_table(dir: &Path, rows: u64) -> PathBuf {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::parquet::arrow::ArrowWriter;

    let table = dir.join("big");
    std::fs::create_dir_all(&table).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let file = std::fs::File::create(table.join("part-0.parquet")).unwrap();
    let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
    for chunk in (0..rows).collect::<Vec<_>>().chunks(1 << 16) {
        // An odd multiplier is a bijection on u64: keys stay distinct.
        let keys = chunk
            .iter()
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64);
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(keys))],
        )
        .unwrap();
        writer.write(&batch).unwrap();
    }
    writer.close().unwrap();
    table
}

#[test]
fn a_bucket_larger_than_a_part_is_uploaded_in_parts_and_reads_back_whole() {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    let dir = tempfile::Builder::new()
        .prefix("dfx-s3-big-")
        .tempdir()
        .unwrap();
    // 3 million distinct keys: each of the two hash buckets of the stage
    // over the table holds about 1.5 million rows of (key, count): 12 MB of
    // keys LZ4 cannot shrink (the counts, all 1, it can), two parts.
    let table = format!("big={}", big_table(dir.path(), 3_000_000).display());
    let sql = "SELECT count(*) AS n, sum(c) AS rows, min(k) AS lo, max(k) AS hi FROM \
               (SELECT k, count(*) AS c FROM big GROUP BY k)";
    let url = format!("s3://{BUCKET}/big");
    let run = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        // Cut at its exchange, which a plan no wider than a task is not.
        &[
            "run",
            "--table",
            &table,
            "--shuffle-dir",
            &url,
            "--set",
            "collapse_stages=off",
            sql,
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    let local = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &["run", "--local", "--table", &table, sql],
    );
    assert!(local.status.success(), "{}", text(&local.stderr));
    assert_eq!(text(&run.stdout), text(&local.stdout));
    assert!(
        text(&run.stdout).contains("3000000"),
        "{}",
        text(&run.stdout)
    );
    let sizes = moto.boto3(
        "for page in s3.get_paginator('list_objects_v2').paginate(Bucket=sys.argv[1], \
         Prefix=sys.argv[2]):\n    for o in page.get('Contents', []): print(o['Size'], o['Key'])",
        &[BUCKET, "big/"],
    );
    let largest = sizes
        .lines()
        .filter(|l| l.ends_with(".arrow"))
        .filter_map(|l| l.split_once(' ')?.0.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    // Past one part (8 MiB), so it went up as a multipart upload.
    assert!(largest > 8 * 1024 * 1024, "{sizes}");
}

/// One exchange's GETs of map objects, counted in moto's request log, with
/// each task running `per_task` of the 4 partitions: one ranged GET per
/// (reader task, upstream map) pair holding rows, its partitions sharing
/// it, no marker, and none by the driver, which hands every reader its
/// ranges. Returns the GETs and the upstream maps.
fn one_exchange_gets(per_task: usize) -> (usize, usize) {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let url = format!("s3://{BUCKET}/counted");
    // No coalescing: 4 partitions over the table's 4 files, a hash exchange
    // of 4 buckets, the final aggregate's 4 partitions.
    let sql = "SELECT l_returnflag, count(*) AS n FROM lineitem GROUP BY l_returnflag";
    let per_task_arg = per_task.to_string();
    let run = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &[
            "run",
            "--table",
            &table,
            "--partitions",
            "4",
            "--partitions-per-task",
            &per_task_arg,
            "--set",
            "coalesce=off",
            "--shuffle-dir",
            &url,
            sql,
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    let gets = moto.map_gets("counted");
    let maps = 4usize.div_ceil(per_task);
    // The (map, reader) pairs of `stage` holding rows, a reader being a
    // task of `per_reader` of the buckets: one ranged GET each, and
    // nothing else.
    let model = |stage: u64, buckets_per_map: usize, per_reader: usize| {
        let mut pairs = 0;
        for map in 0..maps {
            let marker = moto.marker(
                &map_file(Path::new("counted"), stage, map)
                    .display()
                    .to_string(),
            );
            let buckets = marker["buckets"].as_array().unwrap();
            assert_eq!(buckets.len(), buckets_per_map, "{marker}");
            let readers: std::collections::BTreeSet<usize> = buckets
                .iter()
                .enumerate()
                .filter(|(_, b)| b["rows"].as_u64() > Some(0))
                .map(|(bucket, _)| bucket / per_reader)
                .collect();
            pairs += readers.len();
        }
        pairs
    };
    // The stage over the table: the one read by another (the highest id).
    let (&stage, &count) = gets.iter().next_back().expect("GETs of map objects");
    let exchange = model(stage, 4, per_task);
    println!(
        "{per_task} partition(s) a task, stage {stage}: {count} GET(s) of its {maps} map \
         objects; the model's {exchange}; all {gets:?}"
    );
    assert!(exchange > 0);
    assert_eq!(count, exchange, "GETs by stage: {gets:?}");
    // At most one per (reader task, upstream map).
    assert!(count <= maps * maps);
    // The last stage, read by the driver's head, a partition at a time:
    // handed its layouts too, so no marker is read there either; a
    // pass-through map keeps each partition of its slice as a bucket.
    let (&last, &count) = gets.iter().next().expect("GETs of map objects");
    assert_ne!(last, stage, "two stages: {gets:?}");
    let head = model(last, per_task, 1);
    println!("stage {last} (read by the head): {count} GET(s); the model's {head}");
    assert!(head > 0);
    assert_eq!(count, head, "GETs by stage: {gets:?}");
    (exchange, maps)
}

#[test]
fn one_exchange_costs_one_get_per_reader_and_map_and_the_driver_none() {
    let (gets, maps) = one_exchange_gets(1);
    assert_eq!(maps, 4);
    // T tasks on each side: at most T² + T.
    assert!(gets <= maps * maps + maps);
}

#[test]
fn a_task_of_two_partitions_makes_one_get_of_each_upstream_map() {
    let (gets, maps) = one_exchange_gets(2);
    assert_eq!(maps, 2);
    // Two reader tasks of two partitions, each task one GET of each map.
    assert!(gets <= maps * maps, "{gets}");
}

/// Under `both` every map is also an object of the bucket, but no reader
/// reads one back: each streams another worker's maps from its map server
/// and reads its own from the copy it kept, and the driver streams the
/// last stage. The bucket's copies are there for a worker lost. With one
/// worker every map a reader reads is its own; with two, some are.
#[test]
fn under_both_readers_stream_or_read_their_copies_and_no_map_object_is_read() {
    let moto = Moto::start(false);
    moto.create_bucket(BUCKET);
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let local = dfx_s3(
        &moto.endpoint,
        ACCESS_KEY,
        &["run", "--local", "--table", &table, BY_FLAG],
    );
    assert!(local.status.success(), "{}", text(&local.stderr));
    for workers in ["1", "2"] {
        let prefix = format!("both-{workers}");
        let url = format!("s3://{BUCKET}/{prefix}");
        let run = dfx_s3(
            &moto.endpoint,
            ACCESS_KEY,
            &[
                "run",
                "--partitions",
                "4",
                "--partitions-per-task",
                "1",
                "--max-workers",
                workers,
                "--set",
                "coalesce=off",
                "--shuffle-durability",
                "both",
                "--table",
                &table,
                "--shuffle-dir",
                &url,
                BY_FLAG,
            ],
        );
        assert!(run.status.success(), "{}", text(&run.stderr));
        assert_eq!(text(&run.stdout), text(&local.stdout));
        // Every map of both stages was put in the bucket...
        every_map_object(&moto, &prefix);
        // ...and none was read from there.
        assert_eq!(
            moto.map_gets(&prefix),
            Default::default(),
            "{workers} worker(s)"
        );
    }
}
