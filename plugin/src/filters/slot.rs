//! A map's key summary while its rows go by: filled by the key summary
//! node as the writer polls it, taken by the writer at the end.

use std::sync::{Arc, Mutex};

use super::summary::{KeySummary, SummaryBuilder};

/// A map's summary while its rows go by: the writer takes it once it has
/// read its input to the end.
pub type SummarySlot = Arc<Mutex<Option<SummaryBuilder>>>;

/// The summary in `slot`, once the input has been read to the end.
pub fn finish(slot: &SummarySlot) -> Option<KeySummary> {
    let builder = slot.lock().ok()?.take()?;
    Some(builder.finish())
}
