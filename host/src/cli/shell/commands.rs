//! The shell's backslash commands, as datafusion-cli spells them, and its
//! help text.

/// A backslash command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `\q`: end the shell (Ctrl-D too).
    Quit,
    /// `\?` (or `\h`): what the shell takes.
    Help,
    /// `\d`: the session's tables.
    ListTables,
    /// `\d NAME`: one table's columns and their types.
    Describe(String),
    /// `\stats`: the session's queries and its worker pool.
    Stats,
    /// Anything else, as typed.
    Unknown(String),
}

/// The command a line starting with `\` names.
pub fn parse(line: &str) -> Command {
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or_default();
    let argument: Vec<&str> = words.collect();
    match (name, argument.as_slice()) {
        ("\\q" | "\\quit", []) => Command::Quit,
        ("\\?" | "\\h" | "\\help", []) => Command::Help,
        ("\\d", []) => Command::ListTables,
        ("\\d", [table]) => Command::Describe(table.trim_end_matches(';').to_string()),
        ("\\stats", []) => Command::Stats,
        _ => Command::Unknown(line.to_string()),
    }
}

/// What `\?` prints.
pub const HELP: &str = "\
SQL, ended by `;` (a statement may span lines):
  SELECT ...                     run a query distributed over the session's worker pool
  CREATE EXTERNAL TABLE name STORED AS PARQUET|CSV|JSON|ARROW LOCATION '...'
      [PARTITIONED BY (col)] [OPTIONS ('format.has_header' 'true')]
                                 a table for the rest of the session (every worker sees it)
  SET key = value                a datafusion.* or dfx_engine.* setting for the next queries
  SHOW key | SHOW ALL            a setting's value, or every datafusion.* and dfx_engine.* one
Commands:
  \\d                             list the tables
  \\d NAME                        a table's columns and their types
  \\stats                         queries run, and the worker pool that ran them
  \\?                             this help
  \\q                             quit (Ctrl-D too; Ctrl-C clears the line, or stops a query)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_is_read_with_its_argument() {
        assert_eq!(parse("\\q"), Command::Quit);
        assert_eq!(parse("\\?"), Command::Help);
        assert_eq!(parse("\\d"), Command::ListTables);
        assert_eq!(parse("\\d  sales "), Command::Describe("sales".into()));
        assert_eq!(parse("\\stats"), Command::Stats);
        assert_eq!(parse("\\d a b"), Command::Unknown("\\d a b".into()));
        assert_eq!(parse("\\x"), Command::Unknown("\\x".into()));
    }
}
