//! SentencePiece model files (`tokenizer.model`): the protobuf `ModelProto`
//! read just far enough for GGUF — each piece's text, score and type — with a
//! small bounds-checked protobuf reader (no code generation, no allocation
//! beyond what the file holds), and written back for `memwall export`.
//!
//! Field numbers from sentencepiece's `sentencepiece_model.proto`:
//! `ModelProto.pieces = 1` (repeated `SentencePiece { piece = 1; score = 2;
//! type = 3 }`), `normalizer_spec = 3` (`add_dummy_prefix = 3`).

/// A piece's type (`SentencePiece.Type`); the values are GGUF's token types too.
pub mod piece_type {
    /// An ordinary piece (the default when the field is absent).
    pub const NORMAL: i32 = 1;
    /// The unknown piece.
    pub const UNKNOWN: i32 = 2;
    /// A control symbol (`<s>`).
    pub const CONTROL: i32 = 3;
    /// A user-defined symbol.
    pub const USER_DEFINED: i32 = 4;
    /// An unused piece.
    pub const UNUSED: i32 = 5;
    /// A byte-fallback piece (`<0x41>`).
    pub const BYTE: i32 = 6;
}

/// One vocabulary entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The text, with `▁` for spaces.
    pub piece: String,
    /// The score (log probability for unigram models, merge rank for BPE).
    pub score: f32,
    /// [`piece_type`].
    pub kind: i32,
}

/// What memwall reads of a `tokenizer.model`.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// The pieces, by id.
    pub pieces: Vec<Piece>,
    /// `normalizer_spec.add_dummy_prefix` (true when absent).
    pub add_dummy_prefix: bool,
}

/// A damaged protobuf encoding.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The data ends inside a varint.
    #[error("truncated varint")]
    TruncatedVarint,
    /// A varint of more than 10 bytes.
    #[error("varint longer than 10 bytes")]
    LongVarint,
    /// A field longer than the bytes left.
    #[error("field of {0} bytes runs past the end")]
    PastEnd(u64),
    /// A wire type protobuf does not define (or the deprecated groups).
    #[error("unsupported wire type {wire} in field {field}")]
    WireType {
        /// The wire type.
        wire: u64,
        /// The field number.
        field: u64,
    },
}

/// Why a `tokenizer.model` is not a SentencePiece model memwall reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SentencePieceError {
    /// The `ModelProto` encoding is damaged.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A piece's encoding is damaged.
    #[error("piece {id}: {error}")]
    PieceWire {
        /// The piece id.
        id: usize,
        /// What is damaged.
        error: WireError,
    },
    /// A piece's text is not UTF-8.
    #[error("piece {id} is not UTF-8")]
    NotUtf8 {
        /// The piece id.
        id: usize,
    },
    /// A piece's type is not a `SentencePiece.Type`.
    #[error("piece {id} has unknown type {kind}")]
    UnknownType {
        /// The piece id.
        id: usize,
        /// The type found.
        kind: u64,
    },
    /// A piece's text, score or type has the wrong wire type.
    #[error("piece {id}: field of the wrong wire type")]
    PieceWireType {
        /// The piece id.
        id: usize,
    },
    /// The `normalizer_spec` encoding is damaged.
    #[error("normalizer_spec: {0}")]
    NormalizerSpec(WireError),
    /// `pieces` or `normalizer_spec` has the wrong wire type.
    #[error("ModelProto field of the wrong wire type")]
    ModelWireType,
    /// The model has no pieces.
    #[error("no pieces (not a SentencePiece model?)")]
    NoPieces,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or(WireError::TruncatedVarint)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::LongVarint)
    }

    fn bytes(&mut self, n: u64) -> Result<&'a [u8], WireError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&e| e <= self.buf.len())
            .ok_or(WireError::PastEnd(n))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// The next field: (number, wire type, payload for length-delimited and
    /// fixed fields, value for varints).
    fn field(&mut self) -> Result<(u64, Field<'a>), WireError> {
        let key = self.varint()?;
        let (number, wire) = (key >> 3, key & 7);
        let value = match wire {
            0 => Field::Varint(self.varint()?),
            1 => Field::Bytes(self.bytes(8)?),
            2 => {
                let n = self.varint()?;
                Field::Bytes(self.bytes(n)?)
            }
            5 => Field::Bytes(self.bytes(4)?),
            wire => {
                return Err(WireError::WireType {
                    wire,
                    field: number,
                });
            }
        };
        Ok((number, value))
    }
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn piece(buf: &[u8], id: usize) -> Result<Piece, SentencePieceError> {
    let mut r = Reader { buf, pos: 0 };
    let mut p = Piece {
        piece: String::new(),
        score: 0.0,
        kind: piece_type::NORMAL,
    };
    while !r.done() {
        match r
            .field()
            .map_err(|error| SentencePieceError::PieceWire { id, error })?
        {
            (1, Field::Bytes(b)) => {
                p.piece = std::str::from_utf8(b)
                    .map_err(|_| SentencePieceError::NotUtf8 { id })?
                    .to_owned();
            }
            (2, Field::Bytes(b)) if b.len() == 4 => {
                p.score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            (3, Field::Varint(v)) => {
                p.kind = i32::try_from(v)
                    .ok()
                    .filter(|k| (1..=6).contains(k))
                    .ok_or(SentencePieceError::UnknownType { id, kind: v })?;
            }
            (1..=3, _) => return Err(SentencePieceError::PieceWireType { id }),
            _ => {}
        }
    }
    Ok(p)
}

/// Parses a `tokenizer.model`.
pub fn parse(buf: &[u8]) -> Result<Model, SentencePieceError> {
    let mut r = Reader { buf, pos: 0 };
    let mut model = Model {
        pieces: Vec::new(),
        add_dummy_prefix: true,
    };
    while !r.done() {
        match r.field()? {
            (1, Field::Bytes(b)) => {
                let id = model.pieces.len();
                model.pieces.push(piece(b, id)?);
            }
            (3, Field::Bytes(b)) => {
                let mut n = Reader { buf: b, pos: 0 };
                while !n.done() {
                    if let (3, Field::Varint(v)) =
                        n.field().map_err(SentencePieceError::NormalizerSpec)?
                    {
                        model.add_dummy_prefix = v != 0;
                    }
                }
            }
            (1 | 3, _) => return Err(SentencePieceError::ModelWireType),
            _ => {}
        }
    }
    if model.pieces.is_empty() {
        return Err(SentencePieceError::NoPieces);
    }
    Ok(model)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    put_varint(out, field << 3 | 2);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A `ModelProto` for `pieces`, with a BPE trainer spec, byte fallback as asked and
/// identity normalization: what `memwall export` writes for a GGUF `llama`
/// vocabulary. The trainer spec carries the special ids SentencePiece needs.
pub fn write(
    model: &Model,
    unk: u32,
    bos: Option<u32>,
    eos: Option<u32>,
    byte_fallback: bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    for p in &model.pieces {
        let mut b = Vec::new();
        put_bytes(&mut b, 1, p.piece.as_bytes());
        put_varint(&mut b, 2 << 3 | 5);
        b.extend_from_slice(&p.score.to_le_bytes());
        if p.kind != piece_type::NORMAL {
            put_varint(&mut b, 3 << 3);
            put_varint(&mut b, p.kind as u64);
        }
        put_bytes(&mut out, 1, &b);
    }
    // TrainerSpec: model_type (field 3) = BPE (2), vocab_size (4), byte_fallback (35),
    // unk_id (40), bos_id (41), eos_id (42), pad_id (43) = -1.
    let mut t = Vec::new();
    put_varint(&mut t, 3 << 3);
    put_varint(&mut t, 2);
    put_varint(&mut t, 4 << 3);
    put_varint(&mut t, model.pieces.len() as u64);
    put_varint(&mut t, 35 << 3);
    put_varint(&mut t, u64::from(byte_fallback));
    let id = |v: Option<u32>| v.map_or(u64::MAX, u64::from);
    for (field, v) in [(40, Some(unk)), (41, bos), (42, eos), (43, None)] {
        put_varint(&mut t, field << 3);
        put_varint(&mut t, id(v));
    }
    put_bytes(&mut out, 2, &t);
    // NormalizerSpec: name "identity", add_dummy_prefix, no whitespace cleanup, escape spaces.
    let mut n = Vec::new();
    put_bytes(&mut n, 1, b"identity");
    put_varint(&mut n, 3 << 3);
    put_varint(&mut n, u64::from(model.add_dummy_prefix));
    put_varint(&mut n, 4 << 3);
    put_varint(&mut n, 0);
    put_varint(&mut n, 5 << 3);
    put_varint(&mut n, 1);
    put_bytes(&mut out, 3, &n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let model = Model {
            pieces: vec![
                Piece {
                    piece: "<unk>".into(),
                    score: 0.0,
                    kind: piece_type::UNKNOWN,
                },
                Piece {
                    piece: "▁北京".into(),
                    score: -3.5,
                    kind: piece_type::NORMAL,
                },
                Piece {
                    piece: "<0x41>".into(),
                    score: 0.0,
                    kind: piece_type::BYTE,
                },
            ],
            add_dummy_prefix: false,
        };
        let bytes = write(&model, 0, None, None, true);
        assert_eq!(parse(&bytes).unwrap(), model);
        for cut in [1, bytes.len() - 1] {
            assert!(parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // A length far past the end is an error, not an allocation.
        assert!(parse(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(parse(&[]).is_err());
    }
}
