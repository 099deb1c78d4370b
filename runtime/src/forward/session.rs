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

/// One layer's keys or values: position-major, then head, then dimension
/// (`width` values per position). A sliding-window layer's cache is a ring
/// of `ring` positions: position `p` lives in slot `p mod ring`, and only
/// the last `ring` positions written are held.
#[derive(Clone)]
pub(super) struct Cache {
    values: Values,
    width: usize,
    ring: Option<usize>,
}

#[derive(Clone)]
enum Values {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::F16(c) => c.len(),
            Values::F32(c) => c.len(),
        }
    }
}

impl Cache {
    /// An empty cache of `width` values per position, with room reserved
    /// for `positions` (address space only: pages are backed as written).
    pub(super) fn new(kv: KvType, width: usize, positions: usize, ring: Option<usize>) -> Cache {
        // A reservation the system refuses only costs the guarantee that the
        // cache never moves.
        fn reserved<T>(n: usize) -> Vec<T> {
            let mut v = Vec::new();
            let _ = v.try_reserve_exact(n);
            v
        }
        let n = width.saturating_mul(ring.unwrap_or(positions));
        let values = match kv {
            KvType::F16 => Values::F16(reserved(n)),
            KvType::F32 => Values::F32(reserved(n)),
        };
        Cache {
            values,
            width,
            ring,
        }
    }

    /// Positions a ring holds (`None`: every position).
    pub(super) fn ring(&self) -> Option<usize> {
        self.ring
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        match &self.values {
            Values::F16(c) => 2 * c.len(),
            Values::F32(c) => 4 * c.len(),
        }
    }

    /// Forgets the positions from `n` on (a ring keeps its slots: they are
    /// written over).
    pub(super) fn truncate(&mut self, n: usize) {
        if self.ring.is_some() {
            return;
        }
        let keep = n * self.width;
        match &mut self.values {
            Values::F16(c) => c.truncate(keep),
            Values::F32(c) => c.truncate(keep),
        }
    }

    /// Where position `pos`'s values start.
    fn at(&self, pos: usize) -> usize {
        self.ring.map_or(pos, |r| pos % r) * self.width
    }

    /// Writes the positions from `first` on (`values.len() / width` of them):
    /// a plain cache must hold exactly the positions before `first`.
    pub(super) fn extend(&mut self, kernels: &Kernels, first: usize, values: &[f32]) {
        let w = self.width;
        for (i, row) in values.chunks_exact(w).enumerate() {
            let at = self.at(first + i);
            if self.values.len() < at + w {
                // A plain cache grows by one position; a ring fills its slots
                // in order, up to `ring`.
                debug_assert_eq!(self.values.len(), at, "cache written out of order");
                match &mut self.values {
                    Values::F16(c) => c.resize(at + w, 0),
                    Values::F32(c) => c.resize(at + w, 0.0),
                }
            }
            match &mut self.values {
                Values::F16(c) => kernels.narrow_f16(row, &mut c[at..at + w]),
                Values::F32(c) => c[at..at + w].copy_from_slice(row),
            }
        }
    }

    /// Values `offset..offset + out.len()` of position `pos`, as `f32`.
    pub(super) fn read(&self, kernels: &Kernels, pos: usize, offset: usize, out: &mut [f32]) {
        let start = self.at(pos) + offset;
        match &self.values {
            Values::F16(c) => kernels.widen_f16(&c[start..start + out.len()], out),
            Values::F32(c) => out.copy_from_slice(&c[start..start + out.len()]),
        }
    }
}

/// The `n` positions of `cache` from `first` as `f32`, head by head:
/// `[head][pos][dim]`, written over every value of `out` (`n` times the KV
/// width).
pub(super) fn by_head(
    k: &Kernels,
    cache: &Cache,
    (first, n): (usize, usize),
    heads: Heads,
    mut out: Vec<f32>,
) -> Vec<f32> {
    let hd = heads.head_dim;
    assert_eq!(out.len(), n * heads.kv_dim(), "by_head buffer");
    for (h, dst) in out.chunks_exact_mut(n * hd).enumerate() {
        for (j, d) in dst.chunks_exact_mut(hd).enumerate() {
            cache.read(k, first + j, h * hd, d);
        }
    }
    out
}

/// The floats from one dim of [`by_head_transposed`]'s keys to the next for
/// `n` positions: `n` rounded up to [`KEY_TILE`], plus half a tile. A tile
/// reads a line or two of each of its `head_dim` dims; with the stride a
/// power of two (a 512-token prompt: 2 KiB) all of them fell into two sets
/// of the L1 cache and pushed each other out, so each tile came from L2. The
/// half tile (an odd number of 64-byte lines) spreads them over every set.
pub(super) fn key_stride(n: usize) -> usize {
    n.next_multiple_of(KEY_TILE) + KEY_TILE / 2
}

/// The `n` positions of `cache` from `first` as `f32`, transposed head by
/// head: `[head][dim][pos]`, each dim padded with zeros to the returned
/// [`key_stride`], in `out`: zeros, the KV width times the stride.
pub(super) fn by_head_transposed(
    k: &Kernels,
    cache: &Cache,
    (first, n): (usize, usize),
    heads: Heads,
    mut out: Vec<f32>,
) -> (Vec<f32>, usize) {
    let hd = heads.head_dim;
    let stride = key_stride(n);
    assert_eq!(
        out.len(),
        heads.kv_dim() * stride,
        "by_head_transposed buffer"
    );
    let mut row = vec![0f32; hd];
    for (h, dst) in out.chunks_exact_mut(hd * stride).enumerate() {
        for j in 0..n {
            cache.read(k, first + j, h * hd, &mut row);
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
    /// The sliding-window layers' window (0: none).
    window: usize,
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
    /// once and cannot step back, and a sliding-window layer's ring holds
    /// only its last positions, so a model with linear layers, or with rings
    /// that no longer hold the window before token `n`, forgets everything
    /// instead: [`Session::len`] says what is kept.
    pub fn truncate(&mut self, n: usize) {
        if n < self.n_past {
            let lost = |c: &Cache| {
                c.ring()
                    .is_some_and(|r| n < (self.n_past + self.window).saturating_sub(r))
            };
            let n = if self.state.iter().any(|s| !s.is_empty()) || self.k.iter().any(lost) {
                0
            } else {
                n
            };
            for c in self.k.iter_mut().chain(self.v.iter_mut()) {
                c.truncate(n);
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

    /// Bytes of the KV cache as held now (a sliding-window layer's ring
    /// stops growing once full).
    pub fn kv_bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(Cache::bytes).sum()
    }
}

impl<'a> Model<'a> {
    /// An empty session with room for `config.n_ctx` tokens.
    ///
    /// The cache is reserved for the whole context at once: address space
    /// only (the system backs pages when tokens are written), and it never
    /// moves, so memory grows with the tokens held and nothing else (growing
    /// by doubling left freed copies in the heap: peak RSS jumped by a whole
    /// cache's size at powers of two). A sliding-window layer keeps a ring of
    /// its window and one micro-batch ([`UBATCH`]) of positions, when that is
    /// shorter than the context.
    pub fn session(&self) -> Session {
        let c = &self.config;
        let window = c.swa.as_ref().map_or(0, |s| s.window);
        let ring = (c.swa.as_ref())
            .filter(|s| !s.full_cache)
            .map(|s| s.window.saturating_add(UBATCH))
            .filter(|&r| r < c.n_ctx);
        // Linear-attention layers keep no cache: their state instead.
        let empty = |l: usize| match &self.layers[l].mixer {
            Mixer::Attention(a) => {
                Cache::new(c.kv_type, a.heads.kv_dim(), c.n_ctx, ring.filter(|_| a.swa))
            }
            Mixer::Linear(_) => Cache::new(c.kv_type, 0, 0, None),
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
            window,
        }
    }
}

/// Tokens a model with sliding-window layers evaluates at once (a longer
/// batch runs in pieces of this size): what their rings hold beyond the
/// window, as llama.cpp's default micro-batch.
pub(super) const UBATCH: usize = 512;
