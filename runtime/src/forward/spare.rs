//! Float buffers reused from layer to layer.

use super::*;

/// Float buffers handed back after use and handed out again, best fit first.
///
/// Every layer of a batch needs the same dozen buffers of up to a few
/// megabytes. Allocated fresh, each came from the system as new zero pages
/// and went back on free: 300 000 page faults in a 512-token SmolLM2 prompt,
/// 15 % of its time. Kept here, they are faulted in once.
#[derive(Default)]
pub(super) struct Spare(Mutex<Vec<Vec<f32>>>);

/// Buffers kept at most; the largest stay.
pub(super) const SPARE_BUFFERS: usize = 8;

impl Spare {
    /// `n` zeros, in the kept buffer that fits best (the largest, grown, when
    /// none holds `n`).
    pub(super) fn take(&self, n: usize) -> Vec<f32> {
        let mut v = self.take_dirty(n);
        v.fill(0.0);
        v
    }

    /// [`Spare::take`] without the zeros: `n` values left from earlier use,
    /// for a caller that writes every one.
    pub(super) fn take_dirty(&self, n: usize) -> Vec<f32> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let fits = (0..kept.len())
            .filter(|&i| kept[i].capacity() >= n)
            .min_by_key(|&i| kept[i].capacity());
        let largest = (0..kept.len()).max_by_key(|&i| kept[i].capacity());
        let mut v = fits
            .or(largest)
            .map(|i| kept.swap_remove(i))
            .unwrap_or_default();
        drop(kept);
        v.resize(n, 0.0);
        v
    }

    /// Lets every kept buffer go (after a forward pass: what a prompt needed
    /// is not held through the decoding that follows).
    pub(super) fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Keeps `v` for a later [`Spare::take`] (or drops the smallest buffer).
    pub(super) fn give(&self, v: Vec<f32>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(v);
        if kept.len() > SPARE_BUFFERS {
            if let Some(i) = (0..kept.len()).min_by_key(|&i| kept[i].capacity()) {
                kept.swap_remove(i);
            }
        }
    }
}
