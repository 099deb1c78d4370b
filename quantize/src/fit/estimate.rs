//! Memory footprint and decode speed of a quantized model on a device.
//!
//! Memory (what the process holds with `--no-mmap`, or what must stay
//! resident): the file (tensor data and header), the KV cache at the context
//! length, the working buffers of one batch, and the process's own overhead.
//! memwall's own runtime is modelled from how it allocates (the constants are
//! fitted to peak RSS measured on tiny-zh and SmolLM2, see docs/PLAN.md);
//! llama.cpp's buffers are estimated from its graph (logits of a micro-batch,
//! activations) and are coarser.
//!
//! Speed of decoding one token: the slower of reading its bytes from RAM at
//! the device's effective bandwidth and multiplying its weights at the
//! device's compute rate, plus the part of the faster one the kernels do not
//! overlap (`overlap_loss`), plus reading from flash whatever is not resident.

use memwall_format::GgmlType;

use super::{Device, Shape, Weights};

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// 16-bit floats (memwall's and llama.cpp's default).
    F16,
    /// 8-bit blocks (llama.cpp's `-ctk q8_0 -ctv q8_0`).
    Q8_0,
    /// 32-bit floats.
    F32,
}

impl KvType {
    /// Parses `f16`, `q8_0`, `f32`.
    pub fn parse(s: &str) -> Option<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            "f32" => Some(KvType::F32),
            _ => None,
        }
    }

    /// llama.cpp's name.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        }
    }

    /// Bytes of `n` cached values.
    pub fn bytes(self, n: u64) -> u64 {
        match self {
            KvType::F16 => n * 2,
            KvType::F32 => n * 4,
            KvType::Q8_0 => n.div_ceil(32) * 34,
        }
    }
}

/// Which runtime the footprint is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// memwall's own runtime (`memwall run`).
    Memwall,
    /// llama.cpp's `llama-cli` / `llama-server` on the CPU.
    LlamaCpp,
}

/// Bytes a running model holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// The model file (tensor data and header).
    pub weights: u64,
    /// The KV cache at the context length.
    pub kv: u64,
    /// The linear-attention layers' recurrent state (hybrid stacks): the same
    /// at any context length.
    pub state: u64,
    /// Activations, logits and scratch of one batch.
    pub compute: u64,
    /// The process itself: code, allocator, parsed metadata and tokenizer.
    pub overhead: u64,
    /// Of `overhead`, the program's code and libraries: pages backed by
    /// files, which the system may drop and read again, so a peak RSS holds
    /// as many of them as the page cache happens to (0: not told apart).
    pub code: u64,
}

impl Footprint {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.state + self.compute + self.overhead
    }
}

/// What the footprint depends on besides the shape.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Size of the model file(s).
    pub file_bytes: u64,
    /// Bytes of the GGUF header (metadata and tensor infos), part of `file_bytes`.
    pub header_bytes: u64,
    /// Context length.
    pub ctx: u64,
    /// Prompt batch size.
    pub batch: u64,
    /// KV cache type.
    pub kv: KvType,
}

/// Process baseline of memwall's runtime: code, libc, allocator arenas, the
/// thread pool (fitted to peak RSS of tiny-zh and SmolLM2, docs/PLAN.md).
const MEMWALL_BASE: u64 = 7_000_000;
/// Of [`MEMWALL_BASE`], the resident code and libraries (the file-backed
/// RSS of a release build's `run`, docs/PLAN.md).
const MEMWALL_CODE: u64 = 6_500_000;
/// Memory per byte of GGUF header besides the header itself: the parsed
/// metadata (every vocabulary entry a `String`), the tokenizer's maps and
/// merge ranks (fitted as above: 6 144 and 49 152-entry vocabularies).
const MEMWALL_HEADER_FACTOR: f64 = 9.5;
/// llama.cpp's process baseline (ggml context, threads, sampler).
const LLAMA_BASE: u64 = 24 << 20;

/// The footprint of `shape` loaded from a file as described by `load`.
pub fn footprint(runtime: Runtime, shape: &Shape, load: &Load) -> Footprint {
    let ctx = load.ctx.max(1);
    let kv = shape.kv_bytes(load.kv, ctx);
    let e = shape.n_embd;
    let q = u64::from(shape.n_head) * shape.head_dim;
    let kvd = u64::from(shape.n_head_kv) * shape.head_dim;
    let ff = if shape.n_expert > 0 {
        shape.n_ff_expert * u64::from(shape.n_expert_used) + u64::from(shape.n_expert)
    } else {
        shape.n_ff
    };
    let batch = load.batch.clamp(1, ctx);
    match runtime {
        Runtime::Memwall => {
            // Per prompt token: x, h, the attention and FFN results (e each),
            // q and the attention output, k and v, gate, up (and the product),
            // the rope table; all f32.
            let per_token = 4 * (4 * e + 2 * q + 2 * kvd + 3 * ff + shape.head_dim);
            // Batch attention decodes every KV head's keys (transposed) and
            // values to f32 for the whole context.
            let attention = 2 * ctx * kvd * 4;
            // Logits of the last token, the sampler's copy and candidates.
            let logits = shape.n_vocab * 4 * 3;
            let overhead = MEMWALL_BASE + (load.header_bytes as f64 * MEMWALL_HEADER_FACTOR) as u64;
            Footprint {
                weights: load.file_bytes,
                kv,
                state: shape.recurrent_state_bytes(),
                compute: batch * per_token + attention + logits,
                overhead,
                code: MEMWALL_CODE,
            }
        }
        Runtime::LlamaCpp => {
            // ggml's compute buffer holds the graph of one micro-batch
            // (n_ubatch ≤ 512): logits for it and the widest activations; the
            // output buffer holds one row of logits per sequence.
            let ubatch = batch.min(512);
            let compute = ubatch * 4 * (shape.n_vocab + 4 * e + 3 * ff)
                + ubatch * u64::from(shape.n_head) * ctx.min(4096) * 4 / 8
                + shape.n_vocab * 4;
            Footprint {
                weights: load.file_bytes,
                kv,
                state: shape.recurrent_state_bytes(),
                compute,
                overhead: LLAMA_BASE + load.header_bytes,
                code: 0,
            }
        }
    }
}

/// Estimated decode speed and what limits it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speed {
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Bound from RAM bandwidth alone.
    pub ram_bound: f64,
    /// Bound from compute alone.
    pub compute_bound: f64,
    /// Bound from flash reads alone (streaming), when some weights are not resident.
    pub flash_bound: Option<f64>,
    /// Bytes one token reads (weights and KV cache).
    pub bytes_per_token: u64,
    /// Of those, bytes read from storage.
    pub flash_bytes_per_token: u64,
}

impl Speed {
    /// What limits the speed: `"memory bandwidth"`, `"compute"` or `"flash"`.
    pub fn limit(&self) -> &'static str {
        match self.flash_bound {
            Some(f) if f < self.ram_bound.min(self.compute_bound) => "flash",
            _ if self.ram_bound <= self.compute_bound => "memory bandwidth",
            _ => "compute",
        }
    }
}

/// Decode speed of `weights` on `device` with `kv_tokens` tokens in the cache,
/// when `resident` bytes of the weights stay in RAM (the rest streams from
/// flash: [`Weights::streamed_bytes_per_token`]).
pub fn decode_speed(
    device: &Device,
    shape: &Shape,
    weights: &Weights,
    kv: KvType,
    kv_tokens: u64,
    resident: u64,
) -> Speed {
    let (n_exp, used) = (shape.n_expert, shape.n_expert_used);
    let total = weights.bytes();
    let token = Token {
        weight_bytes: weights.bytes_per_token(n_exp, used),
        // A linear layer reads and writes its whole state once per token.
        kv_bytes: shape.kv_bytes(kv, kv_tokens) + 2 * shape.recurrent_state_bytes(),
        products: weights.products_per_token(n_exp, used),
        // q·k and p·v over the cache: two multiply-adds per cached value;
        // the delta rule: three per value of a linear layer's state.
        attention: shape.attention_ops(kv_tokens) + 3 * shape.recurrent_state_bytes() / 4,
        streamed_share: match weights.bytes_per_token(n_exp, used) {
            0 => 0.0,
            b => weights.streamed_bytes_per_token(n_exp, used, resident) as f64 / b as f64,
        },
        dispatches: shape.dispatches_per_token(),
        model_bytes: total,
    };
    token_speed(device, &token)
}

/// What decoding one token reads and computes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Token {
    /// Weight bytes read.
    pub weight_bytes: u64,
    /// KV cache bytes read.
    pub kv_bytes: u64,
    /// Weights multiplied, per type.
    pub products: Vec<(GgmlType, u64)>,
    /// Multiply-adds of attention over the cache.
    pub attention: u64,
    /// Share of the weight bytes that is not resident and comes from flash.
    pub streamed_share: f64,
    /// Matrix products (each pays the device's dispatch cost).
    pub dispatches: u64,
    /// Bytes of all weights (decides cache-resident or streaming).
    pub model_bytes: u64,
}

/// Decode speed of one token's work on `device`.
pub fn token_speed(device: &Device, token: &Token) -> Speed {
    let bytes = token.weight_bytes + token.kv_bytes;
    let t_ram = bytes as f64 / (device.ram_bandwidth * device.bandwidth_efficiency);
    // Dispatch is part of the compute side: threads waking up read nothing.
    let t_compute: f64 = token
        .products
        .iter()
        .map(|(ty, n)| *n as f64 / device.compute_for(*ty))
        .sum::<f64>()
        + token.attention as f64 / device.compute_for(GgmlType::F16)
        + token.dispatches as f64 * device.dispatch;
    // A measured profile knows what its kernels reach on weights streaming
    // from RAM: that replaces both bounds for models larger than its caches.
    let streaming = token.model_bytes > device.cache_bytes
        && !token.products.is_empty()
        && token
            .products
            .iter()
            .all(|(ty, _)| device.streaming_for(*ty).is_some());
    let t_compute = if streaming {
        let t: f64 = token
            .products
            .iter()
            .map(|(ty, n)| *n as f64 / device.streaming_for(*ty).unwrap_or(1.0))
            .sum::<f64>()
            + token.attention as f64 / device.compute_for(GgmlType::F16)
            + token.dispatches as f64 * device.dispatch;
        t.max(t_ram)
    } else {
        t_compute
    };
    let flash_bytes =
        (token.weight_bytes as f64 * token.streamed_share.clamp(0.0, 1.0)).round() as u64;
    let t_flash = flash_bytes as f64 / device.storage_read;
    let rate = |t: f64| if t > 0.0 { 1.0 / t } else { f64::INFINITY };
    Speed {
        tokens_per_s: rate(if streaming {
            t_compute + t_flash
        } else {
            t_ram.max(t_compute) + device.overlap_loss * t_ram.min(t_compute) + t_flash
        }),
        ram_bound: rate(t_ram),
        compute_bound: rate(t_compute),
        flash_bound: (flash_bytes > 0).then(|| rate(t_flash)),
        bytes_per_token: bytes,
        flash_bytes_per_token: flash_bytes,
    }
}
