//! GGUF reader: any input either fails with an error, or parses into a header
//! that the writer can write back; the rewrite parses to the same metadata
//! keys and types, tensor infos and tensor bytes, and rewriting it again is
//! byte-identical.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_format::gguf::{GgufFile, copy_gguf, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_vec("fuzz".as_ref(), data.to_vec()) else { return };
    let header = file.header();
    // Everything the reader accepts has valid names, shapes and alignment, so
    // the writer must accept it too.
    let copy = copy_gguf(&file, Vec::new(), "fuzz".as_ref(), 7).expect("a parsed file rewrites");
    let reparsed = parse(&copy).expect("the rewrite parses");
    assert_eq!(reparsed.metadata.len(), header.metadata.len());
    assert_eq!(reparsed.tensors.len(), header.tensors.len());
    for (a, b) in reparsed.tensors.iter().zip(&header.tensors) {
        assert_eq!((&a.name, &a.dims, a.ty, a.size), (&b.name, &b.dims, b.ty, b.size));
    }
    for ((ka, va), (kb, vb)) in reparsed.metadata.iter().zip(header.metadata.iter()) {
        assert_eq!(ka, kb);
        assert_eq!(va.value_type(), vb.value_type());
    }
    for t in &header.tensors {
        let original = file.tensor_data(t);
        let info = reparsed.tensors.iter().find(|r| r.name == t.name).expect("same names");
        let start = (reparsed.data_offset + info.offset) as usize;
        assert!(&copy[start..start + info.size as usize] == original, "tensor data changed");
    }
    // A second rewrite is byte-identical to the first.
    let file2 = GgufFile::from_vec("fuzz".as_ref(), copy.clone()).expect("the rewrite opens");
    let copy2 = copy_gguf(&file2, Vec::new(), "fuzz".as_ref(), 1 << 20).expect("rewrites again");
    assert!(copy2 == copy, "rewrite is not stable");
});
