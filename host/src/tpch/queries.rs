//! The 22 TPC-H queries, compiled into the binary from `host/queries/q<N>.sql`
//! so `dfx tpch` runs from any working directory.

use super::TpchError;

/// One TPC-H query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    /// Query number, 1 to 22.
    pub number: u8,
    /// The query text (one statement, DataFusion dialect, validation parameters).
    pub sql: &'static str,
}

/// Every TPC-H query, in number order.
pub const QUERIES: [Query; 22] = [
    Query {
        number: 1,
        sql: include_str!("../../queries/q1.sql"),
    },
    Query {
        number: 2,
        sql: include_str!("../../queries/q2.sql"),
    },
    Query {
        number: 3,
        sql: include_str!("../../queries/q3.sql"),
    },
    Query {
        number: 4,
        sql: include_str!("../../queries/q4.sql"),
    },
    Query {
        number: 5,
        sql: include_str!("../../queries/q5.sql"),
    },
    Query {
        number: 6,
        sql: include_str!("../../queries/q6.sql"),
    },
    Query {
        number: 7,
        sql: include_str!("../../queries/q7.sql"),
    },
    Query {
        number: 8,
        sql: include_str!("../../queries/q8.sql"),
    },
    Query {
        number: 9,
        sql: include_str!("../../queries/q9.sql"),
    },
    Query {
        number: 10,
        sql: include_str!("../../queries/q10.sql"),
    },
    Query {
        number: 11,
        sql: include_str!("../../queries/q11.sql"),
    },
    Query {
        number: 12,
        sql: include_str!("../../queries/q12.sql"),
    },
    Query {
        number: 13,
        sql: include_str!("../../queries/q13.sql"),
    },
    Query {
        number: 14,
        sql: include_str!("../../queries/q14.sql"),
    },
    Query {
        number: 15,
        sql: include_str!("../../queries/q15.sql"),
    },
    Query {
        number: 16,
        sql: include_str!("../../queries/q16.sql"),
    },
    Query {
        number: 17,
        sql: include_str!("../../queries/q17.sql"),
    },
    Query {
        number: 18,
        sql: include_str!("../../queries/q18.sql"),
    },
    Query {
        number: 19,
        sql: include_str!("../../queries/q19.sql"),
    },
    Query {
        number: 20,
        sql: include_str!("../../queries/q20.sql"),
    },
    Query {
        number: 21,
        sql: include_str!("../../queries/q21.sql"),
    },
    Query {
        number: 22,
        sql: include_str!("../../queries/q22.sql"),
    },
];

/// The query numbered `number`, if it is one of the 22.
pub fn query(number: u8) -> Option<Query> {
    QUERIES.iter().copied().find(|q| q.number == number)
}

/// Parse a `--queries` selection: `all`, or a comma-separated list of numbers
/// and inclusive ranges (`1,3,6`, `1-5,18`), optionally prefixed with `q`.
/// The result is in the order given, without repeats.
///
/// # Errors
/// An empty selection, a token that is not a number, or a number outside 1..=22.
pub fn parse_selection(selection: &str) -> Result<Vec<u8>, TpchError> {
    let selection = selection.trim();
    if selection.eq_ignore_ascii_case("all") {
        return Ok(QUERIES.iter().map(|q| q.number).collect());
    }
    let mut numbers = Vec::new();
    for token in selection.split(',').map(str::trim) {
        let (low, high) = match token.split_once('-') {
            Some((a, b)) => {
                // Name the whole range, not the empty or bad half of it.
                let bound = |n: &str| {
                    parse_number(n, selection).map_err(|_| {
                        TpchError::Invalid(format!(
                            "{token:?} in --queries {selection:?} is not a range of TPC-H \
                             query numbers (such as 1-5, within 1 to 22)"
                        ))
                    })
                };
                (bound(a)?, bound(b)?)
            }
            None => {
                let n = parse_number(token, selection)?;
                (n, n)
            }
        };
        if low > high {
            return Err(TpchError::Invalid(format!(
                "query range {token:?} in --queries {selection:?} runs backwards (write {high}-{low})"
            )));
        }
        for n in low..=high {
            if !numbers.contains(&n) {
                numbers.push(n);
            }
        }
    }
    Ok(numbers)
}

fn parse_number(token: &str, selection: &str) -> Result<u8, TpchError> {
    let digits = token.trim();
    let digits = digits
        .strip_prefix('q')
        .or_else(|| digits.strip_prefix('Q'))
        .unwrap_or(digits);
    match digits.parse::<u8>() {
        Ok(n) if query(n).is_some() => Ok(n),
        _ => Err(TpchError::Invalid(format!(
            "{token:?} in --queries {selection:?} is not a TPC-H query number (1 to 22, or `all`)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_selects_the_22_queries_in_order() {
        let all = parse_selection("all").unwrap();
        assert_eq!(all, (1..=22).collect::<Vec<u8>>());
    }

    #[test]
    fn lists_and_ranges_keep_the_given_order_without_repeats() {
        assert_eq!(parse_selection("1,3,6").unwrap(), vec![1, 3, 6]);
        assert_eq!(parse_selection("q18, 1-3,2").unwrap(), vec![18, 1, 2, 3]);
    }

    #[test]
    fn bad_selections_are_refused_with_the_culprit() {
        for bad in [
            "", "0", "23", "x", "5-2", "1,,2", "1-", "-3", "1-23", "1-2-3",
        ] {
            let err = parse_selection(bad).unwrap_err().to_string();
            assert!(err.contains("query"), "{bad:?} gave {err}");
        }
    }

    #[test]
    fn every_file_is_one_statement_for_its_number() {
        for q in QUERIES {
            assert!(
                q.sql.contains(&format!("TPC-H Q{}:", q.number)),
                "q{}.sql does not start with its own header",
                q.number
            );
            let statements = datafusion::sql::parser::DFParser::parse_sql(q.sql)
                .unwrap_or_else(|e| panic!("q{}.sql does not parse: {e}", q.number));
            assert_eq!(
                statements.len(),
                1,
                "q{}.sql is not one statement",
                q.number
            );
        }
    }
}
