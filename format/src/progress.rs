//! Progress reporting. Libraries never print: long operations take a
//! `&dyn Progress` and the command-line tool renders it (a progress bar, or
//! nothing in `--json` mode). Every method has an empty default, so a caller
//! that does not care passes [`Silent`].

/// What the units of a stage count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes of data (rendered with rates such as MiB/s).
    Bytes,
    /// Whole items such as tensors or files.
    Items,
}

/// Receives progress from a long operation. Implementations must be cheap and
/// thread-safe: `advance` may be called from worker threads.
pub trait Progress: Sync {
    /// A stage of `total` units begins (`label` such as "quantizing").
    fn start(&self, label: &str, total: u64, unit: Unit) {
        let _ = (label, total, unit);
    }
    /// `n` more units are done.
    fn advance(&self, n: u64) {
        let _ = n;
    }
    /// The item now being worked on, such as a tensor name.
    fn item(&self, name: &str) {
        let _ = name;
    }
    /// Something the user should know that does not stop the work.
    fn warn(&self, message: &str) {
        let _ = message;
    }
    /// The current stage is over.
    fn finish(&self) {}
}

/// Progress that goes nowhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Progress for Silent {}
