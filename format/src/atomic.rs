//! Atomic output files: write to `<out>.partial`, fsync, rename.
//!
//! **Invariant:** a memwall output path either does not exist, holds what was
//! there before, or holds a complete file. Every writer in memwall goes through
//! [`AtomicFile`].
//!
//! The partial file is removed on every error (of a write, the flush, the
//! fsync or the rename) and when the `AtomicFile` is dropped uncommitted; while
//! it exists it is also listed in [`crate::cleanup`], so that the binary's
//! signal handlers remove it on Ctrl-C, SIGTERM or SIGBUS. Only SIGKILL (or a
//! power cut) can leave one behind, and the next write of the same output
//! replaces it.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::cleanup::{Registration, register_file};
use crate::direct::DirectWriter;

/// A file being written at `<path>.partial`; see the module docs.
///
/// Dropping it without [`AtomicFile::commit`] removes the partial file.
pub struct AtomicFile {
    path: PathBuf,
    partial: PathBuf,
    file: Option<Sink>,
    /// Lists `partial` for the signal handlers while it exists; declared after
    /// `file`, so the file is closed (and removed) before it is unlisted.
    _listed: Registration,
}

/// Where the bytes go: through the page cache, or around it for large files.
enum Sink {
    Buffered(BufWriter<File>),
    Direct(DirectWriter),
}

impl Sink {
    fn out(&mut self) -> &mut dyn Write {
        match self {
            Sink::Buffered(w) => w,
            Sink::Direct(w) => w,
        }
    }
}

impl AtomicFile {
    /// The temporary path used for `path`: the same name with `.partial` appended.
    pub fn partial_path_for(path: &Path) -> PathBuf {
        let mut name = OsString::from(path.as_os_str());
        name.push(".partial");
        PathBuf::from(name)
    }

    /// Creates (or truncates) `<path>.partial` in the directory of `path`.
    pub fn create(path: &Path) -> io::Result<Self> {
        let partial = Self::partial_path_for(path);
        // Listed before it exists: a signal in between finds nothing to remove.
        let listed = register_file(&partial);
        let file = File::create(&partial)?;
        Ok(AtomicFile {
            path: path.to_owned(),
            partial,
            file: Some(Sink::Buffered(BufWriter::with_capacity(1 << 20, file))),
            _listed: listed,
        })
    }

    /// Like [`AtomicFile::create`], for a large file written once: bytes bypass
    /// the page cache where the system allows ([`DirectWriter`]).
    pub fn create_large(path: &Path) -> io::Result<Self> {
        let partial = Self::partial_path_for(path);
        let listed = register_file(&partial);
        let writer = DirectWriter::create(&partial)?;
        Ok(AtomicFile {
            path: path.to_owned(),
            partial,
            file: Some(Sink::Direct(writer)),
            _listed: listed,
        })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path being written.
    pub fn partial_path(&self) -> &Path {
        &self.partial
    }

    /// Flushes, fsyncs, renames `<path>.partial` to `path` and fsyncs the
    /// directory, so that the rename survives a crash. On an error before the
    /// rename (a full disk usually shows up here, in the last flush), the
    /// partial file is removed.
    pub fn commit(mut self) -> io::Result<()> {
        let sink = self.file.take().ok_or_else(closed)?;
        let finished = finish(sink).and_then(|()| fs::rename(&self.partial, &self.path));
        if let Err(e) = finished {
            let _ = fs::remove_file(&self.partial);
            return Err(e);
        }
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    }
}

/// Writes what is buffered, fsyncs and closes the file.
fn finish(sink: Sink) -> io::Result<()> {
    let file = match sink {
        Sink::Buffered(w) => {
            // On error, the writer inside the error is dropped without flushing again.
            w.into_inner().map_err(|e| {
                let (error, w) = e.into_parts();
                drop(w.into_parts());
                error
            })?
        }
        Sink::Direct(w) => w.finish()?,
    };
    file.sync_all()
}

/// The error of a write after `commit` (which consumes the file, so only a
/// `Write` borrowed before it could see this).
fn closed() -> io::Error {
    io::Error::other("the output file was already committed")
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.as_mut().ok_or_else(closed)?.out().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.as_mut().ok_or_else(closed)?.out().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().ok_or_else(closed)?.out().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(sink) = self.file.take() {
            // Unwritten buffered bytes are worthless now; drop without flushing errors.
            if let Sink::Buffered(writer) = sink {
                let (file, _) = writer.into_parts();
                drop(file);
            }
            let _ = fs::remove_file(&self.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_renames_and_drop_removes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model.gguf");

        let mut f = AtomicFile::create(&out).unwrap();
        f.write_all(b"hello").unwrap();
        assert!(dir.path().join("model.gguf.partial").exists());
        assert!(!out.exists());
        f.commit().unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"hello");
        assert!(!dir.path().join("model.gguf.partial").exists());

        let mut f = AtomicFile::create(&out).unwrap();
        f.write_all(b"half").unwrap();
        drop(f);
        let mut f = AtomicFile::create_large(&out).unwrap();
        f.write_all(&[7u8; 10_000]).unwrap();
        drop(f);
        assert_eq!(
            fs::read(&out).unwrap(),
            b"hello",
            "previous file left intact"
        );
        assert!(!dir.path().join("model.gguf.partial").exists());
    }

    #[test]
    fn a_failed_commit_removes_the_partial_file() {
        // The rename fails: the final path is a folder that is not empty.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model.gguf");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("x"), b"x").unwrap();
        for large in [false, true] {
            let mut f = if large {
                AtomicFile::create_large(&out).unwrap()
            } else {
                AtomicFile::create(&out).unwrap()
            };
            f.write_all(b"data").unwrap();
            assert!(f.commit().is_err());
            assert!(!dir.path().join("model.gguf.partial").exists());
        }
    }

    #[test]
    fn missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = AtomicFile::create(&dir.path().join("no/such/dir/x.gguf"))
            .err()
            .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
