//! Do two query answers agree?
//!
//! Two answers agree when their columns have the same names and types
//! ([`compare_columns`]) and their rows agree ([`compare`]). Rows are
//! compared as [`Cell`]s: integers and decimals exactly (a sum of decimals is
//! exact in any order, so a tolerance would only hide a lost or doubled row),
//! floating point to a relative tolerance (a distributed sum adds its
//! partials in another order than a local one), everything else by its
//! display text. Row order matters only where the query orders its output,
//! and even then rows that tie on every sort key may come in any order.

use std::cmp::Ordering;
use std::fmt;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Decimal128Type, DecimalType, Float64Type};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::logical_expr::{Expr, LogicalPlan};

use super::TpchError;

/// Relative tolerance for floating point values (never for decimals).
pub const RELATIVE_TOLERANCE: f64 = 1e-6;

/// Below this magnitude two values are equal regardless of their ratio: a
/// sum that cancels to zero comes out as 0 in one order and 1e-12 in another.
pub const ABSOLUTE_FLOOR: f64 = 1e-9;

/// One value of an answer, normalised for comparison.
#[derive(Debug, Clone)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// Any integer type, compared exactly.
    Int(i128),
    /// A 128-bit decimal: its unscaled value and its scale, compared exactly.
    Decimal(i128, i8),
    /// Floating point, compared with [`RELATIVE_TOLERANCE`].
    Float(f64),
    /// Anything else, compared by its display text.
    Text(String),
}

impl Cell {
    /// Equal: exactly, or within tolerance for floating point. Cells of
    /// different kinds never agree ([`compare_columns`] has already refused
    /// answers whose column types differ).
    pub fn agrees(&self, other: &Cell) -> bool {
        match (self, other) {
            (Cell::Null, Cell::Null) => true,
            (Cell::Int(a), Cell::Int(b)) => a == b,
            (Cell::Decimal(a, s), Cell::Decimal(b, t)) => a == b && s == t,
            (Cell::Float(a), Cell::Float(b)) => floats_agree(*a, *b),
            (Cell::Text(a), Cell::Text(b)) => a == b,
            _ => false,
        }
    }

    /// A total order used to sort rows before an order-insensitive compare.
    fn sort_cmp(&self, other: &Cell) -> Ordering {
        fn rank(c: &Cell) -> u8 {
            match c {
                Cell::Null => 0,
                Cell::Int(_) => 1,
                Cell::Decimal(..) => 2,
                Cell::Float(_) => 3,
                Cell::Text(_) => 4,
            }
        }
        match (self, other) {
            (Cell::Int(a), Cell::Int(b)) => a.cmp(b),
            // Same column, same scale: the unscaled values order exactly.
            (Cell::Decimal(a, s), Cell::Decimal(b, t)) => s.cmp(t).then(a.cmp(b)),
            (Cell::Float(a), Cell::Float(b)) => a.total_cmp(b),
            (Cell::Text(a), Cell::Text(b)) => a.cmp(b),
            (a, b) => rank(a).cmp(&rank(b)),
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Null => f.write_str("NULL"),
            Cell::Int(i) => write!(f, "{i}"),
            Cell::Decimal(value, scale) => f.write_str(&Decimal128Type::format_decimal(
                *value,
                // Only the scale matters for the text; the precision is the widest.
                Decimal128Type::MAX_PRECISION,
                *scale,
            )),
            Cell::Float(x) => write!(f, "{x}"),
            Cell::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// `a` and `b` agree to [`RELATIVE_TOLERANCE`] (or both are below [`ABSOLUTE_FLOOR`]).
pub fn floats_agree(a: f64, b: f64) -> bool {
    if a == b || (a.is_nan() && b.is_nan()) {
        return true;
    }
    let diff = (a - b).abs();
    diff <= ABSOLUTE_FLOOR || diff <= RELATIVE_TOLERANCE * a.abs().max(b.abs())
}

/// One row of an answer.
pub type Row = Vec<Cell>;

/// Flatten record batches into rows of [`Cell`]s.
///
/// # Errors
/// A column whose type cannot be cast or displayed.
pub fn rows_of(batches: &[RecordBatch]) -> Result<Vec<Row>, TpchError> {
    let mut rows = Vec::new();
    for batch in batches {
        let columns = batch
            .columns()
            .iter()
            .map(column_cells)
            .collect::<Result<Vec<_>, _>>()?;
        for i in 0..batch.num_rows() {
            rows.push(columns.iter().map(|c| c[i].clone()).collect());
        }
    }
    Ok(rows)
}

fn column_cells(array: &ArrayRef) -> Result<Vec<Cell>, TpchError> {
    let answer = |e: datafusion::arrow::error::ArrowError| {
        TpchError::Invalid(format!(
            "cannot read an answer column of type {}: {e}",
            array.data_type()
        ))
    };
    let dt = array.data_type();
    let cells = if dt.is_integer() {
        let ints = cast(array, &DataType::Decimal128(38, 0)).map_err(answer)?;
        let ints = ints.as_primitive::<Decimal128Type>();
        (0..ints.len())
            .map(|i| {
                if ints.is_null(i) {
                    Cell::Null
                } else {
                    Cell::Int(ints.value(i))
                }
            })
            .collect()
    } else if let DataType::Decimal128(_, scale) = *dt {
        let decimals = array.as_primitive::<Decimal128Type>();
        (0..decimals.len())
            .map(|i| {
                if decimals.is_null(i) {
                    Cell::Null
                } else {
                    Cell::Decimal(decimals.value(i), scale)
                }
            })
            .collect()
    } else if dt.is_floating() {
        let floats = cast(array, &DataType::Float64).map_err(answer)?;
        let floats = floats.as_primitive::<Float64Type>();
        (0..floats.len())
            .map(|i| {
                if floats.is_null(i) {
                    Cell::Null
                } else {
                    Cell::Float(floats.value(i))
                }
            })
            .collect()
    } else {
        let options = FormatOptions::default();
        let formatter = ArrayFormatter::try_new(array.as_ref(), &options).map_err(answer)?;
        (0..array.len())
            .map(|i| {
                if array.is_null(i) {
                    Cell::Null
                } else {
                    Cell::Text(formatter.value(i).to_string())
                }
            })
            .collect()
    };
    Ok(cells)
}

/// How much of the row order of an answer is meaningful.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOrder {
    /// The query does not order its output: compare sorted rows.
    Unordered,
    /// Ordered by these output columns (indices): rows must come in the same
    /// order, except that rows tying on all of them may be permuted.
    ByColumns(Vec<usize>),
    /// Ordered by something that is not an output column: compare row by row.
    Strict,
}

/// Find how the final result of `plan` is ordered: looks through the
/// projections, limits and aliases above the topmost sort.
pub fn row_order(plan: &LogicalPlan) -> RowOrder {
    let output: Vec<String> = plan
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut node = plan;
    loop {
        match node {
            LogicalPlan::Sort(sort) => {
                let mut keys = Vec::new();
                for s in &sort.expr {
                    let name = match &s.expr {
                        Expr::Column(c) => c.name.clone(),
                        other => other.schema_name().to_string(),
                    };
                    match output.iter().position(|o| *o == name) {
                        Some(i) => keys.push(i),
                        None => return RowOrder::Strict,
                    }
                }
                return RowOrder::ByColumns(keys);
            }
            LogicalPlan::Projection(p) => node = &p.input,
            LogicalPlan::Limit(l) => node = &l.input,
            LogicalPlan::SubqueryAlias(a) => node = &a.input,
            _ => return RowOrder::Unordered,
        }
    }
}

/// How two answers differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn rows_agree(a: &[Cell], b: &[Cell]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.agrees(y))
}

fn show(row: &[Cell]) -> String {
    let cells: Vec<String> = row.iter().map(Cell::to_string).collect();
    format!("[{}]", cells.join(", "))
}

fn sort_rows(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        a.iter()
            .zip(b.iter())
            .map(|(x, y)| x.sort_cmp(y))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| a.len().cmp(&b.len()))
    });
}

/// Compare row lists as multisets (both sorted first).
fn compare_unordered(expected: &[Row], actual: &[Row], what: &str) -> Result<(), Mismatch> {
    let mut e = expected.to_vec();
    let mut a = actual.to_vec();
    sort_rows(&mut e);
    sort_rows(&mut a);
    compare_positional(&e, &a, what)
}

fn compare_positional(expected: &[Row], actual: &[Row], what: &str) -> Result<(), Mismatch> {
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        if !rows_agree(e, a) {
            return Err(Mismatch(format!(
                "{what} row {i} differs: expected {} found {}",
                show(e),
                show(a)
            )));
        }
    }
    Ok(())
}

/// Check that `actual` has the columns of `expected`: the same names, in the
/// same order, of the same types (a decimal's precision and scale included).
///
/// An answer without batches has no schema to compare; its row count is
/// still checked by [`compare`].
///
/// # Errors
/// A [`Mismatch`] naming the first column that differs, or the column counts.
pub fn compare_columns(expected: &[RecordBatch], actual: &[RecordBatch]) -> Result<(), Mismatch> {
    let (Some(e), Some(a)) = (expected.first(), actual.first()) else {
        return Ok(());
    };
    let (e, a) = (e.schema(), a.schema());
    if e.fields().len() != a.fields().len() {
        return Err(Mismatch(format!(
            "expected {} columns, found {}",
            e.fields().len(),
            a.fields().len()
        )));
    }
    for (i, (ef, af)) in e.fields().iter().zip(a.fields()).enumerate() {
        if ef.name() != af.name() || ef.data_type() != af.data_type() {
            return Err(Mismatch(format!(
                "column {i}: expected {:?} of type {}, found {:?} of type {}",
                ef.name(),
                ef.data_type(),
                af.name(),
                af.data_type()
            )));
        }
    }
    Ok(())
}

/// Check that `actual` (distributed) agrees with `expected` (single-process).
///
/// # Errors
/// A [`Mismatch`] naming the first difference: column count, row count, or
/// the first differing row (after sorting, when order does not matter).
pub fn compare(expected: &[Row], actual: &[Row], order: &RowOrder) -> Result<(), Mismatch> {
    let width = |rows: &[Row]| rows.first().map(Vec::len);
    if let (Some(e), Some(a)) = (width(expected), width(actual))
        && e != a
    {
        return Err(Mismatch(format!("expected {e} columns, found {a}")));
    }
    if expected.len() != actual.len() {
        return Err(Mismatch(format!(
            "expected {} rows, found {}",
            expected.len(),
            actual.len()
        )));
    }
    match order {
        RowOrder::Unordered => compare_unordered(expected, actual, "(sorted)"),
        RowOrder::Strict => compare_positional(expected, actual, "ordered"),
        RowOrder::ByColumns(keys) => {
            // Walk runs of rows that tie on every key in the expected answer;
            // inside a run any order is right, across runs the order is checked.
            let key_agrees = |a: &Row, b: &Row| {
                keys.iter().all(|&k| match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => x.agrees(y),
                    _ => false,
                })
            };
            let mut start = 0;
            while start < expected.len() {
                let mut end = start + 1;
                while end < expected.len() && key_agrees(&expected[start], &expected[end]) {
                    end += 1;
                }
                let what = format!("ordered (rows {start}..{end} tie on the sort keys)");
                compare_unordered(&expected[start..end], &actual[start..end], &what)?;
                start = end;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use datafusion::arrow::array::{Decimal128Array, Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    fn row(k: i128, v: f64) -> Row {
        vec![Cell::Int(k), Cell::Float(v)]
    }

    #[test]
    fn floats_agree_to_one_millionth_relative() {
        assert!(floats_agree(1_000_000.0, 1_000_000.9));
        assert!(!floats_agree(1_000_000.0, 1_000_002.0));
        assert!(floats_agree(0.0, 1e-12));
        assert!(!floats_agree(1.0, -1.0));
    }

    #[test]
    fn unordered_answers_compare_as_sorted_rows() {
        let e = vec![row(1, 1.5), row(2, 2.5)];
        let a = vec![row(2, 2.5000001), row(1, 1.5)];
        assert_eq!(compare(&e, &a, &RowOrder::Unordered), Ok(()));
        assert!(compare(&e, &a, &RowOrder::Strict).is_err());
    }

    #[test]
    fn ordered_answers_may_permute_only_ties() {
        // Sorted by column 1: rows 0 and 1 tie on it.
        let e = vec![row(1, 9.0), row(2, 9.0), row(3, 1.0)];
        let ties_swapped = vec![row(2, 9.0), row(1, 9.0), row(3, 1.0)];
        let keys = RowOrder::ByColumns(vec![1]);
        assert_eq!(compare(&e, &ties_swapped, &keys), Ok(()));
        let out_of_order = vec![row(3, 1.0), row(1, 9.0), row(2, 9.0)];
        let err = compare(&e, &out_of_order, &keys).unwrap_err();
        assert!(err.0.contains("differs"), "{err}");
    }

    #[test]
    fn counts_and_values_are_reported() {
        let e = vec![row(1, 1.0)];
        assert_eq!(
            compare(&e, &[], &RowOrder::Unordered).unwrap_err().0,
            "expected 1 rows, found 0"
        );
        let err = compare(&e, &[row(1, 1.1)], &RowOrder::Unordered).unwrap_err();
        assert!(
            err.0.contains("expected [1, 1]") && err.0.contains("found [1, 1.1]"),
            "{err}"
        );
    }

    #[test]
    fn decimals_agree_only_exactly() {
        // One cent in a hundred million: inside a 1e-6 tolerance, and
        // exactly what a lost row of a sum of prices looks like at scale 1.
        let sum = Cell::Decimal(10_000_000_000, 2);
        let one_cent_less = Cell::Decimal(9_999_999_999, 2);
        assert!(sum.agrees(&sum.clone()));
        assert!(!sum.agrees(&one_cent_less));
        assert!(
            floats_agree(1e8, 1e8 - 0.01),
            "the float tolerance would hide it"
        );
        let err = compare(&[vec![sum]], &[vec![one_cent_less]], &RowOrder::Strict).unwrap_err();
        assert!(
            err.0.contains("100000000.00") && err.0.contains("99999999.99"),
            "{err}"
        );
        // The same number at another scale is another type, not the same value.
        assert!(!Cell::Decimal(100, 2).agrees(&Cell::Decimal(1000, 3)));
        assert!(!Cell::Int(1).agrees(&Cell::Float(1.0)));
    }

    fn one_row(name: &str, data_type: DataType) -> RecordBatch {
        let column: ArrayRef = match &data_type {
            DataType::Int64 => Arc::new(Int64Array::from(vec![1])),
            DataType::Float64 => Arc::new(Float64Array::from(vec![1.0])),
            DataType::Decimal128(p, s) => Arc::new(
                Decimal128Array::from(vec![100])
                    .with_precision_and_scale(*p, *s)
                    .unwrap(),
            ),
            other => panic!("no test column of type {other}"),
        };
        let schema = Arc::new(Schema::new(vec![Field::new(name, data_type, false)]));
        RecordBatch::try_new(schema, vec![column]).unwrap()
    }

    #[test]
    fn column_names_and_types_must_match() {
        let expected = [one_row("revenue", DataType::Decimal128(38, 2))];
        assert_eq!(compare_columns(&expected, &expected), Ok(()));
        let renamed = [one_row("sum", DataType::Decimal128(38, 2))];
        let err = compare_columns(&expected, &renamed).unwrap_err();
        assert!(
            err.0.contains("\"revenue\"") && err.0.contains("\"sum\""),
            "{err}"
        );
        let rescaled = [one_row("revenue", DataType::Decimal128(38, 4))];
        let err = compare_columns(&expected, &rescaled).unwrap_err();
        assert!(err.0.contains("Decimal128(38, 4)"), "{err}");
        let floated = [one_row("revenue", DataType::Float64)];
        assert!(compare_columns(&expected, &floated).is_err());
        // No batches: nothing to compare here; the row count decides.
        assert_eq!(compare_columns(&expected, &[]), Ok(()));
    }

    #[test]
    fn batches_become_typed_cells() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(15, 2), false),
            Field::new("f", DataType::Float64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(7), None])),
                Arc::new(
                    Decimal128Array::from(vec![12345, -5])
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
                Arc::new(Float64Array::from(vec![0.5, 2.0])),
                Arc::new(StringArray::from(vec!["A", "B"])),
            ],
        )
        .unwrap();
        let rows = rows_of(&[batch]).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(matches!(rows[0][0], Cell::Int(7)));
        assert!(matches!(rows[1][0], Cell::Null));
        assert!(matches!(rows[0][1], Cell::Decimal(12345, 2)));
        assert!(matches!(rows[1][1], Cell::Decimal(-5, 2)));
        assert_eq!(rows[1][1].to_string(), "-0.05");
        assert!(matches!(rows[0][2], Cell::Float(x) if x == 0.5));
        assert!(matches!(&rows[1][3], Cell::Text(s) if s == "B"));
    }
}
