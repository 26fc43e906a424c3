//! Live template editing: the set a running process sends with, swapped atomically when the
//! directory changes (docs/OPERATING.md, "Templates": a broken edit is rejected and the last
//! good set keeps sending).
//!
//! [`LiveTemplates::watch`] polls a fingerprint of the directory (every file's path and bytes)
//! every `--template-reload-interval`, and reloads at once on [`LiveTemplates::request_reload`]
//! (SIGHUP). Polling rather than inotify: a Kubernetes ConfigMap update swaps a `..data`
//! symlink, which inotify on the visible files does not report, while a fingerprint read through
//! the links sees it. A template directory is a few kilobytes, so reading it every two seconds is
//! cheap. Each delivery takes one [`LiveTemplates::current`] snapshot and renders with it, so an
//! email never mixes two revisions.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Templates, file};

/// The template set in use, and the directory it is reloaded from.
#[derive(Debug)]
pub struct LiveTemplates {
    dir: Option<PathBuf>,
    current: RwLock<Arc<Templates>>,
    /// Fingerprint of the directory as last examined, good or broken: a broken state is
    /// reported once, not on every tick.
    seen: Mutex<Option<u64>>,
    reload: Notify,
    /// Reloads that changed the revision in use.
    pub reloads_ok: AtomicU64,
    /// Edits rejected (each distinct broken state counts once).
    pub reloads_failed: AtomicU64,
}

impl LiveTemplates {
    /// A set that follows `dir`; `initial` was loaded from it.
    pub fn new(dir: PathBuf, initial: Templates) -> LiveTemplates {
        let seen = fingerprint(&dir).ok();
        LiveTemplates {
            dir: Some(dir),
            seen: Mutex::new(seen),
            ..LiveTemplates::fixed(initial)
        }
    }

    /// A set that never changes (tests, tools).
    pub fn fixed(templates: Templates) -> LiveTemplates {
        LiveTemplates {
            dir: None,
            current: RwLock::new(Arc::new(templates)),
            seen: Mutex::new(None),
            reload: Notify::new(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        }
    }

    /// The directory this set follows (`None` for a fixed set).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The set to render one delivery with.
    pub fn current(&self) -> Arc<Templates> {
        // A poisoned lock only means a panic elsewhere while swapping an Arc: the value is whole.
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Asks the watcher to reload now, changed or not (SIGHUP).
    pub fn request_reload(&self) {
        self.reload.notify_one();
    }

    /// Polls the directory every `interval` until `shutdown`, swapping in good edits.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        if self.dir.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(50)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => false,
                _ = self.reload.notified() => true,
            };
            let this = self.clone();
            // Reading and compiling the set is blocking work; keep it off the async workers.
            let _ = tokio::task::spawn_blocking(move || this.check(forced)).await;
        }
    }

    /// Reloads when the fingerprint changed (or `forced`); returns whether a new set is in use.
    pub fn check(&self, forced: bool) -> bool {
        let Some(dir) = &self.dir else { return false };
        crate::failpoint::hit_blocking("templates.check");
        let print = match fingerprint(dir) {
            Ok(p) => p,
            Err(e) => {
                // Mid-swap or unmounted: say so once, keep sending with what we have.
                if self.saw(u64::MAX) || forced {
                    self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(dir = %dir.display(), error = %e, "cannot read the template directory; still sending with revision {}", self.current().revision());
                }
                return false;
            }
        };
        if !self.saw(print) && !forced {
            return false;
        }
        self.reload(dir)
    }

    /// Records `print` as examined; true when it differs from the last one.
    fn saw(&self, print: u64) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *seen != Some(print);
        *seen = Some(print);
        changed
    }

    fn reload(&self, dir: &Path) -> bool {
        let old = self.current();
        match Templates::load(dir) {
            Ok(new) if new.revision() == old.revision() => false,
            Ok(new) => {
                tracing::info!(
                    old = old.revision(),
                    new = new.revision(),
                    "templates reloaded"
                );
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
                self.reloads_ok.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    error = %e,
                    revision = old.revision(),
                    "template edit rejected; still sending with the last good set"
                );
                false
            }
        }
    }
}

/// A hash of every visible file under `dir` (path and content), following symlinks. A file the
/// loader would refuse unread (a FIFO, a device, one too large: [`file`]) counts by its kind,
/// size and time instead: its change is seen, and it never blocks nor fills the check.
fn fingerprint(dir: &Path) -> std::io::Result<u64> {
    let mut files = Vec::new();
    collect(dir, dir, true, &mut files)?;
    files.sort();
    let mut hasher = DefaultHasher::new();
    for (rel, path) in files {
        rel.hash(&mut hasher);
        file::identity(&path)?.hash(&mut hasher);
    }
    Ok(hasher.finish())
}

/// The visible entries of `dir`, and of its folders when `descend` (the top's: kind folders,
/// `layouts/`, `partials/`). A deeper folder is the loader's error and counts by its path alone:
/// followed, a symlink loop there made the walk endless.
fn collect(
    root: &Path,
    dir: &Path,
    descend: bool,
    out: &mut Vec<(String, PathBuf)>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Hidden entries are skipped as the loader skips them (ConfigMap `..data` included).
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if descend && path.is_dir() {
            collect(root, &path, false, out)?;
        } else {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push((rel.to_string_lossy().into_owned(), path));
        }
    }
    Ok(())
}
