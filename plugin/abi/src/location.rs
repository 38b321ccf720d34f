//! A shuffle location: where a query's stage output lives, parsed and
//! compared by one rule for the plugin (which reads and writes it) and every
//! host (which claims it, checks stages against it and takes its failures).
//!
//! A location is a local directory, spelled as a path or a `file://` URL, or
//! a prefix in an S3 bucket. Its one spelling ([`ShuffleLocation::canonical`])
//! decides whether two spellings name one location:
//!
//! | written                                              | parsed                                  | one spelling |
//! | ---------------------------------------------------- | --------------------------------------- | ------------ |
//! | `/x`, `/x/`, `/x/.`, `file:///x`, `file:///x/`       | `Local`, the path as written            | `/x`         |
//! | `x`, `./x`, `x/`, `file://x`                         | `Local`, the path as written            | `x` (never resolved on disk) |
//! | `s3://b/p`, `s3://b/p/`, `s3://b//p`                 | `S3`, bucket `b`, prefix `p`            | `s3://b/p`   |
//! | `s3://b`, `s3://b/`                                  | `S3`, bucket `b`, empty prefix          | `s3://b`     |
//! | `s3://`, `s3:///p`                                   | refused: [`LocationError::NoBucket`]    |              |
//! | `gs://b/p`, `http://h/p`                             | refused: [`LocationError::UnsupportedScheme`] |        |
//! | a URL whose bytes are not UTF-8                      | refused: [`LocationError::NotUtf8`]     |              |
//!
//! A path that is not UTF-8 and does not look like a URL is a local
//! directory like any other, compared by its bytes.
//!
//! ```
//! use std::path::Path;
//! use dfx_abi::location::{ShuffleLocation, same_location};
//!
//! assert!(same_location(Path::new("file:///tmp/q/"), Path::new("/tmp/q")));
//! let s3 = ShuffleLocation::parse(Path::new("s3://bucket/run/7/"))?;
//! assert_eq!(s3.canonical(), "s3://bucket/run/7");
//! # Ok::<(), dfx_abi::location::LocationError>(())
//! ```

use std::path::{Component, Path, PathBuf};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// Scheme of an S3 location.
pub const S3_SCHEME: &str = "s3://";

/// Scheme of a local location spelled as a URL.
pub const FILE_SCHEME: &str = "file://";

/// The spec's `store_options` key of the S3 endpoint, and the plugin's
/// `dfx_engine.s3_endpoint`.
pub const S3_ENDPOINT: &str = "s3_endpoint";

/// The spec's `store_options` key of the S3 region, and the plugin's
/// `dfx_engine.s3_region`.
pub const S3_REGION: &str = "s3_region";

/// The spec's `store_options` key allowing plain http (`"true"` or
/// `"false"`), and the plugin's `dfx_engine.s3_allow_http`.
pub const S3_ALLOW_HTTP: &str = "s3_allow_http";

/// `builder` with a session's S3 settings over the AWS environment's:
/// `endpoint` and `region` when given, plain http when `allow_http`, and a
/// region of `us-east-1` when neither gave one. The one rule for every S3
/// client dfx makes: the plugin's for shuffles and tables, each host's for
/// tables.
pub fn apply_s3_options(
    mut builder: AmazonS3Builder,
    endpoint: Option<&str>,
    region: Option<&str>,
    allow_http: bool,
) -> AmazonS3Builder {
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = region {
        builder = builder.with_region(region);
    }
    if allow_http {
        builder = builder.with_allow_http(true);
    }
    // An endpoint given without a region (a local server) needs one for
    // signing; S3's default is the one every compatible server accepts.
    if builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .is_none()
    {
        builder = builder.with_region("us-east-1");
    }
    builder
}

/// A parsed shuffle location. Its `==` compares the parsed parts; whether
/// two spellings name one location is [`same_location`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShuffleLocation {
    /// A local directory (given as a path or a `file://` URL), as written:
    /// compare two with [`ShuffleLocation::canonical_path`].
    Local(PathBuf),
    /// A prefix (possibly empty) in an S3 bucket.
    S3(S3Location),
}

/// `s3://bucket/prefix`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Location {
    /// The bucket.
    pub bucket: String,
    /// The key prefix, without leading or trailing `/` (empty: the bucket's
    /// root).
    pub prefix: String,
}

/// Why a shuffle location is refused; each message names the location as
/// written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    /// An `s3://` URL without a bucket (`s3://`, `s3:///p`).
    #[error("shuffle location {location}: no bucket after s3://")]
    NoBucket {
        /// The location as written.
        location: String,
    },
    /// A URL of a scheme the plugin cannot store into (`gs://`, `http://`).
    #[error(
        "shuffle location {location}: unsupported scheme {scheme}://; use a local path, file:// \
         or s3://bucket/prefix"
    )]
    UnsupportedScheme {
        /// The location as written.
        location: String,
        /// The scheme, without `://`.
        scheme: String,
    },
    /// A URL whose bytes are not UTF-8: no bucket or key can be made of it,
    /// and taken as a path it would be a relative directory named after the
    /// scheme.
    #[error(
        "shuffle location {location}: a {scheme}:// URL that is not UTF-8; spell the location \
         in UTF-8"
    )]
    NotUtf8 {
        /// The location as written, its invalid bytes replaced by U+FFFD.
        location: String,
        /// The scheme, without `://`.
        scheme: String,
    },
}

impl ShuffleLocation {
    /// Parse a spec's `shuffle_dir`, or the one a writer or reader carries.
    ///
    /// # Errors
    ///
    /// An `s3://` URL without a bucket, a URL of another scheme, or a URL
    /// that is not UTF-8 ([`LocationError`]).
    pub fn parse(dir: &Path) -> Result<Self, LocationError> {
        let Some(text) = dir.to_str() else {
            let lossy = dir.to_string_lossy();
            return match scheme(&lossy) {
                Some(scheme) => Err(LocationError::NotUtf8 {
                    scheme: scheme.to_string(),
                    location: lossy.into_owned(),
                }),
                None => Ok(Self::Local(dir.to_path_buf())),
            };
        };
        match scheme(text) {
            None => Ok(Self::Local(dir.to_path_buf())),
            Some("file") => Ok(Self::Local(PathBuf::from(&text[FILE_SCHEME.len()..]))),
            Some("s3") => {
                let rest = text[S3_SCHEME.len()..].trim_end_matches('/');
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(LocationError::NoBucket {
                        location: text.to_string(),
                    });
                }
                Ok(Self::S3(S3Location {
                    bucket: bucket.to_string(),
                    // `s3://b//p` stores under the keys of `s3://b/p`.
                    prefix: prefix.trim_matches('/').to_string(),
                }))
            }
            Some(other) => Err(LocationError::UnsupportedScheme {
                location: text.to_string(),
                scheme: other.to_string(),
            }),
        }
    }

    /// Whether `dir` names a location by URL (`s3://`, `file://`, or a
    /// scheme [`ShuffleLocation::parse`] refuses) rather than by a path: a
    /// URL is taken as written, never made absolute.
    pub fn is_url(dir: &Path) -> bool {
        scheme(&dir.to_string_lossy()).is_some()
    }

    /// The one spelling of this location, as a path: the local directory
    /// without trailing `/` or `.` components (a leading `./` included,
    /// unless nothing else is left), or `s3://bucket/prefix` without a
    /// trailing `/`. Nothing is resolved on disk: a relative path stays
    /// relative, `..` and symbolic links stay as they are. Two locations are
    /// one when these are equal; a local path that is not UTF-8 keeps its
    /// bytes.
    pub fn canonical_path(&self) -> PathBuf {
        match self {
            Self::Local(dir) => {
                let mut parts = dir.components().peekable();
                // `components` keeps a leading `.` (and only that one); `./x`
                // is the directory `x` is, from any working directory.
                if parts.peek() == Some(&Component::CurDir) {
                    parts.next();
                    if parts.peek().is_none() {
                        return PathBuf::from(".");
                    }
                }
                parts.collect()
            }
            Self::S3(s3) => PathBuf::from(s3.url()),
        }
    }

    /// [`ShuffleLocation::canonical_path`] as text, for a host to pass on
    /// and for the plugin's ledger of failures; a local path that is not
    /// UTF-8 has its invalid bytes replaced by U+FFFD, so compare such
    /// locations with [`same_location`].
    pub fn canonical(&self) -> String {
        self.canonical_path().to_string_lossy().into_owned()
    }
}

impl S3Location {
    /// `s3://bucket/prefix` (no trailing `/`), or `s3://bucket` for the
    /// bucket's root.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("{S3_SCHEME}{}", self.bucket)
        } else {
            format!("{S3_SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }
}

/// Whether `a` and `b` name the same location: their
/// [`ShuffleLocation::canonical_path`]s are equal, byte for byte. A spelling that does not
/// parse is the same only as the identical spelling: it names nothing the
/// plugin can store into, so no rule says what else it might equal.
pub fn same_location(a: &Path, b: &Path) -> bool {
    match (ShuffleLocation::parse(a), ShuffleLocation::parse(b)) {
        // Bytes, not `Path`'s `==`: that compares components, for which
        // `s3://b/p//q` is `s3://b/p/q`, two prefixes holding other objects.
        (Ok(a), Ok(b)) => a.canonical_path().as_os_str() == b.canonical_path().as_os_str(),
        _ => a.as_os_str() == b.as_os_str(),
    }
}

/// The one spelling of `location` ([`ShuffleLocation::canonical`]), or
/// `location` as written when it does not parse: the key two spellings of
/// one location share, such as the plugin's ledger of failures.
pub fn canonical_location(location: &str) -> String {
    match ShuffleLocation::parse(Path::new(location)) {
        Ok(parsed) => parsed.canonical(),
        Err(_) => location.to_string(),
    }
}

/// The scheme of `text` spelled as a URL (`s3`, `file`, `gs`): one or more
/// ASCII letters, digits or `+` before the first `://`. `rel/a://b` has
/// none: it is a relative path.
fn scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let is_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '+');
    is_scheme.then_some(scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ShuffleLocation, LocationError> {
        ShuffleLocation::parse(Path::new(text))
    }

    fn same(a: &str, b: &str) -> bool {
        same_location(Path::new(a), Path::new(b))
    }

    fn s3(bucket: &str, prefix: &str) -> ShuffleLocation {
        ShuffleLocation::S3(S3Location {
            bucket: bucket.into(),
            prefix: prefix.into(),
        })
    }

    #[test]
    fn every_spelling_parses_to_its_location() {
        let local = |dir: &str| ShuffleLocation::Local(dir.into());
        let cases = [
            ("/x", local("/x")),
            ("/x/", local("/x/")),
            ("file:///x", local("/x")),
            ("file:///x/", local("/x/")),
            ("x", local("x")),
            ("./x", local("./x")),
            ("file://x", local("x")),
            ("rel/a://b", local("rel/a://b")),
            ("file://s3://b/p", local("s3://b/p")),
            ("s3://b/p", s3("b", "p")),
            ("s3://b/p/", s3("b", "p")),
            ("s3://b//p//", s3("b", "p")),
            ("s3://b/p/q", s3("b", "p/q")),
            ("s3://b", s3("b", "")),
            ("s3://b/", s3("b", "")),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn an_s3_url_without_a_bucket_is_refused_naming_it() {
        for text in ["s3://", "s3:///p", "s3:////"] {
            let err = parse(text).unwrap_err();
            assert_eq!(
                err,
                LocationError::NoBucket {
                    location: text.into()
                }
            );
            assert_eq!(
                err.to_string(),
                format!("shuffle location {text}: no bucket after s3://")
            );
        }
    }

    #[test]
    fn another_scheme_is_refused_naming_the_scheme() {
        for (text, scheme) in [("gs://b/p", "gs"), ("http://h/p", "http"), ("S3://b", "S3")] {
            let err = parse(text).unwrap_err();
            assert_eq!(
                err,
                LocationError::UnsupportedScheme {
                    location: text.into(),
                    scheme: scheme.into()
                }
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "shuffle location {text}: unsupported scheme {scheme}://; use a local path, \
                     file:// or s3://bucket/prefix"
                )
            );
        }
    }

    #[test]
    fn spellings_of_one_location_share_its_one_spelling() {
        let one = [
            &[
                "/x",
                "/x/",
                "/x/.",
                "/./x",
                "//x",
                "file:///x",
                "file:///x/",
            ][..],
            &["x", "x/", "./x", "./x/", "x/.", "file://x", "file://./x"],
            &[".", "./", "file://."],
            &["s3://b/p", "s3://b/p/", "s3://b//p", "s3://b/p//"],
            &["s3://b", "s3://b/", "s3://b//"],
        ];
        let canonical = ["/x", "x", ".", "s3://b/p", "s3://b"];
        for (spellings, canonical) in one.iter().zip(canonical) {
            for text in *spellings {
                assert_eq!(parse(text).unwrap().canonical(), canonical, "{text}");
                assert_eq!(canonical_location(text), canonical, "{text}");
                for other in *spellings {
                    assert!(same(text, other), "{text} {other}");
                }
            }
        }
        // The one spelling parses back to itself: a host passes it on, and
        // the plugin keys its ledger by it.
        for text in canonical {
            assert_eq!(canonical_location(text), text);
        }
    }

    #[test]
    fn different_locations_stay_different() {
        for (a, b) in [
            ("/x", "/y"),
            ("/x", "x"),
            ("x", "../x"),
            ("/x", "/x/.."),
            ("s3://b/p", "s3://b/q"),
            ("s3://b/p", "s3://c/p"),
            ("s3://b/p", "s3://b"),
            ("s3://b/p/q", "s3://b/p//q"),
            ("s3://b/p", "/b/p"),
            // A path, not the URL it contains.
            ("s3://b/p", "s3:/b/p"),
            ("s3://b/p", "file://s3://b/p"),
        ] {
            assert!(!same(a, b), "{a} {b}");
            assert_ne!(canonical_location(a), canonical_location(b), "{a} {b}");
        }
    }

    #[test]
    fn a_location_that_does_not_parse_is_only_itself() {
        assert!(same("gs://b/p", "gs://b/p"));
        for (a, b) in [
            ("gs://b/p", "gs://b/p/"),
            ("gs://b/p", "gs:/b/p"),
            ("s3://", "s3:"),
        ] {
            assert!(!same(a, b), "{a} {b}");
            assert_ne!(canonical_location(a), canonical_location(b), "{a} {b}");
        }
        assert_eq!(canonical_location("gs://b/p/"), "gs://b/p/");
    }

    #[test]
    fn urls_are_told_from_paths_by_the_rule_that_parses_them() {
        for url in ["s3://b", "file:///x", "gs://b/p", "s3://"] {
            assert!(ShuffleLocation::is_url(Path::new(url)), "{url}");
        }
        for path in ["rel/dir", "/abs/dir", "rel/a://b", "://x", "s3:/b"] {
            assert!(!ShuffleLocation::is_url(Path::new(path)), "{path}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_path_that_is_not_utf8_is_compared_by_its_bytes() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let path = |bytes: &[u8]| Path::new(OsStr::from_bytes(bytes)).to_path_buf();
        let ff = path(b"/tmp/\xff");
        assert_eq!(
            ShuffleLocation::parse(&ff),
            Ok(ShuffleLocation::Local(ff.clone()))
        );
        assert!(same_location(&ff, &path(b"/tmp/./\xff/")));
        // Both read `/tmp/\u{fffd}` as text; they are two directories.
        assert!(!same_location(&ff, &path(b"/tmp/\xfe")));
        assert_eq!(ShuffleLocation::parse(&ff).unwrap().canonical_path(), ff);
    }

    #[cfg(unix)]
    #[test]
    fn a_url_that_is_not_utf8_is_refused_naming_the_scheme() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        for (bytes, scheme) in [
            (&b"s3://b/\xff"[..], "s3"),
            (b"file:///tmp/\xff", "file"),
            (b"gs://\xff", "gs"),
        ] {
            let dir = Path::new(OsStr::from_bytes(bytes));
            assert!(ShuffleLocation::is_url(dir));
            let err = ShuffleLocation::parse(dir).unwrap_err();
            assert_eq!(
                err,
                LocationError::NotUtf8 {
                    location: dir.to_string_lossy().into_owned(),
                    scheme: scheme.into()
                }
            );
            assert!(err.to_string().contains("not UTF-8"), "{err}");
        }
    }
}
