//! Matrix-multiply throughput per weight type and backend: a 4096×4096 matrix
//! times 1 and 32 tokens, reported as GB/s of weight bytes read (and GFLOP/s
//! for the batch). A plain timing loop (`harness = false`), no dependency:
//!
//!   cargo bench -p memwall-runtime --bench kernels [-- TYPE... ] \
//!     (MEMWALL_BENCH_THREADS=n, default: all cores; MEMWALL_BENCH_ROWS=n;
//!     MEMWALL_BENCH_COLS=n, a multiple of 256, e.g. 576 for SmolLM2's narrow rows;
//!     MEMWALL_BENCH_TOKENS=n for the batch instead of 32, e.g. 512 as a pp512's;
//!     MEMWALL_BENCH_BACKENDS=avx512,avx2 to time only those backends)
//!
//! The filter `product` times instead `Kernels::product_f32` (one thread) as
//! calibration's Hessians call it: 36 columns of 256 tokens against the
//! tokens' `MEMWALL_BENCH_COLS` values, in GFLOP/s — `b` as it is, and packed
//! once (`product_f32_packed`, as the Hessians give it).
#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::{Duration, Instant};

use memwall_format::GgmlType;
use memwall_format::blocks::{DEQUANTIZABLE, f32_to_f16};
use memwall_runtime::kernels::{Backend, Kernels, Matmul, ProductTiles, QMatrix};

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let threads = std::env::var("MEMWALL_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rows: usize = std::env::var("MEMWALL_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    let cols: usize = std::env::var("MEMWALL_BENCH_COLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    let batch: usize = std::env::var("MEMWALL_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    if filter.iter().any(|f| f.eq_ignore_ascii_case("product")) {
        product(cols);
        return;
    }
    println!(
        "{rows}×{cols}, {threads} threads; GB/s of weights (t=1), GB/s and GFLOP/s (t={batch})"
    );
    for ty in DEQUANTIZABLE {
        if !filter.is_empty() && !filter.iter().any(|f| f.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
        let bytes = rows * cols / bs * ts;
        let mut data: Vec<u8> = (0..bytes).map(|_| rand() as u8).collect();
        // Finite scales and floats: every 2-byte word a small f16 (bf16: top bits) is valid
        // for the float types and harmless elsewhere; quantized blocks keep random quants.
        if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
            }
        } else {
            for b in data.chunks_exact_mut(ts) {
                for o in [0, 2, ts - 2, ts - 4] {
                    b[o..o + 2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
                }
            }
        }
        let w = QMatrix::new(ty, &data, rows, cols).unwrap();
        let x: Vec<f32> = (0..batch * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut line = format!("{:7}", ty.name());
        for b in backends() {
            let mut mm = Matmul::new(Kernels::new(b).unwrap(), threads);
            let t1 = time(|| {
                let mut y = vec![0f32; rows];
                mm.matmul(&w, &x[..cols], &mut y).unwrap();
            });
            let tb = time(|| {
                let mut y = vec![0f32; batch * rows];
                mm.matmul(&w, &x, &mut y).unwrap();
            });
            let gb = bytes as f64 / 1e9;
            let flops = 2.0 * batch as f64 * rows as f64 * cols as f64 / 1e9;
            line += &format!(
                "  {:>8}: t1 {:6.2} GB/s  t{batch} {:6.2} GB/s {:6.1} GFLOP/s",
                b.name(),
                gb / t1,
                batch as f64 * gb / tb,
                flops / tb
            );
        }
        println!("{line}");
    }
}

/// `product_f32` of a Hessian block: `m = 36` rows of `k = 256` tokens
/// against `k × n` inputs, every column.
fn product(n: usize) {
    let (m, k) = (36, 256);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 104_729) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0f32; m * n];
    let mut line = format!("product_f32 {m}×{k}×{n}, 1 thread:");
    for be in backends() {
        let kernels = Kernels::new(be).unwrap();
        let t = time(|| kernels.product_f32(&a, m, k, &b, n, 0..n, &mut out));
        let mut tiles = ProductTiles::default();
        tiles.pack(&b, k, n);
        let tp =
            time(|| kernels.product_f32_packed(&a, m, k, &b, tiles.tiles(), n, 0..n, &mut out));
        let gflops = |t: f64| 2.0 * (m * k * n) as f64 / t / 1e9;
        line += &format!(
            "  {}: {:6.1} GFLOP/s ({:6.1} packed)",
            be.name(),
            gflops(t),
            gflops(tp)
        );
    }
    println!("{line}");
}

/// The supported backends, or those of them `MEMWALL_BENCH_BACKENDS` names.
fn backends() -> Vec<Backend> {
    let only = std::env::var("MEMWALL_BENCH_BACKENDS").unwrap_or_default();
    Backend::supported()
        .into_iter()
        .filter(|b| only.is_empty() || only.split(',').any(|n| n.trim() == b.name()))
        .collect()
}

/// Median seconds per call over ~0.5 s (at least 3 calls), after one warm-up call.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut v = Vec::new();
    let start = Instant::now();
    while v.len() < 3 || (start.elapsed() < Duration::from_millis(500) && v.len() < 1000) {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
