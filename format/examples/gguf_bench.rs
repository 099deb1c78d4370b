//! Timing harness for `bench/gguf.sh`: opens (mmap + full header parse) or
//! rewrites a GGUF file several times and prints the median in milliseconds.
//!
//!   cargo run --release -p memwall-runtime --example gguf_bench -- open FILE [RUNS]
//!   cargo run --release -p memwall-runtime --example gguf_bench -- copy FILE OUT [RUNS]
#![allow(clippy::print_stdout, missing_docs)]

use std::path::Path;
use std::time::Instant;

use memwall_format::gguf::{GgufFile, GgufWriter, TensorSpec};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: gguf_bench open FILE [RUNS] | copy FILE OUT [RUNS]";
    let mode = args.get(1).ok_or(usage)?;
    let file = Path::new(args.get(2).ok_or(usage)?);
    let mut times = Vec::new();
    match mode.as_str() {
        "open" => {
            let runs: usize = args.get(3).map_or(Ok(20), |s| s.parse())?;
            for _ in 0..runs {
                let t = Instant::now();
                let f = GgufFile::open(file)?;
                std::hint::black_box(f.tensors().len());
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        "copy" => {
            let out = Path::new(args.get(3).ok_or(usage)?);
            let runs: usize = args.get(4).map_or(Ok(3), |s| s.parse())?;
            for _ in 0..runs {
                let t = Instant::now();
                let src = GgufFile::open(file)?;
                let h = src.header();
                let specs = h.tensors.iter().map(TensorSpec::from).collect();
                let mut w = GgufWriter::create(out, h.version, h.metadata.clone(), specs)?;
                for t in &h.tensors {
                    w.write_tensor(&t.name, src.tensor_data(t))?;
                }
                w.commit()?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        _ => return Err(usage.into()),
    }
    println!("{:.3}", median(times));
    Ok(())
}
