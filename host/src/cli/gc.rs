//! `dfx gc ROOT`: remove the query locations crashed drivers left under a
//! shuffle root. Which ones are stale is the runtime's rule
//! ([`dfx_runtime::shuffle_root`]); this module only reads the command line
//! and prints what went.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use dfx_host::Result;
use dfx_runtime::shuffle_root::{DEFAULT_STALE_AFTER, ShuffleRoot};

#[derive(Debug, Args)]
pub struct GcArgs {
    /// The shuffle root: a directory, file://DIR or s3://BUCKET/PREFIX (a
    /// root `dfx run --shuffle-root` or a Python session made). S3 is reached
    /// by the AWS_* environment variables.
    #[arg(value_name = "ROOT")]
    root: PathBuf,
    /// Remove only locations nothing was written to for DURATION (a number
    /// with s, m, h or d; a bare number is seconds). A location a live
    /// driver holds is never removed.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    older_than: Duration,
    /// Print what would be removed, and remove nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Run `dfx gc`: each stale location removed (or, with --dry-run, named),
/// with its bytes, then the total.
pub async fn gc(args: GcArgs) -> Result<()> {
    let root = ShuffleRoot::new(&args.root, &BTreeMap::new())?;
    let stale = root.collect_garbage(args.older_than, args.dry_run).await?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for location in &stale {
        println!("{verb} {} ({} bytes)", location.location, location.bytes);
    }
    let bytes: u64 = stale.iter().map(|l| l.bytes).sum();
    println!(
        "{verb} {} stale query location(s) under {}, {bytes} bytes (stale: no live driver, \
         nothing written for {:?})",
        stale.len(),
        root.canonical(),
        args.older_than
    );
    Ok(())
}

/// `90`, `90s`, `30m`, `2h`, `1d`: a duration of whole units.
fn parse_duration(value: &str) -> std::result::Result<Duration, String> {
    let text = value.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    match number.parse::<u64>() {
        Ok(n) if seconds > 0 => Ok(Duration::from_secs(n.saturating_mul(seconds))),
        _ => Err(format!(
            "expected a whole number with s, m, h or d (default {}s), got {value:?}",
            DEFAULT_STALE_AFTER.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_is_a_number_and_a_unit() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "h", "1w", "1.5h", "-1"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
