//! `Limit::check`, `commit`, `acquire` and `acquire_charged` (one step for a
//! static line, in `u64` where the operands fit) held to the reference
//! model, the code they replaced (`reference`): the same outcome, charge
//! and state, call after call, for every algorithm, with and without a
//! queue, for limits whose products barely fit in 64 bits, states anywhere
//! (written by the calls, or any words, near `u64::MAX` too), costs
//! `0..=burst + 2` and beyond, and clocks near `MAX_NOW`, past it, and
//! stepping back. `overdraw` and `refund` are interleaved, and compared
//! too, for the states they leave. A varying line whose state is fresh or
//! already in its own scale must behave as the static line.
//!
//! What is where: `reference.rs` (and `reference/`), the previous code;
//! `props.rs`, the proptests (failures persist in
//! `props.proptest-regressions`, next to it).

mod props;
mod reference;
