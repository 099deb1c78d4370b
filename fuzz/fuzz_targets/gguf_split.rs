//! Split GGUF sets: the input is one byte (which file to open; bit 7 reads
//! instead of mapping), then up to eight files separated by `FUZZSPLIT`,
//! written as `m-0000i-of-0000n.gguf` into a fresh folder. Opening is either an
//! error, or a model whose tensor list is the files' own headers concatenated
//! in split order (so it matches `split.tensors.count` when present), whose
//! names are unique, and whose every tensor's data is a slice of the mapping
//! of the file that lists it.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use memwall_format::gguf::{GgufModel, LoadMode, keys, parse, split_path};

const SEPARATOR: &[u8] = b"FUZZSPLIT";

/// Splits on every occurrence of `SEPARATOR`.
fn chunks(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(i) = rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
        out.push(&rest[..i]);
        rest = &rest[i + SEPARATOR.len()..];
    }
    out.push(rest);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let files = chunks(data);
    if files.len() > 8 {
        return;
    }
    let n = files.len() as u32;
    let dir = std::path::Path::new("/dev/shm")
        .join(format!("memwall-fuzz-gguf_split-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let prefix = dir.join("m").to_string_lossy().into_owned();
    for (i, bytes) in (0..).zip(&files) {
        std::fs::write(split_path(&prefix, i, n), bytes).expect("write split file");
    }
    let open = u32::from(mode & 0x7f) % n;
    let load = if mode & 0x80 != 0 {
        LoadMode::Read
    } else {
        LoadMode::Mmap
    };
    if let Ok(model) = GgufModel::open_with(&split_path(&prefix, open, n), load) {
        check(&model, &files);
    }
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
});

fn check(model: &GgufModel, files: &[&[u8]]) {
    // The model's files are the set in split order, starting at 1 of n, and
    // each holds exactly the bytes written for it.
    let count = model.files().len();
    assert!(
        count == 1 || count == files.len(),
        "{count} files of {}",
        files.len()
    );
    for (f, file) in model.files().iter().enumerate() {
        let name = file
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let index: usize = name[2..7].parse().expect("split name");
        assert!(count == 1 || index == f + 1, "file {f} is {name}");
        assert!(
            file.bytes() == files[index - 1],
            "{name} is not the file written"
        );
    }
    // The tensor list is the concatenation of the files' own headers.
    let mut expected = Vec::new();
    for (f, file) in model.files().iter().enumerate() {
        let header = parse(file.bytes()).expect("a file of an opened model parses");
        expected.extend(header.tensors.into_iter().map(|t| (f, t)));
    }
    let got: Vec<_> = model.tensors().map(|(f, t)| (f, t.clone())).collect();
    assert_eq!(got, expected, "tensor list is not the union of the headers");
    if count > 1
        && let Some(total) = model
            .metadata()
            .get_u64(keys::SPLIT_TENSORS_COUNT)
            .ok()
            .flatten()
    {
        assert_eq!(total, got.len() as u64, "split.tensors.count disagrees");
    }
    let mut names = HashSet::new();
    for (f, info) in model.tensors() {
        assert!(
            names.insert(info.name.clone()),
            "tensor {} twice",
            info.name
        );
        let (found, data) = model.tensor(&info.name).expect("a listed tensor is found");
        assert_eq!(found, info);
        assert_eq!(data.len() as u64, info.size);
        let bytes = model.files()[f].bytes();
        let (base, start) = (bytes.as_ptr() as usize, data.as_ptr() as usize);
        assert!(
            start >= base && start + data.len() <= base + bytes.len(),
            "{} outside its file",
            info.name
        );
    }
}
