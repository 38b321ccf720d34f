//! A table as DataFusion's listing tables define one: where its files are,
//! their format and its options, and its Hive partition columns.
//!
//! One definition, one rule for every host: a host registers a table by
//! running the `CREATE EXTERNAL TABLE` statement [`TableDefinition::create_statement`]
//! writes, in its own DataFusion session (the Rust host's, or the
//! datafusion-python session of the Python package), so both list, infer
//! and read a table exactly as DataFusion does for that statement.
//!
//! ```text
//! "lineitem": "/data/lineitem"                      a directory of Parquet files
//! "nation":   {"location": "s3://b/tpch/nation.csv",
//!              "format": "csv",
//!              "options": {"format.has_header": "true"}}
//! "events":   {"location": "/data/events/",
//!              "partition_columns": [{"name": "year", "type": "INT"}]}
//! ```
//!
//! A location is a local path, `file://...` or `s3://bucket/prefix`; it names
//! a directory or one file. A glob (`/data/t/part-*.parquet`) is refused:
//! DataFusion's plan format keeps a listing table's directory but drops its
//! glob, so a stage would read every file beside the ones it selects.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use dfx_abi::location::{FILE_SCHEME, S3_SCHEME};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::spec::format::TableFormat;

/// A declared column: of the files (when their schema is not inferred), or
/// a Hive partition column (a directory level `name=value`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Column {
    /// The column's name (for a partition column, as in the directory names).
    pub name: String,
    /// Its SQL type (`INT`, `VARCHAR`, `DATE`); a partition column's
    /// directory values are read as this type. Only a partition column may
    /// leave it out (`None`): its values are then strings.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub data_type: Option<String>,
}

/// A table: its files, their format and options, its partition columns.
///
/// In a spec's JSON a table is either this object or, for a location of
/// Parquet files with nothing else set, the location alone as a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableDefinition {
    /// Where the files are: a local path, `file://...` or
    /// `s3://bucket/prefix`; a directory or one file (see the module doc on
    /// globs).
    pub location: String,
    /// How the files are stored.
    pub format: TableFormat,
    /// Format options, as `CREATE EXTERNAL TABLE ... OPTIONS` takes them
    /// (`format.has_header`, `format.delimiter`, `format.compression`).
    pub options: BTreeMap<String, String>,
    /// The files' columns, when declared rather than inferred from the
    /// files (a CSV file without a header row); empty: inferred.
    pub columns: Vec<Column>,
    /// Hive partition columns, outermost directory level first.
    pub partition_columns: Vec<Column>,
}

impl TableDefinition {
    /// Parquet files at `location`, with no options or partition columns.
    pub fn parquet(location: impl Into<String>) -> Self {
        Self::new(location, TableFormat::Parquet)
    }

    /// Files of `format` at `location`, with no options or partition columns.
    pub fn new(location: impl Into<String>, format: TableFormat) -> Self {
        Self {
            location: location.into(),
            format,
            options: BTreeMap::new(),
            columns: Vec::new(),
            partition_columns: Vec::new(),
        }
    }

    /// This definition with the format option `key` set to `value`.
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }

    /// This definition with a Hive partition column after those it has:
    /// typed (`Some("INT")`), which DataFusion allows only beside declared
    /// columns, or read as strings (`None`).
    pub fn with_partition_column(
        mut self,
        name: impl Into<String>,
        data_type: Option<&str>,
    ) -> Self {
        self.partition_columns.push(Column {
            name: name.into(),
            data_type: data_type.map(str::to_string),
        });
        self
    }

    /// This definition with a declared column of the files after those it has.
    pub fn with_column(mut self, name: impl Into<String>, data_type: impl Into<String>) -> Self {
        self.columns.push(Column {
            name: name.into(),
            data_type: Some(data_type.into()),
        });
        self
    }

    /// Whether the files are on S3.
    pub fn is_s3(&self) -> bool {
        self.location.starts_with(S3_SCHEME)
    }

    /// The bucket of an `s3://` location.
    pub fn s3_bucket(&self) -> Option<&str> {
        let rest = self.location.strip_prefix(S3_SCHEME)?;
        let bucket = rest.split('/').next().unwrap_or_default();
        (!bucket.is_empty()).then_some(bucket)
    }

    /// The location with a local path made absolute (workers may run in
    /// another directory); URLs as written.
    ///
    /// # Errors
    ///
    /// A path the current directory cannot be read to resolve.
    pub fn absolute(mut self) -> std::io::Result<Self> {
        if !self.location.contains("://") {
            let absolute = std::path::absolute(Path::new(&self.location))?;
            let mut text = absolute.to_string_lossy().into_owned();
            // `absolute` drops a trailing slash, which says "a directory".
            if self.location.ends_with('/') && !text.ends_with('/') {
                text.push('/');
            }
            self.location = text;
        }
        Ok(self)
    }

    /// The directory (or object prefix) every file of the table lies under:
    /// the location up to its first glob character, or the location itself.
    /// What a worker's vet allows a stage to read for this table.
    pub fn root(&self) -> PathBuf {
        let location = self
            .location
            .strip_prefix(FILE_SCHEME)
            .unwrap_or(&self.location);
        match location.find(['*', '?', '[']) {
            // Up to the last `/` before the glob: `/d/t/part-*.parquet` is `/d/t`.
            Some(glob) => {
                let head = &location[..glob];
                PathBuf::from(head.rsplit_once('/').map_or("", |(dir, _)| dir))
            }
            None => PathBuf::from(location.trim_end_matches('/')),
        }
    }

    /// The location as `CREATE EXTERNAL TABLE` should take it: a local
    /// directory or an S3 prefix that names no file gets a trailing `/`, so
    /// DataFusion lists it rather than reading one object of that name.
    fn statement_location(&self) -> String {
        let location = &self.location;
        let globbed = location.contains(['*', '?', '[']);
        if globbed || location.ends_with('/') {
            return location.clone();
        }
        let local = location.strip_prefix(FILE_SCHEME).unwrap_or(location);
        let directory = if self.is_s3() {
            // No listing here: a last segment without a format's extension
            // is a prefix.
            let last = local.rsplit('/').next().unwrap_or_default();
            TableFormat::from_file_name(last).is_none()
        } else {
            Path::new(local).is_dir()
        };
        if directory {
            format!("{location}/")
        } else {
            location.clone()
        }
    }

    /// The statement that registers this table as `name` in a DataFusion
    /// session: `CREATE EXTERNAL TABLE` as datafusion-cli speaks it.
    ///
    /// ```
    /// use dfx_runtime::spec::TableDefinition;
    /// let table = TableDefinition::new("s3://b/t/", dfx_runtime::spec::TableFormat::Csv)
    ///     .with_option("format.has_header", "true");
    /// assert_eq!(
    ///     table.create_statement("t"),
    ///     "CREATE EXTERNAL TABLE \"t\" STORED AS CSV LOCATION 's3://b/t/' \
    ///      OPTIONS ('format.has_header' 'true')",
    /// );
    /// ```
    pub fn create_statement(&self, name: &str) -> String {
        // Partition columns unquoted: DataFusion keeps a quoted partition
        // column's quotes in its name (`validate` allows plain names only).
        let declare = |columns: &[Column], quoted: bool| {
            let declared: Vec<String> = columns
                .iter()
                .map(|c| {
                    let name = if quoted {
                        quote_identifier(&c.name)
                    } else {
                        c.name.clone()
                    };
                    match &c.data_type {
                        Some(data_type) => format!("{name} {data_type}"),
                        None => name,
                    }
                })
                .collect();
            declared.join(", ")
        };
        let mut sql = format!("CREATE EXTERNAL TABLE {}", quote_identifier(name));
        if !self.columns.is_empty() {
            let _ = write!(sql, " ({})", declare(&self.columns, true));
        }
        let _ = write!(sql, " STORED AS {}", self.format.as_sql());
        if !self.partition_columns.is_empty() {
            let _ = write!(
                sql,
                " PARTITIONED BY ({})",
                declare(&self.partition_columns, false)
            );
        }
        let _ = write!(
            sql,
            " LOCATION {}",
            quote_string(&self.statement_location())
        );
        if !self.options.is_empty() {
            let options: Vec<String> = self
                .options
                .iter()
                .map(|(k, v)| format!("{} {}", quote_string(k), quote_string(v)))
                .collect();
            let _ = write!(sql, " OPTIONS ({})", options.join(", "));
        }
        sql
    }

    /// Refuse a definition no host could register, naming the table and
    /// what is wrong: an empty location, one of a scheme other than local
    /// files and S3, a partition column without a name or type or named
    /// twice, a type that is not a plain SQL type name.
    ///
    /// # Errors
    ///
    /// The first thing wrong, in words.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        if name.trim().is_empty() {
            return Err("a table's name must not be empty".to_string());
        }
        if self.location.trim().is_empty() {
            return Err(format!("table {name}: its location is empty"));
        }
        if let Some((scheme, _)) = self.location.split_once("://")
            && !matches!(scheme, "file" | "s3")
        {
            return Err(format!(
                "table {name}: location {} has the unsupported scheme {scheme}://; a table is \
                 a local path, file://... or s3://bucket/prefix",
                self.location
            ));
        }
        if self.location.contains(['*', '?', '[']) {
            return Err(format!(
                "table {name}: location {} is a glob; DataFusion's plan format carries a \
                 table's directory but not its glob, so a stage would read every file of \
                 {}. Name a directory (move the files the glob selects into one of their \
                 own) or one file",
                self.location,
                self.root().display()
            ));
        }
        if self.is_s3() && self.s3_bucket().is_none() {
            return Err(format!(
                "table {name}: location {} names no bucket",
                self.location
            ));
        }
        for column in &self.partition_columns {
            let mut chars = column.name.chars();
            let plain = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !plain {
                return Err(format!(
                    "table {name}: partition column {:?} must be a plain name (letters, digits, \
                     _), as in its directories' name=value",
                    column.name
                ));
            }
        }
        if let Some(column) = self.columns.iter().find(|c| c.data_type.is_none()) {
            return Err(format!("table {name}: column {} has no type", column.name));
        }
        let typed = self
            .partition_columns
            .iter()
            .find(|c| c.data_type.is_some());
        if let Some(column) = typed
            && self.columns.is_empty()
        {
            return Err(format!(
                "table {name}: partition column {} has a type, but the files' columns are not \
                 declared; DataFusion then takes the declared columns as the whole schema, and \
                 the table would hold the partition columns only. Declare the files' columns \
                 too, or give the partition columns without a type (read as strings)",
                column.name
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for column in self.columns.iter().chain(&self.partition_columns) {
            if column.name.trim().is_empty() {
                return Err(format!("table {name}: a column has no name"));
            }
            if !seen.insert(column.name.as_str()) {
                return Err(format!(
                    "table {name}: column {} is declared twice",
                    column.name
                ));
            }
            let data_type = column.data_type.as_deref().unwrap_or("VARCHAR");
            let plain = !data_type.trim().is_empty()
                && data_type
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || " _(),".contains(c));
            if !plain {
                return Err(format!(
                    "table {name}: column {} has the type {:?}; expected a SQL type such as \
                     INT, VARCHAR or DATE",
                    column.name, column.data_type
                ));
            }
        }
        Ok(())
    }
}

/// `name` as a quoted SQL identifier (case kept, `"` doubled).
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a SQL string literal (`'` doubled).
fn quote_string(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl From<PathBuf> for TableDefinition {
    fn from(location: PathBuf) -> Self {
        Self::parquet(location.to_string_lossy().into_owned())
    }
}

impl From<&Path> for TableDefinition {
    fn from(location: &Path) -> Self {
        Self::parquet(location.to_string_lossy().into_owned())
    }
}

impl From<String> for TableDefinition {
    fn from(location: String) -> Self {
        Self::parquet(location)
    }
}

impl From<&str> for TableDefinition {
    fn from(location: &str) -> Self {
        Self::parquet(location)
    }
}

/// The JSON object form of a definition.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionObject {
    location: String,
    #[serde(default)]
    format: TableFormat,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    options: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    columns: Vec<Column>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    partition_columns: Vec<Column>,
}

impl Serialize for TableDefinition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The short form for what a path alone says, as specs were written
        // before tables had formats.
        if self.format == TableFormat::Parquet
            && self.options.is_empty()
            && self.columns.is_empty()
            && self.partition_columns.is_empty()
        {
            return self.location.serialize(s);
        }
        DefinitionObject {
            location: self.location.clone(),
            format: self.format,
            options: self.options.clone(),
            columns: self.columns.clone(),
            partition_columns: self.partition_columns.clone(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for TableDefinition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Location(String),
            Definition(DefinitionObject),
        }
        let either = Either::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "a table is a location string (Parquet files) or an object with \"location\" \
                 and optionally \"format\" (parquet, csv, json, arrow), \"options\" (an object \
                 of strings), \"columns\" and \"partition_columns\" (each [{\"name\": ..., \
                 \"type\": ...}])",
            )
        })?;
        Ok(match either {
            Either::Location(location) => Self::parquet(location),
            Either::Definition(object) => Self {
                location: object.location,
                format: object.format,
                options: object.options,
                columns: object.columns,
                partition_columns: object.partition_columns,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_parquet_table_is_written_as_its_location() {
        let table = TableDefinition::parquet("/d/t");
        assert_eq!(serde_json::to_string(&table).unwrap(), "\"/d/t\"");
        let read: TableDefinition = serde_json::from_str("\"/d/t\"").unwrap();
        assert_eq!(read, table);
    }

    #[test]
    fn a_full_definition_round_trips() {
        let table = TableDefinition::new("s3://b/events/", TableFormat::Json)
            .with_option("format.compression", "gzip")
            .with_column("v", "INT")
            .with_partition_column("year", Some("INT"));
        let text = serde_json::to_string(&table).unwrap();
        assert!(text.contains("\"format\":\"json\""), "{text}");
        let read: TableDefinition = serde_json::from_str(&text).unwrap();
        assert_eq!(read, table);
        let err = serde_json::from_str::<TableDefinition>(r#"{"path": "/d"}"#).unwrap_err();
        assert!(err.to_string().contains("location"), "{err}");
    }

    #[test]
    fn statements_quote_names_and_mark_directories() {
        let dir = tempfile::tempdir().unwrap();
        let location = dir.path().display().to_string();
        let table = TableDefinition::parquet(&location).with_partition_column("y", None);
        assert_eq!(
            table.create_statement("o'k\"t"),
            format!(
                "CREATE EXTERNAL TABLE \"o'k\"\"t\" STORED AS PARQUET PARTITIONED BY (y) \
                 LOCATION '{location}/'"
            )
        );
        let file = TableDefinition::parquet("s3://b/t/one.parquet");
        assert!(
            file.create_statement("t")
                .ends_with("'s3://b/t/one.parquet'")
        );
        let prefix = TableDefinition::parquet("s3://b/t");
        assert!(prefix.create_statement("t").ends_with("'s3://b/t/'"));
    }

    #[test]
    fn a_root_stops_before_the_glob() {
        assert_eq!(
            TableDefinition::parquet("/d/t/part-*.parquet").root(),
            PathBuf::from("/d/t")
        );
        assert_eq!(
            TableDefinition::parquet("s3://b/t/").root(),
            PathBuf::from("s3://b/t")
        );
        assert_eq!(
            TableDefinition::parquet("file:///d/t").root(),
            PathBuf::from("/d/t")
        );
    }

    #[test]
    fn formats_come_from_names_and_extensions() {
        assert_eq!(
            TableFormat::from_file_name("a.csv.gz"),
            Some(TableFormat::Csv)
        );
        assert_eq!(
            TableFormat::from_file_name("a.ndjson"),
            Some(TableFormat::Json)
        );
        assert_eq!(TableFormat::from_file_name("dir"), None);
        assert_eq!(TableFormat::parse("NDJSON").unwrap(), TableFormat::Json);
        assert!(TableFormat::parse("orc").unwrap_err().contains("parquet"));
    }

    #[test]
    fn bad_definitions_are_refused_by_name() {
        let bad = [
            (TableDefinition::parquet(""), "empty"),
            (TableDefinition::parquet("gs://b/t"), "unsupported scheme"),
            (TableDefinition::parquet("s3:///t"), "no bucket"),
            (TableDefinition::parquet("/d/t/part-*.parquet"), "is a glob"),
            (
                TableDefinition::parquet("/d")
                    .with_column("v", "INT")
                    .with_partition_column("y", Some("INT); DROP")),
                "SQL type",
            ),
            (
                TableDefinition::parquet("/d")
                    .with_partition_column("y", None)
                    .with_partition_column("y", None),
                "twice",
            ),
            (
                TableDefinition::parquet("/d").with_partition_column("y", Some("INT")),
                "Declare the files' columns",
            ),
            (
                TableDefinition::parquet("/d").with_partition_column("\"y\"", None),
                "plain name",
            ),
        ];
        for (table, expected) in bad {
            let err = table.validate("t").unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }
}
