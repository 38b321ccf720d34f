//! `dfx_net_revenue(price, discount, tax) = price * (1 - discount) * (1 + tax)`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::cast::as_float64_array;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use crate::guard;

/// The revenue of a line item after discount and tax, in Float64. Null when
/// any argument is null.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NetRevenue {
    signature: Signature,
}

impl Default for NetRevenue {
    fn default() -> Self {
        Self {
            // Uniform Float64 lets DECIMAL and integer columns coerce in.
            signature: Signature::uniform(3, vec![DataType::Float64], Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for NetRevenue {
    fn name(&self) -> &str {
        "dfx_net_revenue"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        guard::catch("the scalar function dfx_net_revenue", || invoke(args))
    }
}

/// The function's body, behind the guard in `invoke_with_args`.
fn invoke(args: ScalarFunctionArgs) -> Result<ColumnarValue> {
    if args.args.len() != 3 {
        return exec_err!(
            "dfx_net_revenue takes (price, discount, tax), got {} arguments",
            args.args.len()
        );
    }
    let arrays = ColumnarValue::values_to_arrays(&args.args)?;
    let price = as_float64_array(&arrays[0])?;
    let discount = as_float64_array(&arrays[1])?;
    let tax = as_float64_array(&arrays[2])?;
    let result: Float64Array = (0..price.len())
        .map(|i| {
            if price.is_null(i) || discount.is_null(i) || tax.is_null(i) {
                None
            } else {
                Some(price.value(i) * (1.0 - discount.value(i)) * (1.0 + tax.value(i)))
            }
        })
        .collect();
    Ok(ColumnarValue::Array(Arc::new(result)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Float64Array};
    use datafusion::arrow::datatypes::Field;
    use datafusion::common::config::ConfigOptions;

    #[test]
    fn hand_computed_values_and_nulls() -> Result<()> {
        let column =
            |v: Vec<Option<f64>>| ColumnarValue::Array(Arc::new(Float64Array::from(v)) as ArrayRef);
        let args = ScalarFunctionArgs {
            args: vec![
                column(vec![Some(100.0), Some(200.0), None, Some(10.0)]),
                column(vec![Some(0.1), Some(0.0), Some(0.1), None]),
                column(vec![Some(0.05), Some(0.5), Some(0.1), Some(0.1)]),
            ],
            arg_fields: (0..3)
                .map(|i| Arc::new(Field::new(format!("a{i}"), DataType::Float64, true)))
                .collect(),
            number_rows: 4,
            return_field: Arc::new(Field::new("r", DataType::Float64, true)),
            config_options: Arc::new(ConfigOptions::default()),
        };
        let ColumnarValue::Array(result) = NetRevenue::default().invoke_with_args(args)? else {
            panic!("expected an array");
        };
        let result = as_float64_array(&result)?;
        // 100 * 0.9 * 1.05 = 94.5; 200 * 1.0 * 1.5 = 300; nulls propagate.
        assert!((result.value(0) - 94.5).abs() < 1e-9);
        assert!((result.value(1) - 300.0).abs() < 1e-9);
        assert!(result.is_null(2));
        assert!(result.is_null(3));
        Ok(())
    }
}
