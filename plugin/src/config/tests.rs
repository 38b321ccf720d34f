//! The config's keys, parsed and refused.

use super::*;

fn options_with_ffi(key: &str, value: &str) -> Result<ConfigOptions> {
    let mut options = ConfigOptions::default();
    options.extensions.insert(DfxConfig::default().to_ffi()?);
    options.set(key, value)?;
    Ok(options)
}

#[test]
fn local_extension() -> Result<()> {
    let mut options = ConfigOptions::default();
    options.extensions.insert(DfxConfig::default());
    options.set(SHUFFLE_DIR_KEY, "/tmp/q1")?;
    let config = DfxConfig::from_config(&options)?;
    assert_eq!(config.shuffle_dir(), Some(PathBuf::from("/tmp/q1")));
    Ok(())
}

#[test]
fn ffi_extension_under_both_spellings() -> Result<()> {
    for key in [SHUFFLE_DIR_KEY, "datafusion_ffi.dfx_engine.shuffle_dir"] {
        let options = options_with_ffi(key, "/tmp/q2")?;
        let config = DfxConfig::from_config(&options)?;
        assert_eq!(
            config.shuffle_dir(),
            Some(PathBuf::from("/tmp/q2")),
            "{key}"
        );
    }
    Ok(())
}

#[test]
fn empty_or_missing_means_no_distribution() -> Result<()> {
    let options = options_with_ffi(SHUFFLE_DIR_KEY, "")?;
    assert_eq!(DfxConfig::from_config(&options)?.shuffle_dir(), None);
    let options = ConfigOptions::default();
    assert_eq!(DfxConfig::from_config(&options)?.shuffle_dir(), None);
    Ok(())
}

#[test]
fn unknown_key_is_an_error() -> Result<()> {
    let options = options_with_ffi("dfx_engine.shufle_dir", "/tmp/x")?;
    let err = DfxConfig::from_config(&options).unwrap_err().to_string();
    assert!(
        err.contains("`dfx_engine.shufle_dir` is not a dfx setting"),
        "{err}"
    );
    // Every declared key is named, those the scheduler sets among them.
    for entry in DfxConfig::default().entries() {
        assert!(
            err.contains(&format!("`{CONFIG_PREFIX}.{}`", entry.key)),
            "{err}"
        );
    }
    assert!(
        err.contains(SHUFFLE_DIR_KEY) && err.contains(BROADCAST_SWITCH_KEY),
        "{err}"
    );
    // A value its key refuses is said with the key, the value and why.
    let options = options_with_ffi("dfx_engine.partitions_per_task", "many")?;
    let err = DfxConfig::from_config(&options).unwrap_err().to_string();
    assert!(
        err.contains("cannot set `dfx_engine.partitions_per_task` to \"many\"")
            && !err.contains("dfx declares"),
        "{err}"
    );
    Ok(())
}

#[test]
fn shuffle_compression_follows_the_location_unless_set() -> Result<()> {
    let config = DfxConfig::from_config(&ConfigOptions::default())?;
    assert_eq!(config.shuffle_compression(true)?, ShuffleCompression::None);
    assert_eq!(config.shuffle_compression(false)?, ShuffleCompression::Lz4);
    let options = options_with_ffi(SHUFFLE_COMPRESSION_KEY, "none")?;
    let config = DfxConfig::from_config(&options)?;
    assert_eq!(config.shuffle_compression(false)?, ShuffleCompression::None);
    let options = options_with_ffi(SHUFFLE_COMPRESSION_KEY, "lz4")?;
    let config = DfxConfig::from_config(&options)?;
    assert_eq!(config.shuffle_compression(true)?, ShuffleCompression::Lz4);
    let options = options_with_ffi(SHUFFLE_COMPRESSION_KEY, "zip")?;
    let err = DfxConfig::from_config(&options)?
        .shuffle_compression(true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(SHUFFLE_COMPRESSION_KEY) && err.contains("zip"),
        "{err}"
    );
    Ok(())
}

#[test]
fn s3_keys_cross_ffi() -> Result<()> {
    let mut options = ConfigOptions::default();
    options.extensions.insert(DfxConfig::default().to_ffi()?);
    options.set(S3_ENDPOINT_KEY, "http://127.0.0.1:9000")?;
    options.set(S3_REGION_KEY, "eu-west-1")?;
    options.set(S3_ALLOW_HTTP_KEY, "true")?;
    let config = DfxConfig::from_config(&options)?;
    assert_eq!(config.s3_endpoint, "http://127.0.0.1:9000");
    assert_eq!(config.s3_region, "eu-west-1");
    assert!(config.s3_allow_http);
    assert!(!DfxConfig::default().s3_allow_http);
    Ok(())
}

#[test]
fn the_memory_table_limit_key_is_the_abi_one_under_the_prefix() -> Result<()> {
    let key = format!("{CONFIG_PREFIX}.{}", dfx_abi::MEMORY_TABLE_LIMIT);
    assert_eq!(key, MEMORY_TABLE_LIMIT_KEY);
    let options = options_with_ffi(&key, "1000")?;
    assert_eq!(DfxConfig::from_config(&options)?.memory_table_limit, 1000);
    assert_eq!(
        DfxConfig::default().memory_table_limit,
        DEFAULT_MEMORY_TABLE_LIMIT
    );
    Ok(())
}

#[test]
fn join_filters_are_auto_unless_set() -> Result<()> {
    let config = DfxConfig::from_config(&ConfigOptions::default())?;
    assert_eq!(config.join_filters()?, JoinFilters::Auto(0.5));
    let options = options_with_ffi(JOIN_FILTERS_KEY, "off")?;
    assert_eq!(
        DfxConfig::from_config(&options)?.join_filters()?,
        JoinFilters::Off
    );
    let options = options_with_ffi(JOIN_FILTER_RATIO_KEY, "0.25")?;
    assert_eq!(
        DfxConfig::from_config(&options)?.join_filters()?,
        JoinFilters::Auto(0.25)
    );
    let options = options_with_ffi(JOIN_FILTERS_KEY, "sometimes")?;
    let err = DfxConfig::from_config(&options)?
        .join_filters()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(JOIN_FILTERS_KEY) && err.contains("sometimes"),
        "{err}"
    );
    Ok(())
}

/// An accessor of a choice setting, answering the choice's debug form.
type Accessor = fn(&DfxConfig) -> Result<String>;

/// Every choice setting: its key, its accessor, and the names it knows,
/// the default first.
fn choice_settings() -> Vec<(String, Accessor, Vec<&'static str>)> {
    fn answer<T: std::fmt::Debug>(choice: Result<T>) -> Result<String> {
        choice.map(|choice| format!("{choice:?}"))
    }
    vec![
        (
            SPLIT_KEY.to_string(),
            |c| answer(c.split_mode()),
            vec!["exchange", "aggregate"],
        ),
        (
            SHUFFLE_COMPRESSION_KEY.to_string(),
            |c| answer(c.shuffle_compression(false)),
            vec!["auto", "lz4", "none"],
        ),
        (
            JOIN_FILTERS_KEY.to_string(),
            |c| answer(c.join_filters()),
            vec!["auto", "on", "off"],
        ),
        (
            COLLAPSE_STAGES_KEY.to_string(),
            |c| answer(c.collapse_stages()),
            vec!["auto", "task", "off"],
        ),
        (
            COALESCE_KEY.to_string(),
            |c| answer(c.coalesce()),
            vec!["auto", "on", "off"],
        ),
        (
            SKEW_SPLIT_KEY.to_string(),
            |c| answer(c.skew_split()),
            vec!["auto", "on", "off"],
        ),
        (
            BROADCAST_SWITCH_KEY.to_string(),
            |c| answer(c.broadcast_switch()),
            vec!["auto", "on", "off"],
        ),
        (
            format!("{CONFIG_PREFIX}.{}", dfx_abi::SHUFFLE_DURABILITY),
            |c| answer(c.shuffle_durability()),
            vec!["object_store", "local", "both"],
        ),
    ]
}

#[test]
fn every_choice_setting_defaults_to_its_first_and_refuses_in_the_same_words() -> Result<()> {
    let defaults = DfxConfig::from_config(&ConfigOptions::default())?;
    assert_eq!(defaults.coalesced_partitions()?, None);
    for (key, accessor, names) in choice_settings() {
        let mut answers = Vec::new();
        for name in &names {
            // Spaces around a value do not count.
            let config = DfxConfig::from_config(&options_with_ffi(&key, &format!(" {name} "))?)?;
            answers.push(accessor(&config)?);
        }
        assert_eq!(accessor(&defaults)?, answers[0], "{key}: the default");
        let config = DfxConfig::from_config(&options_with_ffi(&key, "")?)?;
        assert_eq!(accessor(&config)?, answers[0], "{key}: an empty value");

        let config = DfxConfig::from_config(&options_with_ffi(&key, "sometimes")?)?;
        let err = accessor(&config).unwrap_err().to_string();
        let quoted: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
        let (last, rest) = quoted.split_last().expect("every setting has choices");
        let expected = format!(
            "dfx config: `{key}` is \"sometimes\"; expected {} or {last}",
            rest.join(", ")
        );
        assert!(err.ends_with(&expected), "{err}\nexpected: {expected}");
        // The planner's check of every choice refuses it too.
        let err = config.check_choices().unwrap_err().to_string();
        assert!(err.ends_with(&expected), "{err}\nexpected: {expected}");
    }
    Ok(())
}

#[test]
fn other_extensions_are_ignored() -> Result<()> {
    let options = options_with_ffi("other_lib.key", "v")?;
    assert_eq!(DfxConfig::from_config(&options)?.shuffle_dir(), None);
    Ok(())
}

#[test]
fn shuffle_durability_is_read_once_and_refused_by_name() -> Result<()> {
    let config = DfxConfig::from_config(&ConfigOptions::default())?;
    assert_eq!(config.shuffle_durability()?, ShuffleDurability::ObjectStore);
    assert!(!config.maps_only_on_workers()?);
    assert!(!config.reads_location_when_owner_lost()?);
    let key = format!("{CONFIG_PREFIX}.shuffle_durability");
    for (value, expected, only_on_workers, falls_back) in [
        ("local", ShuffleDurability::Local, true, false),
        (" both ", ShuffleDurability::Both, false, true),
        ("object_store", ShuffleDurability::ObjectStore, false, false),
    ] {
        let config = DfxConfig::from_config(&options_with_ffi(&key, value)?)?;
        assert_eq!(config.shuffle_durability()?, expected, "{value}");
        assert_eq!(config.maps_only_on_workers()?, only_on_workers, "{value}");
        assert_eq!(
            config.reads_location_when_owner_lost()?,
            falls_back,
            "{value}"
        );
    }
    let config = DfxConfig::from_config(&options_with_ffi(&key, "disk")?)?;
    for err in [
        config.shuffle_durability().unwrap_err(),
        config.maps_only_on_workers().unwrap_err(),
        config.reads_location_when_owner_lost().unwrap_err(),
    ] {
        let err = err.to_string();
        assert!(
            err.contains(&key)
                && err.contains("\"disk\"")
                && err.contains(r#""object_store", "local" or "both""#),
            "{err}"
        );
    }
    Ok(())
}
