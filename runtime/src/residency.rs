//! Memory residency: what the OS has free, pinning a model's pages in RAM
//! (`--mlock`, and the matrices streaming keeps resident), and how much this
//! process has read from storage.

use memwall_format::gguf::GgufModel;

/// Locks the pages of `data`, a slice of `model`'s bytes, in RAM.
pub fn lock_range(model: &GgufModel, data: &[u8]) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if model.locate(data).is_none() {
        return Err(std::io::Error::other("not this model's data"));
    }
    // SAFETY: `data` lies inside one of the model's live mappings or
    // allocations (checked above); mlock only pins its pages.
    let r = unsafe { libc::mlock(data.as_ptr().cast(), data.len()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Tells the OS that `data`, a slice of `model`'s mapping, is read at random
/// (`MADV_RANDOM`): a page fault then reads its own page and not the
/// read-ahead window around it (8 MiB on some disks), which a streamed token
/// would pay for every embedding row it looks up. Advice only: errors are
/// ignored.
pub fn advise_random(model: &GgufModel, data: &[u8]) {
    if data.is_empty() || !model.is_mapped() || model.locate(data).is_none() {
        return;
    }
    // SAFETY: sysconf reads a constant of the system.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1);
    let start = data.as_ptr() as usize / page * page;
    let end = data.as_ptr() as usize + data.len();
    // SAFETY: the page-aligned range covers `data`, which lies inside one of
    // the model's live mappings (checked above; mappings start on a page);
    // madvise changes no memory, only how the kernel reads it in.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_RANDOM) };
}

/// Locks every file of `model` in RAM (`--mlock`): pages are read now and
/// never swapped or dropped. Returns the bytes locked. Fails (nothing stays
/// locked) when the OS refuses, typically past `RLIMIT_MEMLOCK`.
pub fn lock_model(model: &GgufModel) -> std::io::Result<u64> {
    let mut locked: Vec<&[u8]> = Vec::new();
    for f in model.files() {
        if let Err(err) = lock_range(model, f.bytes()) {
            for b in locked {
                // SAFETY: the same ranges were locked above and are still valid.
                unsafe { libc::munlock(b.as_ptr().cast(), b.len()) };
            }
            return Err(err);
        }
        locked.push(f.bytes());
    }
    Ok(locked.iter().map(|b| b.len() as u64).sum())
}

/// Bytes of memory the OS reports as available (`MemAvailable` of
/// `/proc/meminfo`), when it reports it.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes this process has read from storage (`read_bytes` of
/// `/proc/self/io`: reads that reached the device, not the page cache), when
/// the OS reports it.
pub fn storage_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    let line = text.lines().find(|l| l.starts_with("read_bytes:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
