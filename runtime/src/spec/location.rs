//! The shuffle location as the driver sees it: a local directory (a path or
//! `file://`) or an `s3://bucket/prefix` URL.
//!
//! Parsed and compared by [`dfx_abi::location`], the rule the plugin reads
//! and writes stage output by; this module only makes its refusals the
//! runtime's [`RuntimeError::Invalid`]. The plugin also checks a location up
//! front for the driver (its `probe_location` export: no `stage-*` entry,
//! an S3 endpoint that answers, a bucket that exists, credentials it
//! accepts). The driver only needs to know where envelopes go and whether
//! two spellings name one location.

use crate::error::RuntimeError;

pub use dfx_abi::location::{
    FILE_SCHEME, LocationError, S3_ALLOW_HTTP, S3_ENDPOINT, S3_REGION, S3_SCHEME, S3Location,
    ShuffleLocation, canonical_location, same_location,
};

impl From<LocationError> for RuntimeError {
    /// A refused location is refused before any work: its message names it.
    fn from(err: LocationError) -> Self {
        RuntimeError::Invalid(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_refused_location_is_invalid_with_the_shared_message() {
        for text in ["gs://b/p", "s3://"] {
            let shared = ShuffleLocation::parse(Path::new(text)).unwrap_err();
            let err = RuntimeError::from(shared.clone());
            assert!(matches!(&err, RuntimeError::Invalid(m) if *m == shared.to_string()));
        }
    }
}
