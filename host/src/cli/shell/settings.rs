//! `SET key = value` and `SHOW key` / `SHOW ALL` in the shell.
//!
//! A setting changes the shell's session spec, not one session: every
//! query after it is planned by a driver session built from that spec and
//! run by workers given the same spec, so `datafusion.*` keys (the spec's
//! `datafusion_options`) and `dfx_engine.*` keys (its fields, or
//! `engine_options`) reach every process of the query alike.

use clap::ValueEnum as _;
use dfx_host::SessionSpec;
use dfx_host::session::{ShuffleCompression, Split};
use dfx_runtime::spec::STORE_OPTION_KEYS;

/// The prefix of DataFusion's own keys.
const DATAFUSION: &str = "datafusion.";
/// The prefix of the plugin's keys.
const ENGINE: &str = "dfx_engine.";
/// The DataFusion key the spec holds as a field of its own.
const TARGET_PARTITIONS: &str = "datafusion.execution.target_partitions";

/// A `SET` or `SHOW` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `SET key = value` (or `TO`).
    Set {
        /// The key as typed, trimmed.
        key: String,
        /// The value, its quotes removed.
        value: String,
    },
    /// `SHOW key`, or `SHOW ALL` (`None`).
    Show(Option<String>),
}

/// The setting `sql` states, if it starts with `SET` or `SHOW`.
///
/// # Errors
///
/// A `SET` without `=` or `TO`, or without a key or value; a `SHOW` of
/// something other than one key or `ALL`.
pub fn parse(sql: &str) -> Option<Result<Setting, String>> {
    let sql = sql.trim().trim_end_matches(';').trim();
    let (verb, rest) = sql.split_once(char::is_whitespace).unwrap_or((sql, ""));
    let rest = rest.trim();
    if verb.eq_ignore_ascii_case("set") {
        return Some(parse_set(rest));
    }
    if verb.eq_ignore_ascii_case("show") {
        return Some(match rest {
            "" => Err("SHOW needs a key, or ALL".to_string()),
            all if all.eq_ignore_ascii_case("all") => Ok(Setting::Show(None)),
            tables if tables.eq_ignore_ascii_case("tables") => {
                Err("SHOW TABLES is \\d in dfx shell".to_string())
            }
            key if !key.contains(char::is_whitespace) => Ok(Setting::Show(Some(key.to_string()))),
            other => Err(format!("SHOW takes one key or ALL, got {other:?}")),
        });
    }
    None
}

/// `key = value` or `key TO value`.
fn parse_set(rest: &str) -> Result<Setting, String> {
    let usage = || format!("expected SET key = value, got SET {rest}");
    let (key, value) = match rest.split_once('=') {
        Some(parts) => parts,
        None => {
            let mut words = rest.splitn(3, char::is_whitespace);
            match (words.next(), words.next(), words.next()) {
                (Some(key), Some(to), Some(value)) if to.eq_ignore_ascii_case("to") => (key, value),
                _ => return Err(usage()),
            }
        }
    };
    let (key, value) = (key.trim(), unquote(value.trim()));
    if key.is_empty() || value.is_empty() || key.contains(char::is_whitespace) {
        return Err(usage());
    }
    Ok(Setting::Set {
        key: key.to_string(),
        value: value.to_string(),
    })
}

/// `value` without one pair of surrounding quotes.
fn unquote(value: &str) -> &str {
    for quote in ['\'', '"'] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

/// `spec` with `key` set to `value`, where the spec keeps it.
///
/// # Errors
///
/// A key that is neither `datafusion.*` nor `dfx_engine.*`, the shuffle
/// location (the shell gives each query its own), a value the field does
/// not take, or a spec [`SessionSpec::validate`] refuses. A key or value
/// only a session can judge (an unknown `datafusion.*` key) is left to the
/// session the caller builds next.
pub fn apply(spec: &SessionSpec, key: &str, value: &str) -> Result<SessionSpec, String> {
    let mut spec = spec.clone();
    if key == TARGET_PARTITIONS {
        spec.target_partitions = match value.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "{key} takes a whole number of at least 1, got {value:?}"
                ));
            }
        };
    } else if key.starts_with(DATAFUSION) {
        spec.datafusion_options
            .insert(key.to_string(), value.to_string());
    } else if let Some(engine_key) = key.strip_prefix(ENGINE) {
        match engine_key {
            "shuffle_dir" => {
                return Err(format!(
                    "{key} is not a setting in dfx shell: each query gets a fresh location \
                     under the shell's shuffle directory (--shuffle-dir)"
                ));
            }
            "split" => {
                spec.split = Split::from_str(value, true)
                    .map_err(|_| choices(key, value, &["exchange", "aggregate"]))?
            }
            "shuffle_compression" => {
                spec.shuffle_compression = ShuffleCompression::from_str(value, true)
                    .map_err(|_| choices(key, value, &["auto", "lz4", "none"]))?;
            }
            store if STORE_OPTION_KEYS.contains(&store) => {
                spec.store_options
                    .insert(store.to_string(), value.to_string());
            }
            other => {
                spec.engine_options
                    .insert(other.to_string(), value.to_string());
            }
        }
    } else {
        return Err(format!(
            "cannot SET {key}: dfx shell sets datafusion.* and dfx_engine.* keys"
        ));
    }
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

/// A value `key` does not take, and those it does.
fn choices(key: &str, value: &str, allowed: &[&str]) -> String {
    format!("{key} takes one of {allowed:?}, got {value:?}")
}

/// Every `datafusion.*` and `dfx_engine.*` setting of a session built from
/// `spec`, by key: the session's own `entries` (the plugin's keys as its
/// config extension shows them, with or without the FFI namespace), then
/// what the spec holds for the plugin, which is what its sessions are
/// given.
pub fn settings_of(
    spec: &SessionSpec,
    entries: impl IntoIterator<Item = (String, Option<String>)>,
) -> std::collections::BTreeMap<String, String> {
    let mut settings = std::collections::BTreeMap::new();
    for (key, value) in entries {
        let key = key
            .strip_prefix("datafusion_ffi.")
            .map_or(key.clone(), str::to_string);
        if key.starts_with(DATAFUSION) || key.starts_with(ENGINE) {
            settings.insert(key, value.unwrap_or_default());
        }
    }
    settings.insert(format!("{ENGINE}split"), spec.split.as_str().to_string());
    for (key, value) in spec.plugin_settings() {
        settings.insert(format!("{ENGINE}{key}"), value);
    }
    settings.insert(
        TARGET_PARTITIONS.to_string(),
        spec.target_partitions.to_string(),
    );
    for (key, value) in &spec.datafusion_options {
        settings.insert(key.clone(), value.clone());
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, value: &str) -> Setting {
        Setting::Set {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn set_and_show_are_read_in_each_spelling() {
        let parsed = |sql: &str| parse(sql).expect("a setting").expect("well formed");
        assert_eq!(parsed("SET a.b = 1"), set("a.b", "1"));
        assert_eq!(parsed("set a.b to 'x y';"), set("a.b", "x y"));
        assert_eq!(parsed("SET a.b=\"2\""), set("a.b", "2"));
        assert_eq!(parsed("SHOW ALL"), Setting::Show(None));
        assert_eq!(parsed("show a.b"), Setting::Show(Some("a.b".into())));
        assert!(parse("SELECT 1").is_none());
        assert!(parse("SET a.b").expect("a setting").is_err());
        assert!(parse("SHOW a b").expect("a setting").is_err());
    }

    #[test]
    fn each_key_lands_where_the_spec_keeps_it() {
        let spec = SessionSpec::default();
        let spec = apply(&spec, "datafusion.execution.batch_size", "100").unwrap();
        assert_eq!(
            spec.datafusion_options["datafusion.execution.batch_size"],
            "100"
        );
        let spec = apply(&spec, "dfx_engine.join_filters", "off").unwrap();
        assert_eq!(spec.engine_options["join_filters"], "off");
        let spec = apply(&spec, "dfx_engine.split", "aggregate").unwrap();
        assert_eq!(spec.split, Split::Aggregate);
        let spec = apply(&spec, TARGET_PARTITIONS, "3").unwrap();
        assert_eq!(spec.target_partitions, 3);
        assert!(apply(&spec, "dfx_engine.split", "sideways").is_err());
        assert!(apply(&spec, "dfx_engine.shuffle_dir", "/tmp/x").is_err());
        assert!(apply(&spec, "foo.bar", "1").is_err());
        let shown = settings_of(
            &spec,
            [(
                "datafusion_ffi.dfx_engine.coalesce".into(),
                Some("auto".into()),
            )],
        );
        assert_eq!(shown["dfx_engine.coalesce"], "auto");
        assert_eq!(shown["dfx_engine.join_filters"], "off");
        assert_eq!(shown["dfx_engine.split"], "aggregate");
        assert_eq!(shown[TARGET_PARTITIONS], "3");
    }
}
