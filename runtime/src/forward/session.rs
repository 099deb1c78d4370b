//! The KV cache of one sequence and the views of it attention reads.

use super::*;

/// What the KV cache stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// `f16`, llama.cpp's default; queries are rounded to `f16` for `Q·K` too.
    #[default]
    F16,
    /// `f32`: exact, for comparisons with a float32 reference.
    F32,
}

/// One layer's keys or values: position-major, then head, then dimension.
#[derive(Clone)]
pub(super) enum Cache {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Cache {
    pub(super) fn len(&self) -> usize {
        match self {
            Cache::F16(c) => c.len(),
            Cache::F32(c) => c.len(),
        }
    }

    pub(super) fn truncate(&mut self, n: usize) {
        match self {
            Cache::F16(c) => c.truncate(n),
            Cache::F32(c) => c.truncate(n),
        }
    }

    pub(super) fn extend(&mut self, kernels: &Kernels, values: &[f32]) {
        match self {
            Cache::F16(c) => {
                let at = c.len();
                c.resize(at + values.len(), 0);
                kernels.narrow_f16(values, &mut c[at..]);
            }
            Cache::F32(c) => c.extend_from_slice(values),
        }
    }

    /// Values `start..start + out.len()`, as `f32`.
    pub(super) fn read(&self, kernels: &Kernels, start: usize, out: &mut [f32]) {
        match self {
            Cache::F16(c) => kernels.widen_f16(&c[start..start + out.len()], out),
            Cache::F32(c) => out.copy_from_slice(&c[start..start + out.len()]),
        }
    }
}

/// The keys and values attention reads: the cache itself, or (for a batch)
/// its first positions decoded to `f32`, laid out head by head.
pub(super) enum Kv<'c> {
    Cache(&'c Cache, &'c Cache),
    /// Keys transposed, `[head][dim][pos]` with `stride` positions per dim
    /// (padded with zeros to a multiple of [`KEY_TILE`]); values `[head][pos][dim]`.
    Dense {
        kt: &'c [f32],
        stride: usize,
        v: &'c [f32],
    },
}

/// The first `n` positions of `cache` as `f32`, head by head: `[head][pos][dim]`,
/// written over every value of `out` (`n` times the KV width).
pub(super) fn by_head(
    k: &Kernels,
    cache: &Cache,
    n: usize,
    c: &Config,
    mut out: Vec<f32>,
) -> Vec<f32> {
    let (heads, hd) = (c.n_head_kv, c.head_dim);
    let kvd = heads * hd;
    assert_eq!(out.len(), n * kvd, "by_head buffer");
    for (h, dst) in out.chunks_exact_mut(n * hd).enumerate() {
        for (j, d) in dst.chunks_exact_mut(hd).enumerate() {
            cache.read(k, j * kvd + h * hd, d);
        }
    }
    out
}

/// The first `n` positions of `cache` as `f32`, transposed head by head:
/// `[head][dim][pos]`, each dim padded with zeros to the returned stride (a
/// multiple of [`KEY_TILE`]), in `out`: zeros, the KV width times `n`
/// rounded up to [`KEY_TILE`].
pub(super) fn by_head_transposed(
    k: &Kernels,
    cache: &Cache,
    n: usize,
    c: &Config,
    mut out: Vec<f32>,
) -> (Vec<f32>, usize) {
    let (heads, hd) = (c.n_head_kv, c.head_dim);
    let kvd = heads * hd;
    let stride = n.next_multiple_of(KEY_TILE);
    assert_eq!(out.len(), heads * hd * stride, "by_head_transposed buffer");
    let mut row = vec![0f32; hd];
    for (h, dst) in out.chunks_exact_mut(hd * stride).enumerate() {
        for j in 0..n {
            cache.read(k, j * kvd + h * hd, &mut row);
            for (d, &x) in row.iter().enumerate() {
                dst[d * stride + j] = x;
            }
        }
    }
    (out, stride)
}

/// The KV cache and position of one sequence.
pub struct Session {
    pub(super) k: Vec<Cache>,
    pub(super) v: Vec<Cache>,
    /// Per layer, the state of a gated delta-net layer (empty for attention
    /// layers): [`Linear::state_values`] values.
    pub(super) state: Vec<Vec<f32>>,
    pub(super) n_past: usize,
}

impl Session {
    /// Tokens already in the cache.
    pub fn len(&self) -> usize {
        self.n_past
    }

    /// Whether nothing has been evaluated yet.
    pub fn is_empty(&self) -> bool {
        self.n_past == 0
    }

    /// Forgets everything after the first `n` tokens (keeps the cache's
    /// memory). The state of a linear-attention layer holds all its tokens at
    /// once and cannot step back, so a model with such layers forgets
    /// everything instead: [`Session::len`] says what is kept.
    pub fn truncate(&mut self, n: usize) {
        if n < self.n_past {
            let n = if self.state.iter().any(|s| !s.is_empty()) {
                0
            } else {
                n
            };
            let per = |c: &Cache| c.len() / self.n_past;
            for c in self.k.iter_mut().chain(self.v.iter_mut()) {
                let keep = per(c) * n;
                c.truncate(keep);
            }
            if n == 0 {
                self.state.iter_mut().for_each(|s| s.fill(0.0));
            }
            self.n_past = n;
        }
    }

    /// Bytes of the linear-attention layers' state (constant: it does not
    /// grow with the context).
    pub fn state_bytes(&self) -> usize {
        self.state.iter().map(|s| s.len() * 4).sum()
    }
}

impl<'a> Model<'a> {
    /// An empty session with room for `config.n_ctx` tokens.
    ///
    /// The cache is reserved for the whole context at once: address space
    /// only (the system backs pages when tokens are written), and it never
    /// moves, so memory grows with the tokens held and nothing else (growing
    /// by doubling left freed copies in the heap: peak RSS jumped by a whole
    /// cache's size at powers of two).
    pub fn session(&self) -> Session {
        let c = &self.config;
        let n = c.n_ctx.saturating_mul(c.n_head_kv * c.head_dim);
        // A reservation the system refuses only costs the guarantee above.
        fn reserved<T>(n: usize) -> Vec<T> {
            let mut v = Vec::new();
            let _ = v.try_reserve_exact(n);
            v
        }
        // Linear-attention layers keep no cache: their state instead.
        let empty = |l: usize| {
            let n = match self.layers[l].mixer {
                Mixer::Attention(_) => n,
                Mixer::Linear(_) => 0,
            };
            match c.kv_type {
                KvType::F16 => Cache::F16(reserved(n)),
                KvType::F32 => Cache::F32(reserved(n)),
            }
        };
        let state = |l: usize| match &self.layers[l].mixer {
            Mixer::Attention(_) => Vec::new(),
            Mixer::Linear(d) => vec![0f32; d.lin.state_values()],
        };
        Session {
            k: (0..c.n_layer).map(empty).collect(),
            v: (0..c.n_layer).map(empty).collect(),
            state: (0..c.n_layer).map(state).collect(),
            n_past: 0,
        }
    }
}
