//! `dfx_test_panic(x, at)`: returns `x`, and panics when a row's `x` equals
//! `at`. Compiled only with the `test-hooks` feature, never shipped: it lets
//! the ABI suite and the Python tests make a query panic inside the plugin
//! after it has produced rows, and check that the host gets an error and
//! survives (see [`crate::guard`]).

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::cast::as_int64_array;
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use crate::guard;

/// The function's SQL name.
pub const TEST_PANIC_NAME: &str = "dfx_test_panic";

/// Returns its first argument; panics on the row where it equals the second.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TestPanic {
    signature: Signature,
}

impl Default for TestPanic {
    fn default() -> Self {
        Self {
            // Volatile: the planner must not fold a constant call away before
            // the query runs.
            signature: Signature::uniform(2, vec![DataType::Int64], Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for TestPanic {
    fn name(&self) -> &str {
        TEST_PANIC_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        guard::catch(
            format_args!("the scalar function {TEST_PANIC_NAME}"),
            || invoke(args),
        )
    }
}

/// The function's body, behind the guard in `invoke_with_args`.
fn invoke(args: ScalarFunctionArgs) -> Result<ColumnarValue> {
    let [x, at] = args.args.as_slice() else {
        return exec_err!("{TEST_PANIC_NAME} takes (x, at)");
    };
    let at = match at {
        ColumnarValue::Scalar(ScalarValue::Int64(at)) => *at,
        ColumnarValue::Scalar(other) => {
            return exec_err!("{TEST_PANIC_NAME}: at is {other}");
        }
        ColumnarValue::Array(array) => {
            let array = as_int64_array(array)?;
            (!array.is_empty() && array.is_valid(0)).then(|| array.value(0))
        }
    };
    let x = x.to_array(args.number_rows)?;
    let values = as_int64_array(&x)?;
    if let Some(at) = at
        && values.iter().any(|v| v == Some(at))
    {
        panic!("{TEST_PANIC_NAME} met {at}, as the test asked");
    }
    let copy: Int64Array = values.iter().collect();
    Ok(ColumnarValue::Array(std::sync::Arc::new(copy)))
}
