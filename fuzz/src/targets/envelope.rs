//! The driver/worker contract: the task envelope and the worker's
//! response line. Both are read from files and pipes another process wrote.

use dfx_runtime::{Envelope, Response};

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
            r#"{"spec":{"tables":{"lineitem":"/data/lineitem","orders":"/data/orders"},"shuffle_dir":"/tmp/q1","target_partitions":4,"codec_ids":["dfx_engine.physical.v5"],"split":"exchange"},"plan":"/tmp/q1/tasks/stage-2.plan","stage_id":2,"partition":3}"#,
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

/// `Response::parse_last` over a worker's whole stdout: its report, or its
/// error with the failure class the driver retries by.
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
            "{\"stage_id\":2,\"partition\":1,\"error\":\"stage 2 map 1: I/O failure: No space left on device\",\"retry\":\"io\"}\n",
            "{\"stage_id\":3,\"partition\":0,\"error\":\"stage 3 map 0: stage-2/5-map-5.arrow is missing\",\"retry\":{\"lost\":[2,5]}}",
            "{\"stage_id\":null,\"partition\":null,\"error\":\"cannot read envelope /t.json\",\"retry\":\"final\"}\n",
            "{\"stage_id\":1,\"partition\":0,\"error\":\"a worker that names no class\"}",
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
            "\"error\"",
            "\"retry\"",
            "\"final\"",
            "\"io\"",
            "\"lost\"",
            "\r\n",
        ] {
            tokens.push(key.as_bytes().to_vec());
        }
        tokens
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let stdout = String::from_utf8_lossy(input);
        let Ok(response) = Response::parse_last(&stdout) else {
            return Ok(Outcome::Refused);
        };
        let line = response.to_line();
        let again = Response::parse_last(&line)
            .map_err(|e| format!("the response written as {line:?} does not read back: {e}"))?;
        if again.is_error() != response.is_error() {
            return Err(format!(
                "the response changed kind through to_line and parse_last: {response:?} \
                 became {again:?}"
            ));
        }
        // Everything but the float must come back exactly (the integers, an
        // error's message and its class); the float (`elapsed_ms`, when the
        // report has it) may lose its last bit or, non-finite, become null,
        // which no reader relies on.
        let exact = |r: &Response| {
            let mut value: serde_json::Value =
                serde_json::from_str(&r.to_line()).unwrap_or_default();
            if let Some(fields) = value.as_object_mut() {
                fields.remove("elapsed_ms");
            }
            value
        };
        if exact(&again) != exact(&response) {
            return Err(format!(
                "the response changed through to_line and parse_last: {response:?} became \
                 {again:?}"
            ));
        }
        Ok(Outcome::Accepted)
    }
}
