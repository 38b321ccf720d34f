//! The shell's input, line by line: a backslash command is a line of its
//! own; SQL runs until a `;` that is not inside a string, a quoted name or
//! a comment, and may span lines.
//!
//! ```text
//! dfx> \d                      ─► Input::Command("\d")
//! dfx> SELECT 'a;b'            (pending: the `;` is in a string)
//!   -> FROM t; SELECT 2;       ─► Input::Sql("SELECT 'a;b'\nFROM t"), Input::Sql("SELECT 2")
//! ```

/// One complete thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A backslash command, its whole line trimmed (`\d lineitem`).
    Command(String),
    /// One SQL statement, without its `;`.
    Sql(String),
}

/// The SQL typed so far that no `;` has ended yet.
#[derive(Debug, Default)]
pub struct Pending {
    text: String,
}

impl Pending {
    /// Whether nothing is pending: the next line starts a statement.
    pub fn is_empty(&self) -> bool {
        self.text.trim().is_empty()
    }

    /// Forget the pending text (Ctrl-C at the prompt).
    pub fn clear(&mut self) {
        self.text.clear();
    }

    /// Take one more line; answer what it completed, in order.
    pub fn push_line(&mut self, line: &str) -> Vec<Input> {
        let trimmed = line.trim();
        // A backslash starts a command only at the start of a statement:
        // inside one it is SQL's (a string may hold it).
        if self.is_empty() && trimmed.starts_with('\\') {
            self.text.clear();
            return vec![Input::Command(trimmed.to_string())];
        }
        self.text.push_str(line);
        self.text.push('\n');
        let mut done = Vec::new();
        let mut rest = 0;
        for end in statement_ends(&self.text) {
            let statement = self.text[rest..end].trim();
            if !statement.is_empty() {
                done.push(Input::Sql(statement.to_string()));
            }
            rest = end + 1;
        }
        self.text.drain(..rest);
        if self.is_empty() {
            self.text.clear();
        }
        done
    }
}

/// Byte offsets of each `;` of `text` that ends a statement: outside
/// `'strings'`, `"quoted names"`, `-- line comments` and `/* block
/// comments */`.
fn statement_ends(text: &str) -> Vec<usize> {
    #[derive(PartialEq)]
    enum In {
        Code,
        Quote(u8),
        LineComment,
        BlockComment,
    }
    let bytes = text.as_bytes();
    let mut ends = Vec::new();
    let mut state = In::Code;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        let next = bytes.get(i + 1).copied();
        match state {
            In::Code => match (byte, next) {
                (b';', _) => ends.push(i),
                (b'\'' | b'"', _) => state = In::Quote(byte),
                (b'-', Some(b'-')) => {
                    state = In::LineComment;
                    i += 1;
                }
                (b'/', Some(b'*')) => {
                    state = In::BlockComment;
                    i += 1;
                }
                _ => {}
            },
            // A doubled quote ('it''s') closes and reopens: the same state.
            In::Quote(quote) if byte == quote => state = In::Code,
            In::Quote(_) => {}
            In::LineComment if byte == b'\n' => state = In::Code,
            In::LineComment => {}
            In::BlockComment if byte == b'*' && next == Some(b'/') => {
                state = In::Code;
                i += 1;
            }
            In::BlockComment => {}
        }
        i += 1;
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str) -> Input {
        Input::Sql(text.to_string())
    }

    #[test]
    fn a_statement_spans_lines_until_its_semicolon() {
        let mut pending = Pending::default();
        assert!(pending.push_line("SELECT 1").is_empty());
        assert!(!pending.is_empty());
        assert_eq!(pending.push_line("  + 1;"), vec![sql("SELECT 1\n  + 1")]);
        assert!(pending.is_empty());
    }

    #[test]
    fn a_semicolon_in_a_string_a_name_or_a_comment_ends_nothing() {
        let mut pending = Pending::default();
        assert!(pending.push_line("SELECT 'a;b', \"c;d\" -- e;f").is_empty());
        assert!(pending.push_line("/* g; */ FROM t").is_empty());
        assert_eq!(
            pending.push_line(";"),
            vec![sql("SELECT 'a;b', \"c;d\" -- e;f\n/* g; */ FROM t")]
        );
    }

    #[test]
    fn one_line_may_hold_several_statements_and_start_another() {
        let mut pending = Pending::default();
        assert_eq!(
            pending.push_line("SELECT 1; SELECT 'it''s';; SELECT"),
            vec![sql("SELECT 1"), sql("SELECT 'it''s'")]
        );
        assert_eq!(pending.push_line("2;"), vec![sql("SELECT\n2")]);
    }

    #[test]
    fn a_backslash_is_a_command_only_at_the_start_of_a_statement() {
        let mut pending = Pending::default();
        assert_eq!(
            pending.push_line("  \\d lineitem "),
            vec![Input::Command("\\d lineitem".into())]
        );
        assert!(pending.push_line("SELECT '").is_empty());
        assert_eq!(pending.push_line("\\d';"), vec![sql("SELECT '\n\\d'")]);
    }
}
