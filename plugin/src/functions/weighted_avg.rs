//! `dfx_weighted_avg(value, weight) = sum(value * weight) / sum(weight)`.
//!
//! Its state is two values (the weighted sum and the total weight), so a
//! partial aggregate in one process and the final one in another must carry
//! both across: the split is real, not a re-aggregation of averages.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::cast::as_float64_array;
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};

use crate::guard::GuardedAccumulator;

/// Weighted mean of `value` by `weight`. Rows where either is null are
/// skipped, as SQL's `avg` skips nulls; a zero total weight gives null.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct WeightedAvg {
    signature: Signature,
}

impl Default for WeightedAvg {
    fn default() -> Self {
        Self {
            signature: Signature::uniform(2, vec![DataType::Float64], Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for WeightedAvg {
    fn name(&self) -> &str {
        "dfx_weighted_avg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn accumulator(&self, _acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        // Every method of the accumulator runs behind the guard: the host
        // calls them across FFI, where a panic would abort it.
        Ok(GuardedAccumulator::wrap(
            "the aggregate function dfx_weighted_avg",
            Box::new(WeightedAvgAccumulator::default()),
        ))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(
                format_state_name(args.name, "weighted_sum"),
                DataType::Float64,
                true,
            )),
            Arc::new(Field::new(
                format_state_name(args.name, "total_weight"),
                DataType::Float64,
                true,
            )),
        ])
    }
}

/// Running weighted sum and total weight of one group.
#[derive(Debug, Default)]
pub struct WeightedAvgAccumulator {
    weighted_sum: f64,
    total_weight: f64,
}

impl WeightedAvgAccumulator {
    fn add(&mut self, sums: &ArrayRef, weights: &ArrayRef, scale_by_weight: bool) -> Result<()> {
        let sums = as_float64_array(sums)?;
        let weights = as_float64_array(weights)?;
        for i in 0..sums.len() {
            if sums.is_null(i) || weights.is_null(i) {
                continue;
            }
            let (v, w) = (sums.value(i), weights.value(i));
            self.weighted_sum += if scale_by_weight { v * w } else { v };
            self.total_weight += w;
        }
        Ok(())
    }
}

impl Accumulator for WeightedAvgAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let [value, weight] = values else {
            return exec_err!(
                "dfx_weighted_avg takes (value, weight), got {} arguments",
                values.len()
            );
        };
        self.add(value, weight, true)
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [weighted_sum, total_weight] = states else {
            return exec_err!(
                "dfx_weighted_avg state has two fields, got {}",
                states.len()
            );
        };
        self.add(weighted_sum, total_weight, false)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Float64(Some(self.weighted_sum)),
            ScalarValue::Float64(Some(self.total_weight)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(
            (self.total_weight != 0.0).then(|| self.weighted_sum / self.total_weight),
        ))
    }

    fn size(&self) -> usize {
        size_of_val(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Float64Array;

    fn array(v: Vec<Option<f64>>) -> ArrayRef {
        Arc::new(Float64Array::from(v))
    }

    #[test]
    fn hand_computed_with_nulls_skipped() -> Result<()> {
        let mut acc = WeightedAvgAccumulator::default();
        // (1*1 + 3*3) / (1 + 3) = 10 / 4 = 2.5; the null rows do not count.
        acc.update_batch(&[
            array(vec![Some(1.0), Some(3.0), None, Some(5.0)]),
            array(vec![Some(1.0), Some(3.0), Some(9.0), None]),
        ])?;
        assert_eq!(acc.evaluate()?, ScalarValue::Float64(Some(2.5)));
        Ok(())
    }

    #[test]
    fn partial_states_merge_into_the_same_answer() -> Result<()> {
        let mut left = WeightedAvgAccumulator::default();
        left.update_batch(&[array(vec![Some(1.0)]), array(vec![Some(1.0)])])?;
        let mut right = WeightedAvgAccumulator::default();
        right.update_batch(&[array(vec![Some(3.0)]), array(vec![Some(3.0)])])?;
        let mut total = WeightedAvgAccumulator::default();
        for mut part in [left, right] {
            let state = part.state()?;
            let arrays: Vec<ArrayRef> =
                state.iter().map(|s| s.to_array()).collect::<Result<_>>()?;
            total.merge_batch(&arrays)?;
        }
        // Averaging the two partial averages would give (1 + 3) / 2 = 2.
        assert_eq!(total.evaluate()?, ScalarValue::Float64(Some(2.5)));
        Ok(())
    }

    #[test]
    fn zero_weight_and_empty_give_null() -> Result<()> {
        let mut acc = WeightedAvgAccumulator::default();
        assert_eq!(acc.evaluate()?, ScalarValue::Float64(None));
        acc.update_batch(&[array(vec![Some(4.0)]), array(vec![Some(0.0)])])?;
        assert_eq!(acc.evaluate()?, ScalarValue::Float64(None));
        Ok(())
    }
}
