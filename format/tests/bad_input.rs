//! Hostile and broken GGUF files: each case asserts the specific error, and
//! that the reader returns it rather than panicking or allocating wildly.

mod common;

use common::Raw;
use memwall_format::ggml_type::{GgmlType, ShapeError, TypeIdError};
use memwall_format::gguf::{
    Array, FormatError, FormatErrorKind as K, GgufError, GgufFile, GgufWriter, Metadata,
    TensorSpec, ValueType, parse,
};

fn kind(bytes: &[u8]) -> K {
    parse(bytes)
        .expect_err("the reader accepted a broken file")
        .kind
}

/// A valid file that uses every value type, a nested array and two tensors.
fn valid_file() -> Vec<u8> {
    let mut m = Metadata::new();
    m.set("general.architecture", "llama");
    m.set("t.u8", 1u8);
    m.set("t.i8", -1i8);
    m.set("t.u16", 2u16);
    m.set("t.i16", -2i16);
    m.set("t.u32", 3u32);
    m.set("t.i32", -3i32);
    m.set("t.f32", 0.5f32);
    m.set("t.bool", true);
    m.set("t.u64", 4u64);
    m.set("t.i64", -4i64);
    m.set("t.f64", 0.25f64);
    m.set("t.strings", Array::String(vec!["a".into(), "bc".into()]));
    m.set(
        "t.nested",
        Array::Array(vec![
            Array::U32(vec![1, 2]),
            Array::String(vec!["x".into()]),
        ]),
    );
    let tensors = vec![
        TensorSpec {
            name: "a".into(),
            dims: vec![32, 2],
            ty: GgmlType::Q8_0,
        },
        TensorSpec {
            name: "b".into(),
            dims: vec![3],
            ty: GgmlType::F32,
        },
    ];
    let mut w = GgufWriter::new(Vec::new(), "valid".as_ref(), 3, m, tensors).unwrap();
    w.write_tensor("a", &[7u8; 68]).unwrap();
    w.write_tensor("b", &[1u8; 12]).unwrap();
    w.finish().unwrap()
}

#[test]
fn the_valid_file_parses() {
    let bytes = valid_file();
    let h = parse(&bytes).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.metadata.len(), 14);
}

/// Truncation at every byte: inside the header the error is a truncation (or a
/// count/length that no longer fits what is left); inside the data section it
/// names the tensor whose data is cut.
#[test]
fn truncation_at_every_byte_is_an_error() {
    let bytes = valid_file();
    let h = parse(&bytes).unwrap();
    let data_offset = h.data_offset as usize;
    let data_end =
        data_offset + h.tensors.iter().map(|t| t.offset + t.size).max().unwrap() as usize;
    assert!(data_end < bytes.len(), "the file ends with padding");
    for len in data_end..bytes.len() {
        // Only the padding after the last tensor is cut: still a complete file.
        parse(&bytes[..len]).expect("cutting trailing padding loses nothing");
    }
    for len in 0..data_end {
        let err = parse(&bytes[..len]).expect_err("truncated file accepted");
        if len < data_offset {
            assert!(
                matches!(
                    err.kind,
                    K::Truncated { .. }
                        | K::CountTooLarge { .. }
                        | K::StringTooLong { .. }
                        | K::ArrayTooLong { .. }
                ),
                "cut at {len}: {err}"
            );
        } else {
            assert!(
                matches!(err.kind, K::TensorPastEof { .. }),
                "cut at {len}: {err}"
            );
        }
    }
}

#[test]
fn truncation_at_section_boundaries_names_what_is_cut() {
    let bytes = valid_file();
    let cases: [(usize, &str); 4] = [
        (0, "the magic number"),
        (4, "the version"),
        (8, "the tensor count"),
        (16, "the metadata key count"),
    ];
    for (len, what) in cases {
        match kind(&bytes[..len]) {
            K::Truncated { what: w, .. } => assert_eq!(w, what),
            other => panic!("cut at {len}: {other}"),
        }
    }
    // Cut in the middle of a value.
    let mut r = Raw::header(3, 0, 1);
    r.kv_str("general.architecture", "llama");
    let bytes = r.build();
    assert_eq!(
        kind(&bytes[..bytes.len() - 3]),
        K::StringTooLong {
            what: "the value of metadata key 'general.architecture'".into(),
            len: 5,
            available: 2
        }
    );
}

#[test]
fn bad_magic() {
    let mut bytes = valid_file();
    bytes[..4].copy_from_slice(b"GGML");
    assert_eq!(kind(&bytes), K::BadMagic(*b"GGML"));
    let err = GgufFile::from_vec("x.bin".as_ref(), bytes).err().unwrap();
    assert!(
        err.to_string()
            .starts_with("x.bin: not a valid GGUF file: at byte 0: bad magic")
    );
}

#[test]
fn versions_1_and_4_and_big_endian() {
    for version in [0u32, 1, 4, 3 << 24] {
        let mut bytes = valid_file();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        match kind(&bytes) {
            K::UnsupportedVersion { version: v, hint } => {
                assert_eq!(v, version);
                if version == 3 << 24 {
                    assert!(hint.contains("big-endian"), "{hint}");
                }
            }
            other => panic!("version {version}: {other}"),
        }
    }
    let mut v2 = valid_file();
    v2[4] = 2;
    assert_eq!(parse(&v2).unwrap().version, 2);
}

#[test]
fn counts_larger_than_the_file() {
    let bytes = Raw::header(3, 0, 1 << 40).build();
    assert!(
        matches!(kind(&bytes), K::CountTooLarge { what: "metadata key", count, max: 0 } if count == 1 << 40)
    );
    let bytes = Raw::header(3, u64::MAX, 0).build();
    assert!(matches!(
        kind(&bytes),
        K::CountTooLarge { what: "tensor", .. }
    ));
    // Room for one tensor info (24 bytes) but two are claimed.
    let bytes = Raw::header(3, 2, 0).zeros(30).build();
    assert_eq!(
        kind(&bytes),
        K::CountTooLarge {
            what: "tensor",
            count: 2,
            max: 1
        }
    );
}

#[test]
fn string_length_past_eof() {
    let bytes = Raw::header(3, 0, 1)
        .u64(1 << 62)
        .bytes(b"general.x")
        .zeros(8)
        .build();
    assert_eq!(
        kind(&bytes),
        K::StringTooLong {
            what: "metadata key #0".into(),
            len: 1 << 62,
            available: 17
        }
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k")
        .u32(ValueType::String as u32)
        .u64(u64::MAX)
        .bytes(b"abc");
    assert!(matches!(
        kind(&r.build()),
        K::StringTooLong {
            len: u64::MAX,
            available: 3,
            ..
        }
    ));
}

#[test]
fn array_of_2_pow_60_elements() {
    for elem in [
        ValueType::U8,
        ValueType::U64,
        ValueType::String,
        ValueType::Array,
    ] {
        let mut r = Raw::header(3, 0, 1);
        r.str(b"huge")
            .u32(ValueType::Array as u32)
            .u32(elem as u32)
            .u64(1 << 60)
            .zeros(64);
        match kind(&r.build()) {
            K::ArrayTooLong {
                key,
                count,
                element_type,
                available,
                ..
            } => {
                assert_eq!(
                    (key.as_str(), count, element_type, available),
                    ("huge", 1 << 60, elem, 64)
                );
            }
            other => panic!("{elem}: {other}"),
        }
    }
}

#[test]
fn deeply_nested_arrays_are_bounded() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"deep").u32(ValueType::Array as u32);
    for _ in 0..100 {
        r.u32(ValueType::Array as u32).u64(1);
    }
    r.u32(ValueType::U8 as u32).u64(0);
    assert!(matches!(
        kind(&r.build()),
        K::NestingTooDeep { max: 16, .. }
    ));
}

#[test]
fn unknown_value_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.odd").u32(13).u32(0);
    assert_eq!(
        kind(&r.build()),
        K::UnknownValueType {
            key: "general.odd".into(),
            type_id: 13
        }
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.odd").u32(9).u32(99).u64(0);
    assert_eq!(
        kind(&r.build()),
        K::UnknownValueType {
            key: "general.odd".into(),
            type_id: 99
        }
    );
}

#[test]
fn invalid_bool_and_utf8_values() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"b").u32(ValueType::Bool as u32).u8(2);
    assert_eq!(
        kind(&r.build()),
        K::InvalidBool {
            key: "b".into(),
            byte: 2
        }
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(b"s").u32(ValueType::String as u32).str(&[0xff, 0xfe]);
    assert_eq!(
        kind(&r.build()),
        K::InvalidUtf8 {
            what: "the value of metadata key 's'".into()
        }
    );
}

#[test]
fn non_utf8_key() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.\xc3\x28").u32(4).u32(1);
    let err = parse(&r.build()).unwrap_err();
    assert_eq!(
        err,
        FormatError {
            offset: 24,
            kind: K::InvalidUtf8 {
                what: "metadata key #0".into()
            }
        }
    );
}

#[test]
fn empty_and_duplicate_keys() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"").u32(4).u32(1);
    assert_eq!(kind(&r.build()), K::EmptyKey { index: 0 });
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("a.b", 1).kv_u32("a.b", 2);
    assert_eq!(kind(&r.build()), K::DuplicateKey("a.b".into()));
}

#[test]
fn alignment_not_a_power_of_two_or_wrong_type() {
    for (value, found) in [(0u32, "0"), (48, "48")] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", value);
        assert_eq!(
            kind(&r.build()),
            K::BadAlignment {
                found: found.into()
            }
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.alignment")
        .u32(ValueType::U64 as u32)
        .u64(32);
    assert_eq!(
        kind(&r.build()),
        K::BadAlignment {
            found: "uint64".into()
        }
    );
}

/// One tensor info with the given fields, then 64 bytes of data.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut r = Raw::header(3, 1, 0);
    r.tensor(name, dims, ty, offset).pad(32).zeros(64);
    r.build()
}

#[test]
fn unknown_and_removed_ggml_type_ids() {
    assert_eq!(
        kind(&one_tensor("w", &[4], 43, 0)),
        K::TensorType {
            tensor: "w".into(),
            error: TypeIdError::Unknown(43)
        }
    );
    assert_eq!(
        kind(&one_tensor("w", &[4], 4, 0)),
        K::TensorType {
            tensor: "w".into(),
            error: TypeIdError::Removed {
                id: 4,
                name: "q4_2"
            }
        }
    );
}

#[test]
fn dims_overflowing_u64_or_i64() {
    let err = kind(&one_tensor("w", &[1 << 32, 1 << 32, 2], 0, 0));
    assert!(
        matches!(
            err,
            K::TensorShape {
                error: ShapeError::Overflow(_),
                ..
            }
        ),
        "{err}"
    );
    let err = kind(&one_tensor("w", &[u64::MAX], 0, 0));
    assert!(
        matches!(
            err,
            K::TensorShape {
                error: ShapeError::DimTooLarge { .. },
                ..
            }
        ),
        "{err}"
    );
    let err = kind(&one_tensor("w", &[1, 1, 1, 1, 1], 0, 0));
    assert_eq!(
        err,
        K::TooManyDims {
            tensor: "w".into(),
            n_dims: 5
        }
    );
}

#[test]
fn row_not_a_multiple_of_the_block_size() {
    let err = kind(&one_tensor(
        "blk.0.attn_q.weight",
        &[576, 2],
        GgmlType::Q4_K.id(),
        0,
    ));
    assert_eq!(
        err,
        K::TensorShape {
            tensor: "blk.0.attn_q.weight".into(),
            error: ShapeError::NotBlockMultiple {
                ne0: 576,
                ty: GgmlType::Q4_K,
                block_size: 256
            }
        }
    );
    assert!(
        err.to_string()
            .contains("row length 576 is not a multiple of the q4_K block size 256")
    );
}

#[test]
fn tensor_data_past_eof() {
    let err = kind(&one_tensor("w", &[17], 0, 0));
    assert_eq!(
        err,
        K::TensorPastEof {
            tensor: "w".into(),
            ty: GgmlType::F32,
            offset: 0,
            size: 68,
            data_size: 64
        }
    );
    let err = kind(&one_tensor("w", &[1], 0, u64::MAX - 31));
    assert!(matches!(err, K::TensorPastEof { .. }), "{err}");
}

#[test]
fn misaligned_and_overlapping_offsets() {
    assert_eq!(
        kind(&one_tensor("w", &[4], 0, 8)),
        K::MisalignedTensor {
            tensor: "w".into(),
            offset: 8,
            alignment: 32
        }
    );
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[16], 0, 32)
        .pad(32)
        .zeros(128);
    assert_eq!(
        kind(&r.build()),
        K::OverlappingTensors {
            first: "a".into(),
            second: "b".into()
        }
    );
    // Non-overlapping tensors in any order are fine.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 32)
        .tensor("b", &[8], 0, 0)
        .pad(32)
        .zeros(64);
    assert_eq!(parse(&r.build()).unwrap().tensors.len(), 2);
}

#[test]
fn duplicate_tensor_names() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    assert_eq!(kind(&r.build()), K::DuplicateTensor("w".into()));
}

#[test]
fn tensor_name_too_long() {
    let name = "x".repeat(64);
    assert_eq!(
        kind(&one_tensor(&name, &[8], 0, 0)),
        K::TensorNameTooLong { index: 0, len: 64 }
    );
    assert!(parse(&one_tensor(&"x".repeat(63), &[8], 0, 0)).is_ok());
}

#[test]
fn errors_name_the_file_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.gguf");
    std::fs::write(&bad, &valid_file()[..100]).unwrap();
    let err = GgufFile::open(&bad).err().unwrap();
    assert!(matches!(err, GgufError::Format { .. }));
    assert!(
        err.to_string()
            .starts_with(&format!("{}: not a valid GGUF file", bad.display()))
    );
    let err = GgufFile::open(&dir.path().join("absent.gguf"))
        .err()
        .unwrap();
    assert!(matches!(err, GgufError::Io { .. }), "{err}");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(
        GgufFile::open(&empty)
            .err()
            .unwrap()
            .to_string()
            .contains("the magic number")
    );
}

/// Fuzz finding (gguf_reader, 2026-11-29, artifact oom-0cf8339c…, kept as the seed
/// fuzz/seeds/gguf_reader/regression-oom-huge-alignment.gguf): a file with
/// `general.alignment = 2^30` and no tensors parsed, and rewriting it padded the
/// header to 1 GiB in memory. Alignments above 1 MiB are now refused, and the
/// writer streams padding instead of building it in memory.
#[test]
fn fuzz_oom_huge_alignment_is_rejected() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 1 << 30);
    assert_eq!(
        kind(&r.build()),
        K::BadAlignment {
            found: "1073741824".into()
        }
    );
    let artifact = common::fixture("../fuzz/seeds/gguf_reader/regression-oom-huge-alignment.gguf");
    let err = parse(&std::fs::read(artifact).unwrap()).unwrap_err();
    assert!(
        matches!(err.kind, K::BadAlignment { .. } | K::Truncated { .. }),
        "{err}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 1 << 20);
    let h = parse(&r.build()).unwrap();
    assert_eq!((h.alignment, h.data_offset), (1 << 20, 1 << 20));

    let mut m = Metadata::new();
    m.set("general.alignment", 1u32 << 21);
    let err = GgufWriter::new(Vec::new(), "o".as_ref(), 3, m, vec![])
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("up to 1048576, found 2097152"),
        "{err}"
    );

    let mut m = Metadata::new();
    m.set("general.alignment", 1u32 << 20);
    let bytes = GgufWriter::new(Vec::new(), "o".as_ref(), 3, m, vec![])
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(
        bytes.len(),
        1 << 20,
        "the writer streams the padding up to the alignment"
    );
}
