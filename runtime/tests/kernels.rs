//! The compute kernels against ggml and against each other.
//!
//! - Activation quantizers: byte for byte what ggml's `quantize_row_q8_*_ref`
//!   wrote (`data/kernels_ggml.json`, recorded by `data/kernels_ggml.c`).
//! - Scalar dot products: against ggml's CPU `vec_dot` on the recorded rows,
//!   and against `dequantize_row(w) · dequantize(a)` (in f64) on random
//!   blocks.
//! - The scalar kernels follow the canonical evaluation order of the
//!   `kernels` module docs: recomputed here from the raw bytes for Q8_0,
//!   Q4_1, Q4_K and the float dot products.
//! - Every SIMD backend this CPU runs: the same bits as the scalar kernel
//!   (`to_bits` equality), on many random rows of 1 to 40 blocks, float rows
//!   of any length.
//! - `Matmul`: every output the same bits as the scalar `vec_dot`, for every
//!   backend, thread count and batch size.
//!
//! Error budget of the comparisons with ggml and with the exact dot product
//! (ggml's accumulation order is not ours, and no order is exact): with
//! `B = Σ |w_i · a_i| + Σ |m_i · a_i|` (the second sum over the per-weight
//! minimums `m_i` of the types that have them, where the integer sum splits
//! into two parts that may cancel), they allow `|Δ| ≤ 1e-5 · B` (plus 1e-30
//! absolute).

use memwall_format::GgmlType;
use memwall_format::blocks::{
    BlockIq1M, BlockMxfp4, DEQUANTIZABLE, F16, as_blocks_mut, bf16_to_f32, block_bytes,
    dequantize_row, f16_to_f32, f32_to_f16, scale_fields, scale_min_k4,
};
use memwall_runtime::kernels::{
    ActRow, Activations, Backend, BlockQ8_0, BlockQ8_1, BlockQ8K, KernelError, Kernels, Matmul,
    QMatrix, VecDotType, quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k,
};

const TOL: f64 = 1e-5;

/// The scalar kernels: the specification (and the activations it quantizes,
/// which every backend reads byte for byte the same).
fn spec() -> Kernels {
    Kernels::new(Backend::Scalar).unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-s, s).
    fn f(&mut self, s: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * s
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn floats(s: &str) -> Vec<f32> {
    unhex(s)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kernels_ggml.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn bytes_q8_0(b: &[BlockQ8_0]) -> Vec<u8> {
    block_bytes(b).to_vec()
}
fn bytes_q8_1(b: &[BlockQ8_1]) -> Vec<u8> {
    block_bytes(b).to_vec()
}
fn bytes_q8k(b: &[BlockQ8K]) -> Vec<u8> {
    block_bytes(b).to_vec()
}

#[test]
fn activation_quantizers_match_ggml_reference_bytes() {
    let fx = fixture();
    for case in fx["quantize"].as_array().unwrap() {
        let x = floats(case["x"].as_str().unwrap());
        let mut q0 = vec![BlockQ8_0::default(); x.len() / 32];
        quantize_row_q8_0(&x, &mut q0);
        assert_eq!(bytes_q8_0(&q0), unhex(case["q8_0"].as_str().unwrap()));
        let mut q1 = vec![BlockQ8_1::default(); x.len() / 32];
        quantize_row_q8_1(&x, &mut q1);
        assert_eq!(bytes_q8_1(&q1), unhex(case["q8_1"].as_str().unwrap()));
        let mut qk = vec![BlockQ8K::default(); x.len() / 256];
        quantize_row_q8_k(&x, &mut qk);
        let want = unhex(case["q8_K"].as_str().unwrap());
        for (b, w) in qk.iter().zip(want.chunks_exact(292)) {
            if b.d == 0.0 {
                // ggml leaves the sums of an all-zero block unwritten; ours are zero.
                assert_eq!(&bytes_q8k(std::slice::from_ref(b))[..260], &w[..260]);
                assert_eq!(b.bsums, [0; 16]);
            } else {
                assert_eq!(&bytes_q8k(std::slice::from_ref(b))[..], w);
            }
        }
    }
}

#[test]
fn ties_round_like_ggml() {
    // roundf: half away from zero (Q8_0/Q8_1); nearest_int: half to even (Q8_K).
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 0.5;
    let mut q = [BlockQ8_0::default()];
    quantize_row_q8_0(&x, &mut q);
    assert_eq!(&q[0].qs[..4], &[127, 3, -3, 1]);
    let mut x = [0f32; 256];
    x[0] = -127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    let mut q = [BlockQ8K::default()];
    quantize_row_q8_k(&x, &mut q);
    assert_eq!(&q[0].qs[..4], &[-127, 2, -2, 4]);
    assert_eq!(q[0].d, 1.0);
    assert_eq!(q[0].bsums[0], -127 + 2 - 2 + 4);
}

/// Dequantized activations.
fn act_values(a: ActRow<'_>) -> Vec<f32> {
    match a {
        ActRow::F32(v) => v.to_vec(),
        ActRow::F16(v) => v.iter().map(|&h| f16_to_f32(h)).collect(),
        ActRow::BF16(v) => v.iter().map(|&h| bf16_to_f32(h)).collect(),
        ActRow::Q8_0(b) => b
            .iter()
            .flat_map(|b| b.qs.map(|q| b.d.to_f32() * f32::from(q)))
            .collect(),
        ActRow::Q8_1(b) => b
            .iter()
            .flat_map(|b| b.qs.map(|q| b.d.to_f32() * f32::from(q)))
            .collect(),
        ActRow::Q8K(b) => b
            .iter()
            .flat_map(|b| b.qs.map(|q| b.d * f32::from(q)))
            .collect(),
    }
}

/// Byte ranges, within a block, of the quants of the types with minimums:
/// zeroing them leaves a block whose values are the minimums.
fn quant_bytes(ty: GgmlType) -> Option<std::ops::Range<usize>> {
    match ty {
        GgmlType::Q4_1 => Some(4..20),
        GgmlType::Q5_1 => Some(4..24),
        GgmlType::Q2_K => Some(16..80),
        GgmlType::Q4_K => Some(16..144),
        GgmlType::Q5_K => Some(16..176),
        _ => None,
    }
}

/// The exact dot product of the dequantized rows (f64) and the error budget `B`.
fn reference(ty: GgmlType, w: &[u8], a: ActRow<'_>) -> (f64, f64) {
    let av = act_values(a);
    let mut wv = vec![0f32; av.len()];
    dequantize_row(ty, w, &mut wv).unwrap();
    let mut exact: f64 = wv
        .iter()
        .zip(&av)
        .map(|(&w, &a)| f64::from(w) * f64::from(a))
        .sum();
    if let ActRow::Q8_1(blocks) = a {
        // Q8_1 carries `s = d·Σq` rounded to f16, and the dot product of the
        // types with a minimum `m` uses it: add `m · (s − d·Σq)` per block.
        let ts = ty.type_size() as usize;
        for (wb, b) in w.chunks_exact(ts).zip(blocks) {
            let m = f64::from(f16_to_f32(u16::from_le_bytes([wb[2], wb[3]])));
            let sum: f64 = b.qs.iter().map(|&q| f64::from(q)).sum();
            exact += m * (f64::from(b.s.to_f32()) - f64::from(b.d.to_f32()) * sum);
        }
    }
    let mut budget: f64 = wv
        .iter()
        .zip(&av)
        .map(|(&w, &a)| f64::from(w * a).abs())
        .sum();
    if let Some(q) = quant_bytes(ty) {
        let ts = ty.type_size() as usize;
        let mut mins = w.to_vec();
        for b in mins.chunks_exact_mut(ts) {
            b[q.clone()].fill(0);
        }
        dequantize_row(ty, &mins, &mut wv).unwrap();
        budget += wv
            .iter()
            .zip(&av)
            .map(|(&w, &a)| f64::from(w * a).abs())
            .sum::<f64>();
    }
    (exact, budget)
}

fn close(got: f32, want: f64, budget: f64) -> bool {
    (f64::from(got) - want).abs() <= TOL * budget + 1e-30
}

#[test]
fn scalar_dots_match_ggml_vec_dot() {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let fx = fixture();
    let cases = fx["vec_dot"].as_array().unwrap();
    assert_eq!(cases.len(), DEQUANTIZABLE.len());
    for case in cases {
        let ty = GgmlType::from_name(case["type"].as_str().unwrap()).unwrap();
        let w = unhex(case["w"].as_str().unwrap());
        let x = floats(case["x"].as_str().unwrap());
        let want = case["dot"].as_f64().unwrap();
        let kind = VecDotType::of(ty).unwrap();
        let mut acts = Activations::new();
        acts.quantize(&spec(), kind, &x, x.len()).unwrap();
        // Our activations are ggml's, byte for byte.
        let act_bytes: Vec<u8> = match acts.row(0) {
            ActRow::F32(v) => v.iter().flat_map(|f| f.to_le_bytes()).collect(),
            ActRow::F16(v) | ActRow::BF16(v) => v.iter().flat_map(|h| h.to_le_bytes()).collect(),
            ActRow::Q8_0(b) => bytes_q8_0(b),
            ActRow::Q8_1(b) => bytes_q8_1(b),
            ActRow::Q8K(b) => bytes_q8k(b),
        };
        assert_eq!(
            act_bytes,
            unhex(case["act"].as_str().unwrap()),
            "{ty} activations"
        );
        let (exact, budget) = reference(ty, &w, acts.row(0));
        assert!(
            close(want as f32, exact, budget),
            "{ty}: ggml {want} vs exact {exact}"
        );
        for b in Backend::supported() {
            let k = Kernels::new(b).unwrap();
            let got = k.vec_dot(ty, &w, acts.row(0)).unwrap();
            assert!(
                close(got, want, budget),
                "{ty} {b:?}: {got} vs ggml {want} (B {budget})"
            );
        }
        let got = scalar.vec_dot(ty, &w, acts.row(0)).unwrap();
        assert!(close(got, exact, budget), "{ty}: {got} vs exact {exact}");
    }
}

#[test]
fn decoders_match_ggml_to_float_bit_for_bit() {
    let cases = fixture()["vec_dot"].as_array().unwrap().clone();
    for case in cases {
        let ty = GgmlType::from_name(case["type"].as_str().unwrap()).unwrap();
        let w = unhex(case["w"].as_str().unwrap());
        let want = floats(case["deq"].as_str().unwrap());
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &w, &mut got).unwrap();
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{ty} weight {i}: {g} vs ggml {e}");
        }
    }
}

/// A random valid row of `n` weights: random bytes, finite scales (floats: finite values).
fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.f(2.0).to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f32_to_f16(rng.f(2.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| memwall_format::blocks::f32_to_bf16(rng.f(2.0)).to_le_bytes())
            .collect(),
        _ => {
            let mut w: Vec<u8> = (0..n / bs * ts).map(|_| rng.next() as u8).collect();
            for b in w.chunks_exact_mut(ts) {
                for &o in scale_fields(ty) {
                    let v = rng.f(1.0) * [1.0, 0.01, 0.1][rng.below(3)];
                    b[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
                }
                if ty == GgmlType::IQ1_M {
                    // The f16 scale lives in four nibbles, no field of its own.
                    let d = F16::from_f32(rng.f(1.0) * [1.0, 0.01, 0.1][rng.below(3)]);
                    as_blocks_mut::<BlockIq1M>(b)[0].set_scale(d);
                }
                if ty == GgmlType::MXFP4 {
                    // An exponent for scales of about 2⁻⁸ … 2⁰.
                    b[std::mem::offset_of!(BlockMxfp4, e)] = 120 + rng.below(9) as u8;
                }
            }
            w
        }
    }
}

/// Random activations, some blocks much larger or smaller than others, some zero.
fn random_acts(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(n);
    for _ in 0..n / 32 {
        let s = [1.0, 10.0, 0.001, 0.0, 3.0][rng.below(5)];
        x.extend((0..32).map(|_| rng.f(s)));
    }
    x
}

#[test]
fn scalar_dots_match_dequantized_rows() {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for ty in DEQUANTIZABLE {
        let kind = VecDotType::of(ty).unwrap();
        for nb in [1, 2, 3, 5] {
            for _ in 0..20 {
                let n = 256 * nb;
                let w = random_row(&mut rng, ty, n);
                let mut acts = Activations::new();
                acts.quantize(&spec(), kind, &random_acts(&mut rng, n), n)
                    .unwrap();
                let got = scalar.vec_dot(ty, &w, acts.row(0)).unwrap();
                let (exact, budget) = reference(ty, &w, acts.row(0));
                assert!(
                    close(got, exact, budget),
                    "{ty}: {got} vs {exact} (B {budget})"
                );
            }
        }
    }
}

/// `((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7))`.
fn tree8(p: [f32; 8]) -> f32 {
    ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
}

/// The canonical sum of block terms: block `b` into partial `b % 8`, then [`tree8`].
fn canonical_blocks(terms: impl Iterator<Item = f32>) -> f32 {
    let mut p = [0f32; 8];
    for (b, t) in terms.enumerate() {
        p[b % 8] += t;
    }
    tree8(p)
}

/// The canonical float sum: element `i` into partial `i % 32`, folded to eight
/// as `(p[k] + p[k+8]) + (p[k+16] + p[k+24])`, then [`tree8`].
fn canonical_floats(products: impl Iterator<Item = f32>) -> f32 {
    let mut p = [0f32; 32];
    for (i, t) in products.enumerate() {
        p[i % 32] += t;
    }
    tree8(std::array::from_fn(|k| {
        (p[k] + p[k + 8]) + (p[k + 16] + p[k + 24])
    }))
}

fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[test]
fn scalar_kernels_follow_the_canonical_order() {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let mut rng = Rng(0x5eed_0f0b_dea1);
    for nb in [1, 7, 8, 9, 16, 23] {
        let n = 256 * nb;
        let x = random_acts(&mut rng, n);

        // Q8_0: t = (d_w·d_a)·isum.
        let w = random_row(&mut rng, GgmlType::Q8_0, n);
        let mut acts = Activations::new();
        acts.quantize(&spec(), VecDotType::Q8_0, &x, n).unwrap();
        let ActRow::Q8_0(a) = acts.row(0) else {
            unreachable!()
        };
        let want = canonical_blocks(w.chunks_exact(34).zip(a).map(|(b, y)| {
            let isum: i32 = (0..32)
                .map(|j| i32::from(b[2 + j] as i8) * i32::from(y.qs[j]))
                .sum();
            (half(b, 0) * y.d.to_f32()) * isum as f32
        }));
        let got = scalar.vec_dot(GgmlType::Q8_0, &w, acts.row(0)).unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "Q8_0 nb={nb}");

        // Q4_1: t = (d_w·d_a)·isum + m_w·s_a.
        let w = random_row(&mut rng, GgmlType::Q4_1, n);
        acts.quantize(&spec(), VecDotType::Q8_1, &x, n).unwrap();
        let ActRow::Q8_1(a) = acts.row(0) else {
            unreachable!()
        };
        let want = canonical_blocks(w.chunks_exact(20).zip(a).map(|(b, y)| {
            let isum: i32 = (0..16)
                .map(|j| {
                    i32::from(b[4 + j] & 0xf) * i32::from(y.qs[j])
                        + i32::from(b[4 + j] >> 4) * i32::from(y.qs[j + 16])
                })
                .sum();
            (half(b, 0) * y.d.to_f32()) * isum as f32 + half(b, 2) * y.s.to_f32()
        }));
        let got = scalar.vec_dot(GgmlType::Q4_1, &w, acts.row(0)).unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "Q4_1 nb={nb}");

        // Q4_K: t = (d_w·d_a)·isum − (m_w·d_a)·summs over the super-block.
        let w = random_row(&mut rng, GgmlType::Q4_K, n);
        acts.quantize(&spec(), VecDotType::Q8K, &x, n).unwrap();
        let ActRow::Q8K(a) = acts.row(0) else {
            unreachable!()
        };
        let want = canonical_blocks(w.chunks_exact(144).zip(a).map(|(b, y)| {
            let packed: &[u8; 12] = b[4..16].try_into().unwrap();
            let (mut isum, mut summs) = (0i32, 0i32);
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, packed);
                let q = &b[16 + 32 * (j / 2)..][..32];
                let v: i32 = (0..32)
                    .map(|l| {
                        let nib = if j % 2 == 0 { q[l] & 0xf } else { q[l] >> 4 };
                        i32::from(nib) * i32::from(y.qs[32 * j + l])
                    })
                    .sum();
                isum += i32::from(sc) * v;
                summs += i32::from(m) * (i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]));
            }
            (half(b, 0) * y.d) * isum as f32 - (half(b, 2) * y.d) * summs as f32
        }));
        let got = scalar.vec_dot(GgmlType::Q4_K, &w, acts.row(0)).unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "Q4_K nb={nb}");
    }
    for n in [0, 1, 31, 32, 33, 100, 1000] {
        let a: Vec<f32> = (0..n).map(|_| rng.f(3.0)).collect();
        let c: Vec<f32> = (0..n).map(|_| rng.f(3.0)).collect();
        let want = canonical_floats(a.iter().zip(&c).map(|(x, y)| x * y));
        assert_eq!(
            scalar.dot_f32(&a, &c).to_bits(),
            want.to_bits(),
            "f32 n={n}"
        );
        let w: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = scalar.vec_dot(GgmlType::F32, &w, ActRow::F32(&c)).unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "F32 n={n}");
    }
}

fn same_bits(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits()
}

/// `mm`'s product of `m` with the token rows `x`, every output the same
/// bits as the scalar `vec_dot` of its row and token (`what` names the case).
fn assert_matmul_is_scalar(mm: &mut Matmul, m: &QMatrix<'_>, x: &[f32], what: &str) {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let (rows, cols) = (m.rows(), m.cols());
    let t_n = x.len() / cols;
    let mut acts = Activations::new();
    acts.quantize(&spec(), VecDotType::of(m.ty()).unwrap(), x, cols)
        .unwrap();
    let mut y = vec![f32::NAN; t_n * rows];
    mm.matmul(m, x, &mut y).unwrap();
    for t in 0..t_n {
        for r in 0..rows {
            let want = scalar.vec_dot(m.ty(), m.row(r), acts.row(t)).unwrap();
            let got = y[t * rows + r];
            assert!(
                same_bits(got, want),
                "{what}, {rows}×{cols}, {t_n} tokens: row {r} token {t}: {got:e} vs scalar {want:e}"
            );
        }
    }
}

#[test]
fn simd_backends_match_scalar_bit_for_bit() {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let mut rng = Rng(0xdead_beef_0bad_f00d);
    for b in Backend::supported() {
        let k = Kernels::new(b).unwrap();
        for ty in DEQUANTIZABLE {
            let kind = VecDotType::of(ty).unwrap();
            let bs = ty.block_size().max(32) as usize;
            // Whole steps of eight blocks, tails of every length, several steps.
            for nb in (1..=25).chain([31, 32, 33, 40]) {
                for _ in 0..6 {
                    // Float types: lengths that are not multiples of any vector width too.
                    let n = if ty.block_size() == 1 {
                        32 * nb + rng.below(32)
                    } else {
                        bs * nb
                    };
                    let w = random_row(&mut rng, ty, n);
                    let mut acts = Activations::new();
                    let mut x = random_acts(&mut rng, n.div_ceil(32) * 32);
                    x.truncate(n);
                    acts.quantize(&spec(), kind, &x, n).unwrap();
                    let want = scalar.vec_dot(ty, &w, acts.row(0)).unwrap();
                    let got = k.vec_dot(ty, &w, acts.row(0)).unwrap();
                    assert!(
                        same_bits(got, want),
                        "{b:?} {ty} n={n}: {got:e} vs scalar {want:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn float_helpers_match_scalar_bit_for_bit() {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let mut rng = Rng(42);
    for b in Backend::supported() {
        let k = Kernels::new(b).unwrap();
        for n in (0..80).chain([127, 128, 129, 1000, 4096 + 7]) {
            let a: Vec<f32> = (0..n).map(|_| rng.f(3.0)).collect();
            let c: Vec<f32> = (0..n).map(|_| rng.f(3.0)).collect();
            let ah: Vec<u16> = a.iter().map(|&v| f32_to_f16(v)).collect();
            let ch: Vec<u16> = c.iter().map(|&v| f32_to_f16(v)).collect();
            let pairs = [
                (k.dot_f32(&a, &c), scalar.dot_f32(&a, &c)),
                (k.dot_f16_f32(&ah, &c), scalar.dot_f16_f32(&ah, &c)),
                (k.dot_f16_f16(&ah, &ch), scalar.dot_f16_f16(&ah, &ch)),
            ];
            for (i, (got, want)) in pairs.into_iter().enumerate() {
                assert!(
                    same_bits(got, want),
                    "{b:?} helper {i} n={n}: {got:e} vs {want:e}"
                );
            }
        }
    }
}

#[test]
fn tiny_products_round_the_same_everywhere() {
    // bf16 × bf16 and f16 × f32 products that fall below f32's normal range
    // round; a fused multiply-add would not. Every backend must round.
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let mut rng = Rng(99);
    for b in Backend::supported() {
        let k = Kernels::new(b).unwrap();
        for n in [8, 40, 77] {
            let small: Vec<f32> = (0..n).map(|_| rng.f(1.0) * 3e-21).collect();
            let w: Vec<u8> = small
                .iter()
                .flat_map(|&v| memwall_format::blocks::f32_to_bf16(v).to_le_bytes())
                .collect();
            let acts: Vec<u16> = (0..n)
                .map(|i| memwall_format::blocks::f32_to_bf16(small[(i * 7) % n] * 0.7))
                .collect();
            let want = scalar
                .vec_dot(GgmlType::BF16, &w, ActRow::BF16(&acts))
                .unwrap();
            let got = k.vec_dot(GgmlType::BF16, &w, ActRow::BF16(&acts)).unwrap();
            assert!(
                same_bits(got, want),
                "{b:?} bf16 n={n}: {got:e} vs {want:e}"
            );
            let tiny: Vec<f32> = (0..n).map(|_| rng.f(1.0) * 1e-38).collect();
            let h: Vec<u16> = (0..n).map(|_| f32_to_f16(rng.f(1.0))).collect();
            let (got, want) = (k.dot_f16_f32(&h, &tiny), scalar.dot_f16_f32(&h, &tiny));
            assert!(
                same_bits(got, want),
                "{b:?} f16·f32 n={n}: {got:e} vs {want:e}"
            );
        }
    }
}

#[test]
fn matmul_is_the_same_on_every_backend_and_thread_count() {
    let scalar = Kernels::new(Backend::Scalar).unwrap();
    let mut rng = Rng(7);
    let mut pools: Vec<Matmul> = Backend::supported()
        .into_iter()
        .flat_map(|b| [1, 2, 3, 4].map(|t| Matmul::new(Kernels::new(b).unwrap(), t)))
        .collect();
    for ty in DEQUANTIZABLE {
        let kind = VecDotType::of(ty).unwrap();
        for (rows, cols, t_n) in [(1, 256, 1), (7, 512, 1), (100, 256, 3), (33, 2816, 17)] {
            let w = random_row(&mut rng, ty, rows * cols);
            let x = random_acts(&mut rng, t_n * cols);
            let m = QMatrix::new(ty, &w, rows, cols).unwrap();
            let mut acts = Activations::new();
            acts.quantize(&spec(), kind, &x, cols).unwrap();
            let mut want = vec![0f32; t_n * rows];
            for t in 0..t_n {
                for r in 0..rows {
                    want[t * rows + r] = scalar.vec_dot(ty, m.row(r), acts.row(t)).unwrap();
                }
            }
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            for mm in &mut pools {
                let mut y = vec![f32::NAN; t_n * rows];
                mm.matmul(&m, &x, &mut y).unwrap();
                let what = format!(
                    "{:?} {ty} {rows}×{cols} t={t_n} threads={}",
                    mm.kernels().backend(),
                    mm.threads()
                );
                let mut y2 = vec![f32::NAN; t_n * rows];
                mm.matmul_quantized(&m, &acts, &mut y2).unwrap();
                for y in [y, y2] {
                    let bad = y.iter().zip(&want).position(|(v, w)| v.to_bits() != *w);
                    assert_eq!(bad, None, "{what}: first differing output");
                }
            }
        }
    }
}

/// The types whose batches some backend multiplies several weight rows at a
/// time (its `RowsTable`).
const SEVERAL_ROWS: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::F16,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Batched products go through the several-row kernels (one weight row
/// against a group of tokens): every tail length of the eight-block steps
/// (32-element steps for the float types), and token counts around the group
/// sizes, against the scalar dot products.
#[test]
fn batched_matmul_matches_scalar_for_every_tail() {
    let mut rng = Rng(0x5eed_0b10c5);
    for b in Backend::supported() {
        let mut mm = Matmul::new(Kernels::new(b).unwrap(), 2);
        for ty in DEQUANTIZABLE {
            let bs = ty.block_size().max(32) as usize;
            for nb in (1..=19).chain([24, 26, 31]) {
                // Float types: every tail of the 32-element steps and of 8-element vectors.
                let cols = if ty.block_size() == 1 {
                    8 * nb + nb % 3
                } else {
                    bs * nb
                };
                // Three rows: work items of one row on two threads. Twenty,
                // for the types with several-row kernels: items of three (a
                // pair of rows and an odd one, AVX-512's Q8_0 family).
                let several = SEVERAL_ROWS.contains(&ty);
                let shapes = [2, 3, 4, 5, 8, 9, 21].map(|t| (3, t));
                let wide = [2, 3, 5, 9].map(|t| (20, t));
                for (rows, t_n) in shapes
                    .into_iter()
                    .chain(wide.into_iter().filter(|_| several))
                {
                    let w = random_row(&mut rng, ty, rows * cols);
                    let mut x = random_acts(&mut rng, (t_n * cols).next_multiple_of(32));
                    x.truncate(t_n * cols);
                    let m = QMatrix::new(ty, &w, rows, cols).unwrap();
                    assert_matmul_is_scalar(&mut mm, &m, &x, &format!("{b:?} {ty} rows={rows}"));
                }
            }
        }
    }
}

/// The lattice i-quants.
const LATTICE: [GgmlType; 7] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// A decoded token's products of the K-quants, the ternary and the lattice
/// types go several weight rows at a time (eight rows' sums in one vector),
/// or row by row where the backend finds that faster for the row's width:
/// work items of whole eights and of leftover rows, every tail of the
/// eight-block steps, rows of fewer and of more than eight blocks, one and
/// two threads, against the scalar dot products.
#[test]
fn one_token_products_of_several_rows_match_scalar() {
    let mut rng = Rng(0x0c01_0e11);
    for b in Backend::supported() {
        for threads in [1, 2] {
            let mut mm = Matmul::new(Kernels::new(b).unwrap(), threads);
            for ty in [
                GgmlType::Q4_K,
                GgmlType::Q5_K,
                GgmlType::Q6_K,
                GgmlType::Q2_K,
                GgmlType::TQ1_0,
                GgmlType::TQ2_0,
            ]
            .into_iter()
            .chain(LATTICE)
            {
                for nb in (1..=18).chain([24, 35]) {
                    let cols = 256 * nb;
                    for rows in [8, 13, 77] {
                        let w = random_row(&mut rng, ty, rows * cols);
                        let x = random_acts(&mut rng, cols);
                        let m = QMatrix::new(ty, &w, rows, cols).unwrap();
                        let what = format!("{b:?} {ty} threads={threads}");
                        assert_matmul_is_scalar(&mut mm, &m, &x, &what);
                    }
                }
            }
        }
    }
}

/// Batches of eight tokens or more take the tiled products of the K-quants,
/// IQ4_XS and the lattice i-quants (rows unpacked into panels of sixteen, tokens in groups of
/// eight): ragged panels and groups, one and several work items (129 rows on
/// one thread: three panels, a pair and one), one and two threads, against
/// the scalar dot products.
#[test]
fn tiled_products_match_scalar_for_ragged_rows_and_tokens() {
    let mut rng = Rng(0x7113_d0c5);
    let types = [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
    ];
    for b in Backend::supported() {
        for threads in [1, 2] {
            let mut mm = Matmul::new(Kernels::new(b).unwrap(), threads);
            for ty in types.into_iter().chain(LATTICE) {
                for (rows, nb) in [(1, 1), (16, 3), (17, 9), (70, 2), (129, 1), (129, 9)] {
                    let cols = 256 * nb;
                    for t_n in [8, 9, 16, 17, 40] {
                        let w = random_row(&mut rng, ty, rows * cols);
                        let x = random_acts(&mut rng, t_n * cols);
                        let m = QMatrix::new(ty, &w, rows, cols).unwrap();
                        let what = format!("{b:?} {ty} threads={threads}");
                        assert_matmul_is_scalar(&mut mm, &m, &x, &what);
                    }
                }
            }
        }
    }
}

/// The integer sums at their extremes: every weight quant at the top or the
/// bottom of its range against activations that all quantize to +127 or
/// −127, so each lane of a block's integer sum is as large as the format
/// allows (kernels that keep byte-pair sums in 16 bits before widening
/// them must not wrap or saturate). Several tokens, so the several-row
/// products run too, on every backend and against the scalar `vec_dot`.
#[test]
fn extreme_quants_sum_exactly_in_every_product() {
    for b in Backend::supported() {
        let mut mm = Matmul::new(Kernels::new(b).unwrap(), 2);
        for ty in DEQUANTIZABLE {
            if ty.block_size() == 1 {
                continue; // float weights have no integer sums
            }
            let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
            let cols = bs.max(32) * 17;
            // Rows: every byte but the scales 0xff, 0x00, 0x7f, 0x80, or 0xff and
            // 0x00 alternating (top and bottom nibbles, high bits, Q8_0's ends,
            // IQ4_NL's grid ends); scales 0.5.
            let fills: [fn(usize) -> u8; 5] = [
                |_| 0xff,
                |_| 0x00,
                |_| 0x7f,
                |_| 0x80,
                |i| [0xff, 0x00][i % 2],
            ];
            let mut w = Vec::new();
            for fill in fills {
                let mut row: Vec<u8> = (0..cols / bs * ts).map(|i| fill(i % ts)).collect();
                for blk in row.chunks_exact_mut(ts) {
                    for &o in scale_fields(ty) {
                        blk[o..o + 2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
                    }
                }
                w.extend(row);
            }
            let rows = fills.len();
            let m = QMatrix::new(ty, &w, rows, cols).unwrap();
            // Tokens: all +1, all −1, alternating signs by element and by pair.
            let tokens: [fn(usize) -> f32; 4] = [
                |_| 1.0,
                |_| -1.0,
                |i| if i % 2 == 0 { 1.0 } else { -1.0 },
                |i| if i / 2 % 2 == 0 { 1.0 } else { -1.0 },
            ];
            let mut x = Vec::new();
            for _ in 0..5 {
                for f in tokens {
                    x.extend((0..cols).map(f));
                }
            }
            assert_matmul_is_scalar(&mut mm, &m, &x, &format!("{b:?} {ty}"));
        }
    }
}

/// F16 products run in tiles of several weight rows × several tokens: every
/// remainder of rows and tokens per task, and every column tail of the
/// 16- and 32-column steps, against the scalar dot products.
#[test]
fn f16_tiles_match_scalar_for_every_remainder() {
    let mut rng = Rng(0xf16_7113);
    let ty = GgmlType::F16;
    for b in Backend::supported() {
        for threads in [1, 2] {
            let mut mm = Matmul::new(Kernels::new(b).unwrap(), threads);
            // Narrow rows with every remainder of rows and tokens, and tasks
            // of more than one of AVX2's groups of tiles of rows (32 rows),
            // odd ones included (161 rows: tasks of 41 on one thread;
            // 200 rows: 50 or 25); rows at and past the widest that AVX-512
            // widens once (1024 columns), with and without a column tail,
            // against token counts that widen (more than four) and that take
            // more than one call of 16; they span two to four of AVX2's equal
            // column blocks (of at most 640), the last one with a column
            // tail (1025, 2081), in tasks of one group and of two.
            let narrow = [1, 7, 16, 17, 31, 32, 33, 48, 63, 69, 576].map(|c| {
                (
                    c,
                    &[1, 4, 12, 13, 20, 28, 161, 200][..],
                    &[1, 2, 3, 4, 5, 7, 8, 9, 17][..],
                )
            });
            let wide =
                [1024, 1025, 1056, 1536, 2081].map(|c| (c, &[4, 13, 200][..], &[3, 5, 16, 33][..]));
            for (cols, rows_n, tokens_n) in narrow.into_iter().chain(wide) {
                // One thread: tasks of rows.div_ceil(4) rows (1, 3, 4, 5, 7).
                for &rows in rows_n {
                    for &t_n in tokens_n {
                        let w = random_row(&mut rng, ty, rows * cols);
                        let mut x = random_acts(&mut rng, (t_n * cols).next_multiple_of(32));
                        x.truncate(t_n * cols);
                        let m = QMatrix::new(ty, &w, rows, cols).unwrap();
                        assert_matmul_is_scalar(
                            &mut mm,
                            &m,
                            &x,
                            &format!("{b:?} {threads} threads"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn shapes_and_backends_are_checked() {
    assert!(matches!(
        QMatrix::new(GgmlType::Q4_0, &[0; 18], 1, 64),
        Err(KernelError::Shape(_))
    ));
    assert!(matches!(
        QMatrix::new(GgmlType::Q4_0, &[0; 18], 1, 16),
        Err(KernelError::Shape(_))
    ));
    assert_eq!(
        QMatrix::new(GgmlType::Q8_K, &[], 0, 256).unwrap_err(),
        KernelError::UnsupportedType(GgmlType::Q8_K)
    );
    let m = QMatrix::new(GgmlType::Q8_0, &[0; 68], 2, 32).unwrap();
    let mut mm = Matmul::new(Kernels::detect(), 2);
    assert!(matches!(
        mm.matmul(&m, &[0.0; 32], &mut [0.0; 3]),
        Err(KernelError::Shape(_))
    ));
    assert!(matches!(
        mm.matmul(&m, &[0.0; 33], &mut [0.0; 2]),
        Err(KernelError::Shape(_))
    ));
    let k = Kernels::detect();
    let a = [BlockQ8_1::default()];
    assert!(matches!(
        k.vec_dot(GgmlType::Q8_0, &[0; 34], ActRow::Q8_1(&a)),
        Err(KernelError::ActivationType { .. })
    ));
    for b in Backend::ALL {
        assert_eq!(Backend::parse(b.name()), Ok(b));
        assert_eq!(Kernels::new(b).is_ok(), b.is_supported());
        if !b.is_supported() {
            assert_eq!(
                Kernels::new(b).unwrap_err(),
                KernelError::UnsupportedBackend(b.name())
            );
        }
    }
    assert!(matches!(
        Backend::parse("sse2"),
        Err(KernelError::UnknownBackend(_))
    ));
    assert!(Backend::Scalar.is_supported());
    // The SIMD suites above must not silently test nothing on the two lanes we run.
    #[cfg(target_arch = "aarch64")]
    assert!(Backend::supported().contains(&Backend::Neon));
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        Backend::supported().contains(&Backend::Avx2),
        std::arch::is_x86_feature_detected!("avx2")
    );
}

/// Matrices reading one input share its quantized activations: the same
/// outputs as products of their own, also when the next matrix needs
/// another kind (quantized again), when another product came in between,
/// and when the input's shape changed.
#[test]
fn shared_inputs_give_the_products_of_their_own() {
    let mut rng = Rng(0x005a_4ed1);
    let (rows, cols, t_n) = (21, 512, 5);
    let x = random_acts(&mut rng, t_n * cols);
    let other = random_acts(&mut rng, t_n * cols);
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::F16,
        GgmlType::Q6_K,
    ];
    let weights: Vec<Vec<u8>> = types
        .iter()
        .map(|&ty| random_row(&mut rng, ty, rows * cols))
        .collect();
    for b in Backend::supported() {
        let kernels = Kernels::new(b).unwrap();
        let mut own = Matmul::new(kernels, 2);
        let mut mm = Matmul::new(kernels, 2);
        let mut shared = None;
        for (i, (&ty, w)) in types.iter().zip(&weights).enumerate() {
            let m = QMatrix::new(ty, w, rows, cols).unwrap();
            let mut want = vec![0f32; t_n * rows];
            own.matmul(&m, &x, &mut want).unwrap();
            if i == 2 {
                // A product of another input in between: the name is stale.
                let mut y = vec![0f32; t_n * rows];
                mm.matmul(&m, &other, &mut y).unwrap();
            }
            for _ in 0..2 {
                let mut got = vec![f32::NAN; t_n * rows];
                mm.matmul_sharing(&m, &x, &mut got, &mut shared).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{b:?} {ty} (matrix {i})");
            }
            assert!(shared.is_some());
        }
        // Fewer tokens under the same name: quantized again.
        let m = QMatrix::new(types[0], &weights[0], rows, cols).unwrap();
        let mut want = vec![0f32; 2 * rows];
        own.matmul(&m, &x[..2 * cols], &mut want).unwrap();
        let mut got = vec![f32::NAN; 2 * rows];
        mm.matmul_sharing(&m, &x[..2 * cols], &mut got, &mut shared)
            .unwrap();
        assert_eq!(got, want, "{b:?} after a change of shape");
        // A name from another context never matches: `b2` holds `other`,
        // quantized as its first input as `a`'s first input was `x`.
        let (mut a, mut b2) = (Matmul::new(kernels, 2), Matmul::new(kernels, 2));
        let mut name = None;
        let mut fresh = vec![0f32; t_n * rows];
        a.matmul_sharing(&m, &x, &mut fresh, &mut name).unwrap();
        b2.matmul(&m, &other, &mut vec![0f32; t_n * rows]).unwrap();
        let mut got = vec![f32::NAN; t_n * rows];
        b2.matmul_sharing(&m, &x, &mut got, &mut name).unwrap();
        assert_eq!(got, fresh, "{b:?} with another context's name");
    }
}
