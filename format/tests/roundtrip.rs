//! Writer → reader → writer round trips over random metadata and tensors, and
//! the writer's checks on what it is given.

mod common;

use memwall_format::GgmlType;
use memwall_format::gguf::{
    Array, GgufError, GgufFile, GgufWriter, Metadata, TensorSpec, Value, copy_gguf, keys, parse,
};
use proptest::prelude::*;

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<f32>().prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<f64>().prop_map(Value::F64),
    ]
}

fn array() -> impl Strategy<Value = Array> {
    let n = 0..6usize;
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), n.clone()).prop_map(Array::U8),
        prop::collection::vec(any::<i8>(), n.clone()).prop_map(Array::I8),
        prop::collection::vec(any::<u16>(), n.clone()).prop_map(Array::U16),
        prop::collection::vec(any::<i16>(), n.clone()).prop_map(Array::I16),
        prop::collection::vec(any::<u32>(), n.clone()).prop_map(Array::U32),
        prop::collection::vec(any::<i32>(), n.clone()).prop_map(Array::I32),
        prop::collection::vec(any::<f32>(), n.clone()).prop_map(Array::F32),
        prop::collection::vec(any::<bool>(), n.clone()).prop_map(Array::Bool),
        prop::collection::vec(".{0,8}", n.clone()).prop_map(Array::String),
        prop::collection::vec(any::<u64>(), n.clone()).prop_map(Array::U64),
        prop::collection::vec(any::<i64>(), n.clone()).prop_map(Array::I64),
        prop::collection::vec(any::<f64>(), n).prop_map(Array::F64),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Array::Array)
    })
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![3 => scalar(), 1 => array().prop_map(Value::Array)]
}

fn metadata() -> impl Strategy<Value = Metadata> {
    let alignment = prop_oneof![Just(None), (0u32..8).prop_map(|p| Some(1u32 << p))];
    (
        prop::collection::vec(("[a-z_.]{1,16}", value()), 0..12),
        alignment,
    )
        .prop_map(|(pairs, alignment)| {
            let mut m = Metadata::new();
            for (i, (key, value)) in pairs.into_iter().enumerate() {
                // A numeric prefix keeps keys unique.
                m.set(format!("k{i}.{key}"), value);
            }
            if let Some(a) = alignment {
                m.set(keys::ALIGNMENT, a);
            }
            m
        })
}

/// A tensor spec with a valid shape for a random live type, plus its data.
fn tensor() -> impl Strategy<Value = (TensorSpec, Vec<u8>)> {
    let types: Vec<GgmlType> = GgmlType::all().collect();
    (
        prop::sample::select(types),
        0u64..3,
        prop::collection::vec(0u64..4, 0..4),
        any::<u8>(),
    )
        .prop_map(|(ty, blocks, rest, seed)| {
            let mut dims = vec![blocks * ty.block_size()];
            dims.extend(rest);
            let size = ty.tensor_size(&dims).unwrap().bytes as usize;
            let data = (0..size)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                .collect();
            (
                TensorSpec {
                    name: String::new(),
                    dims,
                    ty,
                },
                data,
            )
        })
}

fn write(
    version: u32,
    metadata: Metadata,
    tensors: &[(TensorSpec, Vec<u8>)],
    chunk: usize,
) -> Result<Vec<u8>, GgufError> {
    let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(Vec::new(), "mem".as_ref(), version, metadata, specs)?;
    for (spec, data) in tensors {
        if data.is_empty() {
            continue;
        }
        for piece in data.chunks(chunk) {
            w.write_tensor_data(&spec.name, piece)?;
        }
    }
    w.finish()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn writer_reader_writer_is_byte_identical(
        version in 2u32..=3,
        metadata in metadata(),
        mut tensors in prop::collection::vec(tensor(), 0..6),
        chunk in 1usize..200,
    ) {
        for (i, (spec, _)) in tensors.iter_mut().enumerate() {
            spec.name = format!("blk.{i}.weight");
        }
        let bytes = write(version, metadata.clone(), &tensors, chunk)?;
        let one_shot = write(version, metadata.clone(), &tensors, usize::MAX)?;
        prop_assert!(bytes == one_shot, "chunking changes the output");

        let file = GgufFile::from_vec("mem".as_ref(), bytes.clone())?;
        let h = file.header();
        prop_assert_eq!(h.version, version);
        let keys: Vec<&str> = h.metadata.iter().map(|(k, _)| k).collect();
        let expected: Vec<&str> = metadata.iter().map(|(k, _)| k).collect();
        prop_assert_eq!(keys, expected);
        prop_assert_eq!(h.data_offset % h.alignment, 0);
        prop_assert_eq!(h.tensors.len(), tensors.len());
        for (t, (spec, data)) in h.tensors.iter().zip(&tensors) {
            prop_assert_eq!(&t.name, &spec.name);
            prop_assert_eq!(&t.dims, &spec.dims);
            prop_assert_eq!(t.ty, spec.ty);
            prop_assert_eq!(t.offset % h.alignment, 0);
            prop_assert!(file.tensor_data(t) == &data[..]);
        }
        // Values other than floats compare structurally (NaN != NaN); the byte
        // comparison below covers the floats bit for bit.
        for ((_, a), (_, b)) in h.metadata.iter().zip(metadata.iter()) {
            if !matches!(a, Value::F32(_) | Value::F64(_) | Value::Array(_)) {
                prop_assert_eq!(a, b);
            }
        }
        let again = copy_gguf(&file, Vec::new(), "mem".as_ref(), chunk)?;
        prop_assert!(again == bytes, "writer → reader → writer differs");
    }

    /// Any bytes at all: the reader returns a header or an error, never panics.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&bytes);
        let mut with_magic = b"GGUF\x03\0\0\0".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = parse(&with_magic);
    }
}

fn spec(name: &str, dims: &[u64], ty: GgmlType) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dims: dims.to_vec(),
        ty,
    }
}

fn writer(tensors: Vec<TensorSpec>) -> GgufWriter<Vec<u8>> {
    GgufWriter::new(Vec::new(), "out.gguf".as_ref(), 3, Metadata::new(), tensors).unwrap()
}

#[test]
fn writer_enforces_order_and_sizes() {
    let mut w = writer(vec![
        spec("a", &[4], GgmlType::F32),
        spec("b", &[2], GgmlType::F16),
    ]);
    let err = w.write_tensor_data("b", &[0; 4]).unwrap_err().to_string();
    assert_eq!(
        err,
        "out.gguf: got data for tensor 'b', but tensor #0 'a' comes next"
    );
    let err = w.write_tensor_data("a", &[0; 17]).unwrap_err().to_string();
    assert_eq!(
        err,
        "out.gguf: tensor 'a' is 16 bytes; got 1 bytes more than that"
    );
    let err = w.write_tensor("a", &[0; 8]).unwrap_err().to_string();
    assert_eq!(err, "out.gguf: tensor 'a' is 16 bytes, got 8");
    w.write_tensor_data("a", &[0; 10]).unwrap();
    w.write_tensor_data("a", &[0; 6]).unwrap();
    assert_eq!(w.next_tensor().map(|t| t.name.as_str()), Some("b"));
    w.write_tensor_data("b", &[0; 1]).unwrap();
    let err = w.finish().err().unwrap().to_string();
    assert_eq!(
        err,
        "out.gguf: tensor 'b' is incomplete: 1 of 4 bytes written (1 tensors missing)"
    );

    let mut w = writer(vec![spec("a", &[1], GgmlType::F32)]);
    w.write_tensor("a", &[0; 4]).unwrap();
    let err = w.write_tensor_data("a", &[0]).unwrap_err().to_string();
    assert_eq!(
        err,
        "out.gguf: got data for tensor 'a', but all tensors are complete"
    );
}

#[test]
fn writer_rejects_what_llama_cpp_could_not_load() {
    let plan = |m: Metadata, t: Vec<TensorSpec>| {
        GgufWriter::new(Vec::new(), "o".as_ref(), 3, m, t)
            .err()
            .map(|e| e.to_string())
    };
    let f32 = GgmlType::F32;
    let long = "x".repeat(64);
    assert!(
        plan(Metadata::new(), vec![spec(&long, &[1], f32)])
            .unwrap()
            .contains("at most 63")
    );
    assert!(
        plan(
            Metadata::new(),
            vec![spec("a", &[1], f32), spec("a", &[1], f32)]
        )
        .unwrap()
        .contains("duplicate tensor name 'a'")
    );
    assert!(
        plan(Metadata::new(), vec![spec("a", &[100], GgmlType::Q4_K)])
            .unwrap()
            .contains("row length 100 is not a multiple of the q4_K block size 256")
    );
    let mut m = Metadata::new();
    m.set(keys::ALIGNMENT, 24u32);
    assert!(
        plan(m, vec![])
            .unwrap()
            .contains("general.alignment must be a uint32 power of two")
    );
    let mut m = Metadata::new();
    m.set("", 1u8);
    assert!(plan(m, vec![]).unwrap().contains("metadata key is empty"));
    assert!(
        GgufWriter::new(Vec::new(), "o".as_ref(), 1, Metadata::new(), vec![])
            .err()
            .unwrap()
            .to_string()
            .contains("cannot write GGUF version 1")
    );
}

#[test]
fn failed_or_abandoned_file_writes_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let partial = dir.path().join("m.gguf.partial");
    let specs = vec![spec("a", &[4], GgmlType::F32)];

    // Dropped without commit.
    let mut w = GgufWriter::create(&out, 3, Metadata::new(), specs.clone()).unwrap();
    w.write_tensor_data("a", &[0; 8]).unwrap();
    assert!(partial.exists());
    drop(w);
    assert!(!partial.exists() && !out.exists());

    // Commit with missing data is an error, and removes the partial file.
    let w = GgufWriter::create(&out, 3, Metadata::new(), specs.clone()).unwrap();
    assert!(w.commit().is_err());
    assert!(!partial.exists() && !out.exists());

    // A previous good file stays untouched by a failed write.
    std::fs::write(&out, b"previous").unwrap();
    let mut w = GgufWriter::create(&out, 3, Metadata::new(), specs).unwrap();
    assert!(w.write_tensor_data("a", &[0; 99]).is_err());
    drop(w);
    assert_eq!(std::fs::read(&out).unwrap(), b"previous");
    assert!(!partial.exists());

    // An invalid header never creates the partial file.
    let bad = vec![spec("a", &[3], GgmlType::Q8_0)];
    assert!(GgufWriter::create(&out, 3, Metadata::new(), bad).is_err());
    assert!(!partial.exists());

    // An unwritable directory is a clear error naming the partial path.
    let err = GgufWriter::create(
        &dir.path().join("no/dir/x.gguf"),
        3,
        Metadata::new(),
        vec![],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("no/dir/x.gguf.partial"), "{err}");
}

#[test]
fn empty_tensors_and_no_tensors() {
    let w = writer(vec![spec("empty", &[0, 3], GgmlType::Q4_K)]);
    let bytes = w.finish().unwrap();
    let h = parse(&bytes).unwrap();
    assert_eq!((h.tensors[0].size, h.tensors[0].elements), (0, 0));
    let bytes = writer(vec![]).finish().unwrap();
    assert_eq!(bytes.len() % 32, 0, "the header is padded as ggml pads it");
    assert!(parse(&bytes).unwrap().tensors.is_empty());
}
