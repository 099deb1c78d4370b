//! Downloading a repository by id, against a local stand-in for the Hugging Face
//! Hub: the two endpoints hf-hub's sync client uses (`/api/models/<id>/revision/<rev>`
//! and `/<id>/resolve/<rev>/<file>` with byte ranges, `ETag`, `X-Repo-Commit` and
//! `Content-Range` headers), serving tiny-zh's files. The download must land in
//! the Hugging Face cache layout, fetch only what a conversion reads, skip what
//! is cached, and convert to the same file as the local folder.

mod common;

use common::{fixtures, quantize};

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use memwall_convert::hub::download;
use memwall_convert::job::{Options, convert};
use memwall_convert::tensors::OutType;
use memwall_format::progress::Silent;
use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Serves `dir` as repository `org/tiny-zh` at revision `main`; counts file downloads.
fn serve(dir: PathBuf, files: Vec<String>, downloads: &'static AtomicUsize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_owned();
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(r) = lower.strip_prefix("range: bytes=") {
                    range = Some(r.trim().to_owned());
                }
            }
            let respond = |stream: &mut std::net::TcpStream,
                           status: &str,
                           headers: &str,
                           body: &[u8]| {
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(body);
            };
            if path == "/api/models/org/tiny-zh/revision/main" {
                let siblings: Vec<serde_json::Value> = files
                    .iter()
                    .map(|f| serde_json::json!({ "rfilename": f }))
                    .collect();
                let body = serde_json::json!({"sha": COMMIT, "siblings": siblings}).to_string();
                respond(
                    &mut stream,
                    "200 OK",
                    "Content-Type: application/json\r\n",
                    body.as_bytes(),
                );
            } else if let Some(file) = path.strip_prefix("/org/tiny-zh/resolve/main/") {
                let Ok(bytes) = std::fs::read(dir.join(file)) else {
                    respond(&mut stream, "404 Not Found", "", b"");
                    continue;
                };
                let etag = format!("{:x}", Sha256::digest(&bytes));
                let (start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
                    Some((a, b)) => {
                        let a: usize = a.parse().unwrap_or(0);
                        let b = b.parse().unwrap_or(bytes.len().saturating_sub(1));
                        (a, b.min(bytes.len().saturating_sub(1)))
                    }
                    None => (0, bytes.len().saturating_sub(1)),
                };
                // Metadata requests ask for byte 0 only; anything else fetches content.
                if range.as_deref() != Some("0-0") {
                    downloads.fetch_add(1, Ordering::SeqCst);
                }
                let headers = format!(
                    "ETag: \"{etag}\"\r\nX-Repo-Commit: {COMMIT}\r\nContent-Range: bytes {start}-{end}/{}\r\n",
                    bytes.len()
                );
                respond(
                    &mut stream,
                    "206 Partial Content",
                    &headers,
                    &bytes[start..=end],
                );
            } else {
                respond(&mut stream, "404 Not Found", "", b"");
            }
        }
    });
    format!("http://{addr}")
}

// The environment is process-wide: one test at a time touches it.
static ENV: Mutex<()> = Mutex::new(());

#[test]
fn downloads_into_the_cache_and_converts_like_the_folder() {
    static DOWNLOADS: AtomicUsize = AtomicUsize::new(0);
    let _env = ENV.lock().unwrap();
    let dir = fixtures().join("tiny-zh");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| !f.starts_with('.') && dir.join(f).is_file())
        .collect();
    files.sort();
    let wanted: Vec<&String> = files
        .iter()
        .filter(|f| memwall_convert::hub::wanted(f))
        .collect();
    assert!(
        files.iter().any(|f| f == "train.py"),
        "a file a conversion does not need"
    );
    let endpoint = serve(dir.clone(), files.clone(), &DOWNLOADS);
    let cache = tempfile::tempdir().unwrap();
    // SAFETY: set_var is unsafe in edition 2024 because other threads may read the
    // environment; tests touching it hold ENV, and no other test here reads these variables.
    unsafe {
        std::env::set_var("HF_ENDPOINT", &endpoint);
        std::env::set_var("HF_HUB_CACHE", cache.path());
        std::env::remove_var("HF_TOKEN");
    }
    let snapshot = download("org/tiny-zh", &Silent).unwrap();
    assert_eq!(
        snapshot,
        cache
            .path()
            .join("models--org--tiny-zh/snapshots")
            .join(COMMIT)
    );
    let mut got: Vec<String> = std::fs::read_dir(&snapshot)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    let want: Vec<String> = wanted.iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want, "only the files a conversion reads");
    for f in &want {
        assert_eq!(
            std::fs::read(snapshot.join(f)).unwrap(),
            std::fs::read(dir.join(f)).unwrap(),
            "{f}"
        );
    }
    // Cached now: resolved without the network, and a second download fetches nothing.
    assert_eq!(
        memwall_convert::hub::resolve("org/tiny-zh").unwrap(),
        snapshot
    );
    let before = DOWNLOADS.load(Ordering::SeqCst);
    assert_eq!(before, want.len(), "one content request per file");
    download("org/tiny-zh", &Silent).unwrap();
    assert_eq!(DOWNLOADS.load(Ordering::SeqCst), before);

    // The snapshot converts to the file the folder converts to, but for the name llama.cpp
    // takes from the folder (here the commit).
    let options = Options {
        outtype: OutType::F16,
        pre: Some("gpt-2".into()),
        encode: &quantize,
        allow_nonfinite: false,
        split_max_size: None,
        no_mtp: false,
    };
    let out = cache.path().join("a.gguf");
    convert(&snapshot, &out, &options, &Silent).unwrap();
    let theirs = memwall_format::gguf::GgufFile::open(
        &fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf"),
    )
    .unwrap();
    let ours = memwall_format::gguf::GgufFile::open(&out).unwrap();
    for t in theirs.tensors() {
        let o = ours.tensor(&t.name).unwrap();
        assert_eq!(ours.tensor_data(o), theirs.tensor_data(t), "{}", t.name);
    }
    for (k, v) in theirs.metadata().iter() {
        if !k.starts_with("general.") {
            assert_eq!(ours.metadata().get(k), Some(v), "{k}");
        }
    }
    // SAFETY: as above, under ENV.
    unsafe {
        std::env::remove_var("HF_ENDPOINT");
        std::env::remove_var("HF_HUB_CACHE");
    }
}
