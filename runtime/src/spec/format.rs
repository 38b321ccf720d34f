//! The file formats a table may be stored as: their `STORED AS` names,
//! the extension DataFusion lists a directory of each for, and the format
//! a file name implies.

use serde::{Deserialize, Serialize};

/// The file formats a table may be stored as, spelled as `STORED AS` takes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TableFormat {
    /// Apache Parquet.
    #[default]
    Parquet,
    /// Comma (or otherwise) separated values.
    Csv,
    /// Newline-delimited JSON, one object per line.
    Json,
    /// Arrow IPC files.
    Arrow,
}

impl TableFormat {
    /// Every format, for callers that list them.
    pub const ALL: [TableFormat; 4] = [Self::Parquet, Self::Csv, Self::Json, Self::Arrow];

    /// The name `STORED AS` takes.
    pub fn as_sql(self) -> &'static str {
        match self {
            Self::Parquet => "PARQUET",
            Self::Csv => "CSV",
            Self::Json => "JSON",
            Self::Arrow => "ARROW",
        }
    }

    /// The extension DataFusion lists a directory of this format for.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => ".parquet",
            Self::Csv => ".csv",
            Self::Json => ".json",
            Self::Arrow => ".arrow",
        }
    }

    /// The format a file name's extension implies (`.parquet`, `.csv`,
    /// `.json` or `.ndjson`, `.arrow` or `.ipc`; a compression suffix such as
    /// `.gz` after it is skipped), or `None`.
    pub fn from_file_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let base = [".gz", ".bz2", ".xz", ".zst"]
            .iter()
            .find_map(|suffix| lower.strip_suffix(suffix))
            .unwrap_or(&lower);
        let extension = base.rsplit_once('.').map(|(_, ext)| ext)?;
        match extension {
            "parquet" => Some(Self::Parquet),
            "csv" | "tsv" => Some(Self::Csv),
            "json" | "ndjson" | "jsonl" => Some(Self::Json),
            "arrow" | "ipc" | "feather" => Some(Self::Arrow),
            _ => None,
        }
    }

    /// Parse a format name as `STORED AS` or the command line spells it
    /// (case-insensitive; `ndjson` is `json`, `ipc` is `arrow`).
    ///
    /// # Errors
    ///
    /// A name that is none of them, listing those taken.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "parquet" => Ok(Self::Parquet),
            "csv" => Ok(Self::Csv),
            "json" | "ndjson" => Ok(Self::Json),
            "arrow" | "ipc" => Ok(Self::Arrow),
            other => Err(format!(
                "unknown table format {other:?}; the formats are parquet, csv, json (ndjson) \
                 and arrow"
            )),
        }
    }
}

impl std::fmt::Display for TableFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_sql().to_ascii_lowercase())
    }
}
