//! The manifest the router routes by: loaded at start, reloaded atomically
//! when the file changes. A file that does not parse or does not verify is
//! refused and the last good manifest stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use surety_manifest::Manifest;
use tokio::sync::watch;

#[derive(Debug)]
pub struct ManifestHolder {
    path: PathBuf,
    key: Option<ed25519_dalek::VerifyingKey>,
    current: RwLock<Option<Arc<Manifest>>>,
    /// Why the last reload was refused, if it was.
    refused: RwLock<Option<String>>,
    seen: RwLock<Option<(SystemTime, u64)>>,
    /// Counts reload attempts, refused or not, so callers can wait on one.
    reloads: watch::Sender<u64>,
}

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

fn write<T>(lock: &RwLock<T>, value: T) {
    *lock
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
}

impl ManifestHolder {
    pub fn new(path: &Path, key: Option<ed25519_dalek::VerifyingKey>) -> ManifestHolder {
        let (reloads, _) = watch::channel(0);
        ManifestHolder {
            path: path.to_path_buf(),
            key,
            current: RwLock::new(None),
            refused: RwLock::new(None),
            seen: RwLock::new(None),
            reloads,
        }
    }

    pub fn current(&self) -> Option<Arc<Manifest>> {
        read(&self.current)
    }

    pub fn refused(&self) -> Option<String> {
        read(&self.refused)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Reads the file again; keeps the last good manifest if it is refused.
    pub fn reload(&self) {
        // What is refused is said without the file's path (it is shown on
        // /readyz); the log has the path.
        let outcome = std::fs::read_to_string(&self.path)
            .map_err(|e| {
                tracing::warn!(path = %self.path.display(), error = %e, "the manifest cannot be read");
                format!("the manifest file cannot be read ({})", e.kind())
            })
            .and_then(|text| Manifest::parse(&text).map_err(|e| e.to_string()))
            .and_then(|manifest| match &self.key {
                Some(key) => manifest
                    .verify(key)
                    .map(|()| manifest)
                    .map_err(|e| e.to_string()),
                None => Ok(manifest),
            });
        match outcome {
            Ok(manifest) => {
                tracing::info!(entries = manifest.entries.len(), "manifest loaded");
                write(&self.current, Some(Arc::new(manifest)));
                write(&self.refused, None);
            }
            Err(reason) => {
                tracing::error!(%reason, "manifest refused; routing stays on the last good one");
                write(&self.refused, Some(reason));
            }
        }
        self.reloads.send_modify(|n| *n += 1);
    }

    /// Reloads when the file's modification time or size changed.
    pub fn reload_if_changed(&self) {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if stamp != read(&self.seen) {
            write(&self.seen, stamp);
            self.reload();
        }
    }
}
