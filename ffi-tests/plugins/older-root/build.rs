//! abi_stable records, in every type's layout, the package that declared it
//! (`CARGO_PKG_NAME` at compile time) and refuses a root module declared in
//! another package than the host's. This crate re-declares dfx-abi's root
//! module as another version of it, so it compiles under dfx-abi's name: only
//! the fields then differ, which is what the test is about.

fn main() {
    println!("cargo:rustc-env=CARGO_PKG_NAME=dfx-abi");
}
