//! `memwall plan --measure-host`: a device profile of the machine memwall runs
//! on — RAM from /proc/meminfo, memory read bandwidth (a streaming sum over a
//! buffer larger than the caches), decode kernel throughput per ggml type
//! (memwall's own matrix-vector products on cache-resident weights), and
//! storage reads (a file written, dropped from the page cache, read back).

use std::io::{Read, Seek, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use memwall_format::GgmlType;
use memwall_quantize::fit::Device;
use memwall_runtime::kernels::Kernels;
use memwall_runtime::kernels::{Matmul, QMatrix};

use super::Args;

/// The types whose decode throughput is measured.
const TYPES: [GgmlType; 13] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::IQ4_NL,
    GgmlType::Q6_K,
    GgmlType::Q5_K,
    GgmlType::Q4_K,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q3_K,
    GgmlType::IQ4_XS,
];

pub fn run(args: &Args) -> Result<()> {
    if let Some(path) = &args.save {
        crate::commands::check_output_file(path, "the device profile")?;
    }
    let threads = args.threads.unwrap_or_else(crate::args::all_cores);
    let (total, available) = meminfo().context("cannot read /proc/meminfo")?;
    if !args.json {
        eprintln!("measuring memory bandwidth, decode kernels and storage on {threads} threads…");
    }
    let bandwidth = memory_bandwidth(threads, available);
    let mut by_type = Vec::new();
    for ty in TYPES {
        by_type.push((ty, kernel_rate(ty, threads)?));
    }
    let storage = storage_read().unwrap_or(1e9);
    let dispatch = dispatch_cost(threads)?;
    let q8 = by_type
        .iter()
        .find(|(t, _)| *t == GgmlType::Q8_0)
        .map_or(1e9, |(_, r)| *r);
    let overlap_loss = overlap_loss(threads, available, bandwidth, q8, dispatch)?;
    let compute = by_type
        .iter()
        .find(|(t, _)| *t == GgmlType::Q4_K)
        .map_or(1e9, |(_, r)| *r);
    let mut device = Device {
        name: "this-machine".into(),
        description: format!(
            "measured by memwall plan --measure-host on {}",
            hostname().unwrap_or_else(|| "this host".into())
        ),
        ram_bytes: total,
        os_reserve_bytes: total.saturating_sub(available),
        ram_bandwidth: bandwidth,
        // The read loop measures what streaming code reaches; decode reads
        // weights the same way.
        bandwidth_efficiency: 1.0,
        storage_read: storage,
        threads: threads as u32,
        compute,
        compute_by_type: by_type,
        dispatch,
        overlap_loss,
        streaming_by_type: Vec::new(),
        cache_bytes: 32 << 20,
    };
    for ty in TYPES {
        device
            .streaming_by_type
            .push((ty, streaming_rate(ty, threads, available)?));
    }
    // What a real decode step costs beyond its products' arithmetic and
    // reads (attention, norms, thread hand-offs): measured on tiny-zh.
    device.dispatch = forward_dispatch(threads, &device)?.max(device.dispatch);
    let text = device.to_toml();
    if let Some(path) = &args.save {
        let mut f = memwall_format::atomic::AtomicFile::create(path)
            .with_context(|| format!("{}: cannot write", path.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.commit())
            .with_context(|| format!("{}: cannot write", path.display()))?;
        if !args.json {
            eprintln!(
                "saved to {}; plan with: memwall plan MODEL --device {}",
                path.display(),
                path.display()
            );
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&super::device_json(&device))?
        );
    } else {
        print!("{text}");
    }
    Ok(())
}

fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Bytes/s of a multi-threaded streaming sum over a buffer of 1 GiB (or a
/// quarter of the free memory), best of five passes.
fn memory_bandwidth(threads: usize, available: u64) -> f64 {
    let bytes = (1u64 << 30).min(available / 4).max(64 << 20) as usize;
    let words = vec![1u64; bytes / 8];
    let chunk = words.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let started = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = words
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().fold(0u64, |a, &b| a.wrapping_add(b))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        std::hint::black_box(sum);
        best = best.min(started.elapsed().as_secs_f64());
    }
    bytes as f64 / best
}

/// Weights/s of memwall's matrix-vector product for `ty` on a 4096 × 1024
/// matrix (cache-resident, so this is the kernels' compute rate).
fn kernel_rate(ty: GgmlType, threads: usize) -> Result<f64> {
    let (rows, cols) = (4096usize, 1024usize);
    let row_bytes = ty.tensor_size(&[cols as u64])?.bytes as usize;
    let mut data = vec![0u8; rows * row_bytes];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut src = vec![0f32; cols];
    for r in 0..rows {
        for v in &mut src {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
        }
        memwall_quantize::quantize_row(ty, &src, &mut data[r * row_bytes..(r + 1) * row_bytes])?;
    }
    let w = QMatrix::new(ty, &data, rows, cols)?;
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut y = vec![0f32; rows];
    let mut mm = Matmul::new(Kernels::detect(), threads);
    mm.matmul(&w, &x, &mut y)?;
    let mut n = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(300) {
        mm.matmul(&w, &x, &mut y)?;
        n += 1;
    }
    Ok((rows * cols) as f64 * n as f64 / started.elapsed().as_secs_f64())
}

/// Seconds per call of a tiny (64 × 256, Q8_0) matrix-vector product: the
/// fixed cost of a product (threads woken and joined), not its arithmetic.
fn dispatch_cost(threads: usize) -> Result<f64> {
    let (rows, cols) = (64usize, 256usize);
    let ty = GgmlType::Q8_0;
    let row_bytes = ty.tensor_size(&[cols as u64])?.bytes as usize;
    let src: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.11).cos()).collect();
    let mut data = vec![0u8; rows * row_bytes];
    for r in 0..rows {
        memwall_quantize::quantize_row(ty, &src, &mut data[r * row_bytes..(r + 1) * row_bytes])?;
    }
    let w = QMatrix::new(ty, &data, rows, cols)?;
    let mut y = vec![0f32; rows];
    let mut mm = Matmul::new(Kernels::detect(), threads);
    mm.matmul(&w, &src, &mut y)?;
    let mut n = 0u32;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(200) {
        mm.matmul(&w, &src, &mut y)?;
        n += 1;
    }
    Ok(started.elapsed().as_secs_f64() / f64::from(n.max(1)))
}

/// Seconds per matrix product a real decode step spends beyond what the
/// profile so far predicts: the built-in tiny-zh converted to F16, three times
/// 64 tokens decoded one at a time, the difference to the prediction spread
/// over the step's units (products and attention heads).
fn forward_dispatch(threads: usize, device: &Device) -> Result<f64> {
    use memwall_format::gguf::GgufModel;
    use memwall_quantize::fit::{KvType, Shape, Weights, decode_speed, gguf_tensors};
    use memwall_runtime::forward::Model;
    let dir = std::env::temp_dir().join(format!("memwall-measure-{}", std::process::id()));
    let result = (|| -> Result<f64> {
        let ckpt = dir.join("tiny-zh");
        crate::commands::demo::unpack_checkpoint(&ckpt)?;
        let out = dir.join("tiny-zh-f16.gguf");
        let encode = |ty: GgmlType,
                      x: &[f32],
                      y: &mut [u8]|
         -> Result<(), memwall_convert::tensors::RowEncodeError> {
            Ok(memwall_quantize::quantize_row(ty, x, y)?)
        };
        let options = memwall_convert::job::Options {
            outtype: memwall_convert::tensors::OutType::F16,
            pre: Some("gpt-2".into()),
            encode: &encode,
            allow_nonfinite: false,
            split_max_size: None,
            no_mtp: false,
        };
        memwall_convert::job::convert(&ckpt, &out, &options, &crate::progress::Bar::new(false))?;
        let gguf = GgufModel::open(&out)?;
        let mut model = Model::new(&gguf, 256)?;
        model.set_compute(Kernels::detect(), threads);
        // As `memwall bench -n 64`: a warm-up pass, then the mean of three
        // 64-token decodes from an empty cache.
        let n = 64u32;
        let mut total = 0.0;
        for pass in 0..4 {
            let mut session = model.session();
            let started = Instant::now();
            for id in 0..n {
                model.forward(&mut session, &[200 + id])?;
            }
            if pass > 0 {
                total += started.elapsed().as_secs_f64();
            }
        }
        let measured = total / f64::from(3 * n);
        let shape = Shape::from_gguf(&gguf)?;
        let weights = Weights::as_stored(&gguf_tensors(&gguf))?;
        let mut bare = device.clone();
        bare.dispatch = 0.0;
        // 32 tokens in the cache on average.
        let speed = decode_speed(&bare, &shape, &weights, KvType::F16, 32, u64::MAX);
        let extra = measured - 1.0 / speed.tokens_per_s;
        Ok((extra / shape.dispatches_per_token() as f64).max(0.0))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A product over 256 MiB (or an eighth of the free memory) of `ty` weights,
/// more than any cache holds: (seconds of the best of three, bytes, weights).
/// Every row holds the same values; the bytes still have to come from memory.
fn streaming_product(ty: GgmlType, threads: usize, available: u64) -> Result<(f64, usize, usize)> {
    let cols = 4096usize;
    let row_bytes = ty.tensor_size(&[cols as u64])?.bytes as usize;
    let bytes = (256u64 << 20).min(available / 8).max(16 << 20) as usize;
    let rows = bytes / row_bytes;
    let src: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-4 - 0.05)
        .collect();
    let mut one = vec![0u8; row_bytes];
    memwall_quantize::quantize_row(ty, &src, &mut one)?;
    let data: Vec<u8> = one.iter().copied().cycle().take(rows * row_bytes).collect();
    let w = QMatrix::new(ty, &data, rows, cols)?;
    let mut y = vec![0f32; rows];
    let mut mm = Matmul::new(Kernels::detect(), threads);
    mm.matmul(&w, &src, &mut y)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        mm.matmul(&w, &src, &mut y)?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok((best, data.len(), rows * cols))
}

/// Weights/s of memwall's matrix-vector product for `ty` when the weights
/// stream from RAM: what the kernels reach when reads and arithmetic combine.
fn streaming_rate(ty: GgmlType, threads: usize, available: u64) -> Result<f64> {
    let (seconds, _, weights) = streaming_product(ty, threads, available)?;
    Ok(weights as f64 / seconds)
}

/// How much of the shorter of memory and compute time a Q8_0 product over
/// weights that do not fit any cache fails to hide:
/// `t = max(mem, compute) + loss × min(mem, compute)`.
fn overlap_loss(
    threads: usize,
    available: u64,
    bandwidth: f64,
    q8_rate: f64,
    dispatch: f64,
) -> Result<f64> {
    let (seconds, bytes, weights) = streaming_product(GgmlType::Q8_0, threads, available)?;
    let mem = bytes as f64 / bandwidth;
    let compute = weights as f64 / q8_rate + dispatch;
    let (long, short) = (mem.max(compute), mem.min(compute));
    Ok(((seconds - long) / short).clamp(0.0, 1.0))
}

/// Bytes/s reading a 256 MiB file after dropping it from the page cache.
fn storage_read() -> Option<f64> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("memwall-measure-{}.tmp", std::process::id()));
    let result = (|| -> std::io::Result<f64> {
        let block = vec![0x5Au8; 4 << 20];
        let mut f = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        // Unlinked at once where the system allows (the open file stays
        // usable): 256 MiB that nothing, not even SIGKILL, can leave behind.
        #[cfg(unix)]
        let _ = std::fs::remove_file(&path);
        for _ in 0..64 {
            f.write_all(&block)?;
        }
        f.sync_all()?;
        drop_cache(&f);
        f.seek(std::io::SeekFrom::Start(0))?;
        let mut buf = vec![0u8; 4 << 20];
        let started = Instant::now();
        let mut total = 0usize;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        Ok(total as f64 / started.elapsed().as_secs_f64())
    })();
    let _ = std::fs::remove_file(&path);
    result.ok()
}

#[cfg(unix)]
fn drop_cache(f: &std::fs::File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call; the call
    // only advises the kernel.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    let _ = f;
}

#[cfg(not(unix))]
fn drop_cache(_: &std::fs::File) {}
