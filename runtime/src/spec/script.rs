//! A SQL script as `dfx run -f` takes one: `CREATE EXTERNAL TABLE`
//! statements, then queries, separated by `;`, as datafusion-cli reads them.
//!
//! The tables a script creates become definitions in the session spec
//! ([`TableDefinition`]), so every worker is given exactly the driver's
//! tables; each query then runs on its own, distributed.
//!
//! ```text
//! CREATE EXTERNAL TABLE t STORED AS CSV LOCATION 's3://b/t/'   ─► spec.tables["t"]
//!     OPTIONS ('format.has_header' 'true');
//! SELECT count(*) FROM t;                                      ─► queries[0]
//! ```
//!
//! Every table is created before the first query: a script is checked
//! whole before anything runs, and a `CREATE EXTERNAL TABLE` after a query
//! is refused, as is any other statement that would change the session
//! (`CREATE TABLE AS`, `INSERT`, `SET`): the spec is fixed once the first
//! query is planned.

use datafusion::sql::parser::{CreateExternalTable, DFParser, Statement};
use datafusion::sql::sqlparser::ast::{Statement as SqlStatement, Value};

use crate::error::{Result, RuntimeError};
use crate::spec::format::TableFormat;
use crate::spec::table::TableDefinition;

/// A parsed script: the tables it creates, in order, then its queries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Script {
    /// `(name, definition)` of each `CREATE EXTERNAL TABLE`, in order.
    pub tables: Vec<(String, TableDefinition)>,
    /// Each query's SQL text.
    pub queries: Vec<String>,
}

impl Script {
    /// Parse `sql`, checking every statement before anything runs.
    ///
    /// A script of one query keeps its text as written; in a longer one
    /// each query is the parser's rendering of it.
    ///
    /// # Errors
    ///
    /// SQL that does not parse; a `CREATE EXTERNAL TABLE` after a query, or
    /// one using what a definition does not carry (several locations,
    /// `WITH ORDER`, constraints, `UNBOUNDED`, `OR REPLACE`); any statement
    /// that is neither that nor a query; a script without a query. Each
    /// names the statement by its position.
    pub fn parse(sql: &str) -> Result<Self> {
        let script = Self::parse_statements(sql)?;
        if script.queries.is_empty() {
            return Err(RuntimeError::Invalid(
                "the script has no query: it only creates tables".to_string(),
            ));
        }
        Ok(script)
    }

    /// Parse `sql` as [`Script::parse`] does, but accept statements that
    /// only create tables: what a shell takes one input at a time, each
    /// table lasting for the rest of its session.
    ///
    /// # Errors
    ///
    /// What [`Script::parse`] refuses, except a script without a query.
    pub fn parse_statements(sql: &str) -> Result<Self> {
        let statements = DFParser::parse_sql(sql)
            .map_err(|e| RuntimeError::Invalid(format!("the SQL does not parse: {e}")))?;
        let single = statements.len() == 1;
        let mut script = Script::default();
        for (index, statement) in statements.into_iter().enumerate() {
            let position = index + 1;
            match statement {
                Statement::CreateExternalTable(create) => {
                    if !script.queries.is_empty() {
                        return Err(RuntimeError::Invalid(format!(
                            "statement {position} creates table {} after a query; put every \
                             CREATE EXTERNAL TABLE before the first query (the tables are fixed \
                             once a query is planned)",
                            create.name
                        )));
                    }
                    script.tables.push(definition_of(position, &create)?);
                }
                Statement::Statement(inner) if is_query(&inner) => {
                    script.queries.push(if single {
                        sql.trim().trim_end_matches(';').trim_end().to_string()
                    } else {
                        inner.to_string()
                    });
                }
                other => {
                    let text = other.to_string();
                    let head: String = text.chars().take(60).collect();
                    return Err(RuntimeError::Invalid(format!(
                        "statement {position} ({head}...) is neither CREATE EXTERNAL TABLE nor \
                         a query; a dfx script creates tables, then runs queries"
                    )));
                }
            }
        }
        Ok(script)
    }
}

/// Whether `statement` reads without changing the session: a query, or an
/// `EXPLAIN` of one.
fn is_query(statement: &SqlStatement) -> bool {
    matches!(statement, SqlStatement::Query(_))
}

/// The definition a `CREATE EXTERNAL TABLE` statement says.
fn definition_of(
    position: usize,
    create: &CreateExternalTable,
) -> Result<(String, TableDefinition)> {
    let name = create.name.to_string();
    let refuse = |what: &str| {
        Err(RuntimeError::Invalid(format!(
            "statement {position} (CREATE EXTERNAL TABLE {name}): {what} is not supported in a \
             dfx script"
        )))
    };
    let [location] = create.locations.as_slice() else {
        return refuse("a table of several locations");
    };
    if !create.order_exprs.is_empty() {
        return refuse("WITH ORDER");
    }
    if !create.constraints.is_empty() {
        return refuse("a constraint");
    }
    if create.unbounded {
        return refuse("UNBOUNDED");
    }
    if create.or_replace || create.temporary {
        return refuse("OR REPLACE or TEMPORARY");
    }
    let format = TableFormat::parse(&create.file_type).map_err(|e| {
        RuntimeError::Invalid(format!(
            "statement {position} (CREATE EXTERNAL TABLE {name}): {e}"
        ))
    })?;
    let mut table = TableDefinition::new(location.clone(), format);
    for column in &create.columns {
        if !create.table_partition_cols.contains(&column.name.value) {
            table = table.with_column(column.name.value.clone(), column.data_type.to_string());
        }
    }
    for partition in &create.table_partition_cols {
        // Typed where the column list declares it; else a string, as
        // DataFusion reads an untyped partition column.
        let data_type = create
            .columns
            .iter()
            .find(|c| &c.name.value == partition)
            .map(|c| c.data_type.to_string());
        table = table.with_partition_column(partition.clone(), data_type.as_deref());
    }
    for (key, value) in &create.options {
        let value = match value {
            Value::SingleQuotedString(text) | Value::DoubleQuotedString(text) => text.clone(),
            other => other.to_string(),
        };
        table = table.with_option(key.clone(), value);
    }
    table
        .validate(&name)
        .map_err(|e| RuntimeError::Invalid(format!("statement {position}: {e}")))?;
    Ok((name, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_then_queries() {
        let script = Script::parse(
            "CREATE EXTERNAL TABLE t (a INT, y INT) STORED AS CSV PARTITIONED BY (y) \
             LOCATION 's3://b/t/' OPTIONS ('format.has_header' 'true');\n\
             CREATE EXTERNAL TABLE u STORED AS PARQUET LOCATION '/d/u';\n\
             SELECT count(*) FROM t; SELECT 1",
        )
        .unwrap();
        let expected = TableDefinition::new("s3://b/t/", TableFormat::Csv)
            .with_column("a", "INT")
            .with_partition_column("y", Some("INT"))
            .with_option("format.has_header", "true");
        assert_eq!(script.tables[0], ("t".to_string(), expected));
        assert_eq!(
            script.tables[1],
            ("u".to_string(), TableDefinition::parquet("/d/u"))
        );
        assert_eq!(script.queries, ["SELECT count(*) FROM t", "SELECT 1"]);
    }

    #[test]
    fn a_single_query_keeps_its_text() {
        let sql = "-- q1\nselect  1 ;\n";
        assert_eq!(Script::parse(sql).unwrap().queries, ["-- q1\nselect  1"]);
    }

    #[test]
    fn what_a_script_may_not_do_is_refused_by_position() {
        let cases = [
            (
                "SELECT 1; CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/d'",
                "statement 2 creates table t after a query",
            ),
            ("CREATE TABLE t AS SELECT 1; SELECT 1", "statement 1"),
            (
                "CREATE EXTERNAL TABLE t STORED AS ORC LOCATION '/d'; SELECT 1",
                "unknown table format",
            ),
            (
                "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/d'",
                "no query",
            ),
            ("SELEC 1", "does not parse"),
        ];
        for (sql, expected) in cases {
            let err = Script::parse(sql).unwrap_err().to_string();
            assert!(err.contains(expected), "{sql}: {err}");
        }
    }
}
