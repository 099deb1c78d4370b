//! Renders library progress on the terminal with indicatif: a bar with bytes,
//! rate and ETA for long stages, the current item as its message. Hidden when
//! stderr is not a terminal or in `--json` mode; warnings go to stderr above it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memwall_format::progress::{Progress, Unit};

/// A progress bar on stderr.
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A bar that draws when `visible` and stderr is a terminal.
    pub fn new(visible: bool) -> Bar {
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Bar {
            bar: ProgressBar::with_draw_target(None, target),
        }
    }
}

impl Progress for Bar {
    fn start(&self, label: &str, total: u64, unit: Unit) {
        let template = match unit {
            Unit::Bytes => {
                "{prefix:>11} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {wide_msg}"
            }
            Unit::Items => "{prefix:>11} [{bar:30}] {pos}/{len} ETA {eta} {wide_msg}",
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            self.bar.set_style(style.progress_chars("=> "));
        }
        self.bar.set_prefix(label.to_owned());
        self.bar.set_length(total);
        self.bar.set_position(0);
    }

    fn advance(&self, n: u64) {
        self.bar.inc(n);
    }

    fn item(&self, name: &str) {
        self.bar.set_message(name.to_owned());
    }

    fn warn(&self, message: &str) {
        self.bar.suspend(|| eprintln!("warning: {message}"));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
