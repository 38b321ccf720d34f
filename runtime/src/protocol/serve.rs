//! A request of the serve protocol: one task, named by its envelope file or
//! carried whole.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::protocol::Envelope;

/// One request to a serving worker (`--serve`).
///
/// The Rust scheduler's pool sends the envelope itself, so a query's tasks
/// need no file each (creating one is a few hundred microseconds of the
/// driver's CPU); process mode gives a worker a file. A worker of either
/// host takes both forms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Request {
    /// `{"envelope": "<path>"}`: the task's envelope file.
    File {
        /// The envelope file of the task.
        envelope: PathBuf,
    },
    /// `{"task": {<envelope>}}`: the envelope itself.
    Inline {
        /// The task's envelope, as its file would hold it.
        task: Box<Envelope>,
    },
}

impl Request {
    /// Read one request line.
    ///
    /// # Errors
    ///
    /// A line that is neither form, quoted (cut to 200 characters) with the
    /// forms expected.
    pub fn parse(line: &str) -> std::result::Result<Self, String> {
        serde_json::from_str(line.trim()).map_err(|err| {
            format!(
                "cannot read the request {:.200?}: {err}; expected {{\"envelope\": \"<path>\"}} \
                 or {{\"task\": {{<envelope>}}}}",
                line.trim()
            )
        })
    }

    /// The request as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        // Cannot fail: a path or an envelope, whose every field serializes.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    /// The envelope the request names or carries.
    ///
    /// # Errors
    ///
    /// An envelope file that cannot be read or does not parse.
    pub fn envelope(self) -> Result<Envelope> {
        match self {
            Self::File { envelope } => Envelope::read(&envelope),
            Self::Inline { task } => Ok(*task),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SessionSpec;

    #[test]
    fn an_inline_request_carries_the_envelope_its_file_would_hold() {
        let envelope = Envelope {
            spec: SessionSpec::default(),
            plan: "/s/tasks/stage-2.plan".into(),
            stage_id: 2,
            partition: 5,
            attempt: 1,
        };
        let request = Request::Inline {
            task: Box::new(envelope.clone()),
        };
        let line = request.to_line();
        assert!(line.starts_with("{\"task\":{"), "{line}");
        assert_eq!(Request::parse(&line).unwrap().envelope().unwrap(), envelope);
        let file = Request::parse("{\"envelope\": \"/s/t.json\"}").unwrap();
        assert_eq!(
            file,
            Request::File {
                envelope: "/s/t.json".into()
            }
        );
        assert_eq!(
            file.to_line(),
            "{\"envelope\":\"/s/t.json\"}\n",
            "the file form is written as it is read"
        );
        let err = Request::parse("{\"task\": 3}").unwrap_err();
        assert!(err.contains("expected"), "{err}");
    }
}
