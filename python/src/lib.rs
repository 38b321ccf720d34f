//! `dfx_engine._internal`: the dfx plugin file, seen from datafusion-python.
