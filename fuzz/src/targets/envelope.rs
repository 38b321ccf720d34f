//! The driver/worker contract: the task envelope and the worker's
//! report line. Both are read from files and pipes another process wrote.

use dfx_host::{Envelope, WorkerReport};

use super::json_dictionary;
use crate::{Outcome, Target};

/// `Envelope` as the worker reads it (serde JSON).
#[derive(Debug, Default)]
pub struct EnvelopeTarget;

impl Target for EnvelopeTarget {
    fn name(&self) -> &'static str {
        "envelope"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        [
            r#"{"spec":{"tables":{"lineitem":"/data/lineitem","orders":"/data/orders"},"shuffle_dir":"/tmp/q1","target_partitions":4,"codec_ids":["dfx_engine.physical.v2"],"split":"exchange"},"plan":"/tmp/q1/tasks/stage-2.plan","stage_id":2,"partition":3}"#,
            r#"{"spec":"{\"tables\":{\"t\":\"/d/t\"},\"shuffle_dir\":\"/s\",\"split\":\"aggregate\"}","plan":"/s/tasks/stage-1.plan","stage_id":1,"partition":0}"#,
            r#"{"spec":{"shuffle_dir":""},"plan":"p","stage_id":18446744073709551615,"partition":0}"#,
            r#"{"spec":{"tables":{}},"plan":"/x","stage_id":1,"partition":1,"extra":[1,{"a":null}]}"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        let mut tokens = json_dictionary();
        for key in [
            "\"spec\"",
            "\"plan\"",
            "\"stage_id\"",
            "\"partition\"",
            "\"tables\"",
            "\"shuffle_dir\"",
            "\"target_partitions\"",
            "\"codec_ids\"",
            "\"split\"",
            "\"exchange\"",
            "\"aggregate\"",
        ] {
            tokens.push(key.as_bytes().to_vec());
        }
        tokens
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let Ok(envelope) = serde_json::from_slice::<Envelope>(input) else {
            return Ok(Outcome::Refused);
        };
        // What a driver writes, a worker reads back the same.
        let text = serde_json::to_string(&envelope)
            .map_err(|e| format!("an accepted envelope does not serialize: {e}"))?;
        let again: Envelope = serde_json::from_str(&text)
            .map_err(|e| format!("the envelope written as {text} does not read back: {e}"))?;
        if again != envelope {
            return Err(format!(
                "the envelope changed through write and read: {envelope:?} became {again:?}"
            ));
        }
        Ok(Outcome::Accepted)
    }
}

/// `WorkerReport::parse` over a worker's whole stdout.
#[derive(Debug, Default)]
pub struct WorkerReportTarget;

impl Target for WorkerReportTarget {
    fn name(&self) -> &'static str {
        "worker-report"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        [
            "{\"stage_id\":2,\"partition\":1,\"rows\":42}\n",
            "a library printed this\n\n{\"stage_id\":1,\"partition\":0,\"rows\":0,\"bytes\":1234,\"elapsed_ms\":12.5}\n  \n",
            "{\"stage_id\":3,\"partition\":7,\"rows\":18446744073709551615,\"bytes\":0}",
            "{\"stage_id\":1,\"partition\":0,\"rows\":5,\"elapsed_ms\":null}\r\n",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        let mut tokens = json_dictionary();
        for key in [
            "\"stage_id\"",
            "\"partition\"",
            "\"rows\"",
            "\"bytes\"",
            "\"elapsed_ms\"",
            "\r\n",
        ] {
            tokens.push(key.as_bytes().to_vec());
        }
        tokens
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let stdout = String::from_utf8_lossy(input);
        let Ok(report) = WorkerReport::parse(&stdout) else {
            return Ok(Outcome::Refused);
        };
        let line = report.to_line();
        let again = WorkerReport::parse(&line)
            .map_err(|e| format!("the report written as {line:?} does not read back: {e}"))?;
        // Integers must come back exactly; the float (`elapsed_ms`, when the
        // report has it) may lose its last bit or, non-finite, become null,
        // which no reader relies on.
        let integers = |r: &WorkerReport| {
            let mut value = serde_json::to_value(r).unwrap_or_default();
            if let Some(fields) = value.as_object_mut() {
                fields.remove("elapsed_ms");
            }
            value
        };
        if integers(&again) != integers(&report) {
            return Err(format!(
                "the report changed through to_line and parse: {report:?} became {again:?}"
            ));
        }
        Ok(Outcome::Accepted)
    }
}
