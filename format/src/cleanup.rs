//! Unfinished outputs to remove when the process dies of a signal.
//!
//! An [`AtomicFile`](crate::atomic::AtomicFile)'s `<out>.partial`, an export's
//! partial folder or a scratch file goes away when its owner is dropped; a
//! signal handler runs no destructors. So each one is also listed here while it
//! exists ([`register_file`], [`register_dir`]), and the binary's handlers for
//! SIGINT, SIGTERM and SIGBUS call [`remove_registered`] before exiting.
//!
//! **Invariant:** [`remove_registered`] makes only async-signal-safe system
//! calls (`unlink`, `open`, `getdents64`, `unlinkat`, `rmdir`, `close`) and
//! allocates nothing: the paths are C strings built when they were registered.
//! The list is a fixed array of atomic pointers, so a handler never waits for
//! a lock that the interrupted thread holds.

use std::ffi::CString;
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// Paths listed at once. More is possible (a split model's shards, a
/// comparison's cache) but rare; an entry that finds no free slot is simply
/// not removed by a signal (its owner's `Drop` still removes it).
const SLOTS: usize = 64;

/// A registered path.
struct Entry {
    path: CString,
    /// A folder of files (an export's `<out>.partial`), removed with its files.
    dir: bool,
}

static ENTRIES: [AtomicPtr<Entry>; SLOTS] = [const { AtomicPtr::new(ptr::null_mut()) }; SLOTS];

/// Set by [`remove_registered`] before it reads the list: from then on an
/// entry taken out of the list is leaked rather than freed, since the handler
/// may be reading it.
static REMOVING: AtomicBool = AtomicBool::new(false);

/// A path listed for removal by [`remove_registered`]; dropping it takes the
/// path off the list (without touching the file).
#[must_use = "the path is unlisted as soon as the registration is dropped"]
pub struct Registration {
    slot: Option<usize>,
}

/// Lists the file `path` for removal if the process dies of a signal.
pub fn register_file(path: &Path) -> Registration {
    register(path, false)
}

/// Lists the folder `path` (and the files directly in it) for removal if the
/// process dies of a signal.
pub fn register_dir(path: &Path) -> Registration {
    register(path, true)
}

/// A scratch file `<prefix><pid><suffix>` in a folder: listed for the
/// signal handlers while it exists, removed (with its `.partial`) when
/// dropped. Creating one first removes the scratch files of the same name
/// left by memwall processes that are no longer running (killed with
/// SIGKILL, which no handler sees).
pub struct ScratchFile {
    path: std::path::PathBuf,
    _listed: Registration,
}

impl ScratchFile {
    /// The scratch file of this process in `dir` (not created yet).
    pub fn new(dir: &Path, prefix: &str, suffix: &str) -> ScratchFile {
        remove_stale(dir, prefix, suffix);
        let path = dir.join(format!("{prefix}{}{suffix}", std::process::id()));
        let listed = register_file(&path);
        ScratchFile {
            path,
            _listed: listed,
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(crate::atomic::AtomicFile::partial_path_for(&self.path));
    }
}

/// Removes the scratch files `<prefix><pid><suffix>` in `dir` (and their
/// `.partial`) that belong to a process no longer running.
pub fn remove_stale(dir: &Path, prefix: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let name_without_partial = name.strip_suffix(".partial").unwrap_or(name);
        let pid = name_without_partial
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .and_then(|pid| pid.parse::<libc::pid_t>().ok());
        let Some(pid) = pid.filter(|&p| p > 0 && p != std::process::id() as libc::pid_t) else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn register(path: &Path, dir: bool) -> Registration {
    let Some(path) = c_path(path) else {
        return Registration { slot: None };
    };
    let entry = Box::into_raw(Box::new(Entry { path, dir }));
    for (i, slot) in ENTRIES.iter().enumerate() {
        if slot
            .compare_exchange(ptr::null_mut(), entry, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Registration { slot: Some(i) };
        }
    }
    // SAFETY: `entry` came from `Box::into_raw` above and was published nowhere.
    drop(unsafe { Box::from_raw(entry) });
    Registration { slot: None }
}

/// `path` as a C string (`None` for a path with a NUL byte, which cannot have
/// been created either).
#[cfg(unix)]
fn c_path(path: &Path) -> Option<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).ok()
}

#[cfg(not(unix))]
fn c_path(_path: &Path) -> Option<CString> {
    None
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(i) = self.slot else { return };
        let entry = ENTRIES[i].swap(ptr::null_mut(), Ordering::SeqCst);
        // A handler that started before the swap may still read the entry; one
        // that starts after it cannot see it. The process exits right after a
        // handler, so leaking is free.
        if !entry.is_null() && !REMOVING.load(Ordering::SeqCst) {
            // SAFETY: the entry came from `Box::into_raw` in `register`; the swap
            // took the only published pointer to it and no handler is reading it.
            drop(unsafe { Box::from_raw(entry) });
        }
    }
}

/// Removes every registered path (a folder with the files directly in it);
/// returns how many existed. Async-signal-safe: meant for signal handlers,
/// after which the process must exit (entries are not unlisted).
pub fn remove_registered() -> usize {
    REMOVING.store(true, Ordering::SeqCst);
    let mut removed = 0;
    for slot in &ENTRIES {
        let entry = slot.load(Ordering::SeqCst);
        if !entry.is_null() {
            // SAFETY: a published entry is freed only while REMOVING is false, and
            // it was set (SeqCst) before this load.
            removed += usize::from(remove(unsafe { &*entry }));
        }
    }
    removed
}

/// Removes one entry's file or folder; whether it existed.
fn remove(entry: &Entry) -> bool {
    let path = entry.path.as_ptr();
    if entry.dir {
        empty_dir(path);
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        unsafe { libc::rmdir(path) == 0 }
    } else {
        // SAFETY: as above.
        unsafe { libc::unlink(path) == 0 }
    }
}

/// Unlinks the files directly in the folder `path` (exports write no subfolders).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn empty_dir(path: *const libc::c_char) {
    // SAFETY: `path` is NUL-terminated; open has no other preconditions.
    let fd = unsafe { libc::open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    // u64s for the alignment of `linux_dirent64`.
    let mut buf = [0u64; 512];
    // Passes over the folder until one removes nothing: removing entries while
    // reading it may make the reading skip some.
    for _ in 0..8 {
        // SAFETY: `fd` is an open folder.
        unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
        if empty_pass(fd, &mut buf) == 0 {
            break;
        }
    }
    // SAFETY: `fd` is open and not used after this.
    unsafe { libc::close(fd) };
}

/// Unlinks what one reading of the open folder `fd` lists; how many.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn empty_pass(fd: libc::c_int, buf: &mut [u64; 512]) -> usize {
    let mut unlinked = 0;
    loop {
        // SAFETY: `buf` is writable for its whole size, which is passed.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                buf.as_mut_ptr(),
                std::mem::size_of_val(buf),
            )
        };
        if n <= 0 {
            break;
        }
        let bytes = buf.as_ptr().cast::<u8>();
        let mut at = 0usize;
        while at < n as usize {
            // linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
            // SAFETY: the kernel wrote `n` bytes of whole records into `buf`;
            // d_reclen (offset 16) is within the record, which is within `n`.
            let reclen = unsafe { bytes.add(at + 16).cast::<u16>().read_unaligned() } as usize;
            // SAFETY: d_name (offset 19) is NUL-terminated within the record.
            let name = unsafe { bytes.add(at + 19) }.cast::<libc::c_char>();
            // SAFETY: `name` is NUL-terminated (above).
            let dots = unsafe {
                *name == b'.' as libc::c_char
                    && (*name.add(1) == 0
                        || (*name.add(1) == b'.' as libc::c_char && *name.add(2) == 0))
            };
            // SAFETY: `fd` is an open folder and `name` a NUL-terminated entry of it.
            if !dots && unsafe { libc::unlinkat(fd, name, 0) } == 0 {
                unlinked += 1;
            }
            if reclen == 0 {
                break;
            }
            at += reclen;
        }
    }
    unlinked
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn empty_dir(_path: *const libc::c_char) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_file_is_listed_while_it_lives_and_stale_ones_of_dead_processes_go() {
        let dir = tempfile::tempdir().unwrap();
        // A process id that no running process has: far above pid_max.
        let dead = dir.path().join("memwall-test-2147483000.kld");
        let other = dir.path().join("memwall-test-notapid.kld");
        std::fs::write(&dead, b"x").unwrap();
        std::fs::write(&other, b"x").unwrap();
        let scratch = ScratchFile::new(dir.path(), "memwall-test-", ".kld");
        assert!(!dead.exists(), "a dead process's scratch file is removed");
        assert!(other.exists(), "names that are not scratch files are left");
        assert_eq!(
            scratch.path(),
            dir.path()
                .join(format!("memwall-test-{}.kld", std::process::id()))
        );
        std::fs::write(scratch.path(), b"logits").unwrap();
        let path = scratch.path().to_owned();
        drop(scratch);
        assert!(!path.exists(), "dropped, the scratch file is removed");
    }

    #[test]
    fn registered_paths_are_removed_and_unlisted_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.partial");
        let folder = dir.path().join("hf.partial");
        let kept = dir.path().join("kept.partial");
        std::fs::write(&file, b"x").unwrap();
        std::fs::create_dir(&folder).unwrap();
        for i in 0..300 {
            std::fs::write(folder.join(format!("shard-{i}.safetensors")), b"y").unwrap();
        }
        std::fs::write(&kept, b"z").unwrap();
        // Not `remove_registered`: other tests' partial files are listed too.
        let listed = |r: &Registration| {
            let entry = ENTRIES[r.slot.unwrap()].load(Ordering::SeqCst);
            // SAFETY: `r` is alive, so its entry is listed and not freed.
            remove(unsafe { &*entry })
        };
        let (a, b) = (register_file(&file), register_dir(&folder));
        assert!(listed(&a) && listed(&b));
        assert!(!file.exists() && !folder.exists());
        assert!(!listed(&a), "already gone");
        drop(register_file(&kept));
        assert!(kept.exists(), "unlisting leaves the file");
    }
}
