//! What memwall does on the signals that end it early: Ctrl-C (SIGINT),
//! SIGTERM and SIGHUP, a mapped input that shrank under it (SIGBUS), and a
//! file-size limit (SIGXFSZ).
//!
//! Destructors do not run in a signal handler, so the unfinished outputs
//! (`<out>.partial` files and folders, scratch files) are listed in
//! [`memwall_format::cleanup`] while they exist and removed here before the
//! process exits. A handler makes only async-signal-safe calls (`write`,
//! `open`, `read`, `unlink`, `_exit`…): no allocation, no lock, no `std::io`.
//!
//! - SIGINT, SIGTERM, SIGHUP: remove the unfinished outputs, say so, exit with
//!   128 + the signal number (130, 143, 129). A signal that was ignored when
//!   memwall started (`nohup`, a background job) stays ignored.
//! - SIGBUS from a mapped file that got shorter (`BUS_ADRERR`): the access
//!   would crash the process ("Bus error (core dumped)"); instead the file is
//!   named (found in /proc/self/maps from the faulting address), the
//!   unfinished outputs are removed and memwall exits 1, as for any error.
//!   Any other SIGBUS removes the outputs and then takes its default action.
//! - SIGXFSZ is ignored: a write past `ulimit -f` then fails with EFBIG and
//!   takes the ordinary error path (partial file removed, the file named).
//! - SIGPIPE when standard output's reader has gone (`memwall plan … | head`):
//!   remove the unfinished outputs and exit quietly with 141, as a shell tool
//!   does, instead of failing to print. A broken pipe to anything else (the
//!   chat template's renderer) returns an error from the write as before.

use std::sync::atomic::{AtomicBool, Ordering};

use memwall_format::cleanup::remove_registered;

/// Whether standard error is a terminal (a progress bar may be on its line).
static STDERR_TTY: AtomicBool = AtomicBool::new(false);

/// Set by the first handler that runs: several threads may fault on the same
/// shrunk file at once, and one message is enough.
static HANDLING: AtomicBool = AtomicBool::new(false);

/// Lets the first handler through; any other waits for it to end the process.
fn first_handler() {
    if HANDLING.swap(true, Ordering::SeqCst) {
        loop {
            // SAFETY: pause only suspends this thread until a signal arrives.
            unsafe { libc::pause() };
        }
    }
}

/// Installs the handlers; call first thing in `main`, before any thread starts.
pub fn install() {
    // SAFETY: isatty only queries the descriptor.
    STDERR_TTY.store(unsafe { libc::isatty(2) } == 1, Ordering::Relaxed);
    // SAFETY: setting a disposition to SIG_IGN has no preconditions.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        if !ignored(signal) {
            set_handler(signal, on_terminate as extern "C" fn(_) as usize, 0);
        }
    }
    let on_bus: extern "C" fn(_, _, _) = on_bus;
    set_handler(libc::SIGBUS, on_bus as usize, libc::SA_SIGINFO);
    set_handler(libc::SIGPIPE, on_pipe as extern "C" fn(_) as usize, 0);
}

extern "C" fn on_pipe(_signal: libc::c_int) {
    // A pipe with no reader polls as an error; any other standard output
    // (a terminal, a file, a live pipe) does not.
    let mut fd = libc::pollfd {
        fd: 1,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll is async-signal-safe; one valid pollfd, no wait.
    let polled = unsafe { libc::poll(&mut fd, 1, 0) };
    if polled != 1 || fd.revents & libc::POLLERR == 0 {
        return;
    }
    first_handler();
    remove_registered();
    // SAFETY: as in `on_terminate`.
    unsafe { libc::_exit(128 + libc::SIGPIPE) }
}

/// Whether `signal` is ignored now (inherited from the parent).
fn ignored(signal: libc::c_int) -> bool {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action
    // only queries.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

fn set_handler(signal: libc::c_int, handler: usize, flags: libc::c_int) {
    // SAFETY: `handler` is an `extern "C"` function of the signature `flags`
    // announces (SA_SIGINFO or not); the other terminating signals are blocked
    // while it runs, so their messages do not interleave.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = flags;
        libc::sigemptyset(&mut action.sa_mask);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut action.sa_mask, s);
        }
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_terminate(signal: libc::c_int) {
    first_handler();
    let removed = remove_registered();
    if STDERR_TTY.load(Ordering::Relaxed) {
        say(b"\n");
    }
    say(match signal {
        libc::SIGINT => b"memwall: interrupted",
        libc::SIGTERM => b"memwall: terminated",
        _ => b"memwall: hung up",
    });
    if removed > 0 {
        say(b"; unfinished output files were removed");
    }
    say(b"\n");
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(128 + signal) }
}

extern "C" fn on_bus(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    first_handler();
    let removed = remove_registered();
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t; si_addr is
    // the faulting address for SIGBUS.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // SAFETY: as above (the address is only looked up on Linux and Android).
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let (code, addr) = (unsafe { (*info).si_code }, 0);
    if code != libc::BUS_ADRERR {
        // Not a shrunk file: the default action (a core dump) on return, which
        // re-executes the faulting instruction.
        // SAFETY: resetting a disposition is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        HANDLING.store(false, Ordering::SeqCst);
        return;
    }
    if STDERR_TTY.load(Ordering::Relaxed) {
        say(b"\n");
    }
    let mut path = [0u8; 4096];
    let n = mapped_file(addr, &mut path);
    say(b"memwall: error: ");
    say(if n > 0 { &path[..n] } else { b"an input file" });
    say(b" changed or shrank while it was being read (was it truncated or overwritten by another program?)");
    if removed > 0 {
        say(b"; unfinished output files were removed");
    } else {
        say(b"; no unfinished output was left");
    }
    say(b"\n");
    // SAFETY: as in `on_terminate`.
    unsafe { libc::_exit(1) }
}

/// Writes `bytes` to standard error, ignoring failures (async-signal-safe).
fn say(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for its length.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// Copies into `out` the path of the file mapped at `addr`, from
/// /proc/self/maps; its length (0 if not found). Async-signal-safe.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn mapped_file(addr: usize, out: &mut [u8; 4096]) -> usize {
    // SAFETY: the path is NUL-terminated.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 0;
    }
    let mut chunk = [0u8; 1024];
    let mut line = [0u8; 4096];
    let (mut len, mut found) = (0, 0);
    'read: loop {
        // SAFETY: `chunk` is writable for its length.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        for &b in &chunk[..n as usize] {
            if b != b'\n' {
                if len < line.len() {
                    line[len] = b;
                    len += 1;
                }
                continue;
            }
            if let Some(path) = path_if_maps(&line[..len], addr) {
                found = path.len().min(out.len());
                out[..found].copy_from_slice(&path[..found]);
                break 'read;
            }
            len = 0;
        }
    }
    // SAFETY: `fd` is open and not used after this.
    unsafe { libc::close(fd) };
    found
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn mapped_file(_addr: usize, _out: &mut [u8; 4096]) -> usize {
    0
}

/// The path of a /proc/self/maps line (`start-end perms offset dev inode
/// path`) if its range holds `addr` and it maps a file.
fn path_if_maps(line: &[u8], addr: usize) -> Option<&[u8]> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    if !(start <= addr && addr < end) {
        return None;
    }
    // perms, offset, dev, inode; then the path, which may hold spaces.
    let inode = fields.nth(3)?;
    let at = inode.as_ptr() as usize - line.as_ptr() as usize + inode.len();
    let path = line[at..].trim_ascii_start();
    (path.first() == Some(&b'/')).then_some(path)
}

fn hex(digits: &[u8]) -> Option<usize> {
    digits.iter().try_fold(0usize, |v, &d| {
        let d = (d as char).to_digit(16)?;
        v.checked_mul(16)?.checked_add(d as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_name_the_file_that_holds_the_address() {
        let line = b"7f0000001000-7f0000003000 r--s 00000000 fd:01 1234      /tmp/my model.gguf";
        assert_eq!(
            path_if_maps(line, 0x7f0000002fff),
            Some(&b"/tmp/my model.gguf"[..])
        );
        assert_eq!(path_if_maps(line, 0x7f0000003000), None);
        assert_eq!(
            path_if_maps(
                b"7ffd0000-7ffd1000 rw-p 00000000 00:00 0   [stack]",
                0x7ffd0001
            ),
            None
        );
        assert_eq!(
            path_if_maps(b"7ffd0000-7ffd1000 rw-p 00000000 00:00 0", 0x7ffd0001),
            None
        );
    }
}
