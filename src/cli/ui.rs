//! The only code that looks at the terminal: progress bars on stderr, drawn only when stderr is
//! a terminal.

use std::path::Path;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// No progress bars from now on (`--quiet`).
pub fn quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Where bars are drawn: stderr (indicatif hides them when it is not a terminal), or nowhere.
fn target() -> ProgressDrawTarget {
    if QUIET.load(Ordering::Relaxed) {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// Files smaller than this load too fast for a progress bar to help.
const MIN_BYTES_FOR_BAR: u64 = 16 << 20;

/// A progress bar for reading one file; hidden when stderr is not a terminal.
pub struct LoadProgress {
    bar: Option<ProgressBar>,
}

impl LoadProgress {
    /// A bar for `path` (none for small files or when stderr is not a terminal).
    pub fn new(path: &Path) -> LoadProgress {
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if len < MIN_BYTES_FOR_BAR {
            return LoadProgress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(len), target());
        let style = ProgressStyle::with_template("{msg} {wide_bar} {bytes}/{total_bytes} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        LoadProgress { bar: Some(bar) }
    }

    /// The callback to give the loader.
    pub fn callback(&self) -> Option<Arc<dyn Fn(u64, u64) + Send + Sync>> {
        let bar = self.bar.clone()?;
        Some(Arc::new(move |read, _total| bar.set_position(read)))
    }
}

impl Drop for LoadProgress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A progress bar counting files (for `compare`); hidden when stderr is not a terminal.
pub struct FilesProgress {
    bar: ProgressBar,
}

impl FilesProgress {
    /// A bar for `n` files.
    pub fn new(n: u64) -> FilesProgress {
        let bar = ProgressBar::with_draw_target(Some(n), target());
        let style = ProgressStyle::with_template("reading snapshots {wide_bar} {pos}/{len} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        FilesProgress { bar }
    }

    /// One more file done.
    pub fn done_one(&self) {
        self.bar.inc(1);
    }
}

impl Drop for FilesProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
