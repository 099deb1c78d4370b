//! `y = W·x` over a batch of tokens: the activations are quantized once to the
//! weight type's vec_dot type, then the weight rows are split across a
//! persistent thread pool; each output is one [`Kernels`] dot product.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::pool::{Pool, for_each_chunk};
use super::tiled::{self, Layout};
use super::{Activations, AlignedBytes, GridOut, KernelError, Kernels, QK_K, TiledFn, VecDotType};
use memwall_format::GgmlType;

/// A weight matrix as stored in a GGUF tensor: `rows` rows of `cols` weights
/// of type `ty`, row-major (ggml's `ne[0] = cols`, `ne[1] = rows`).
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl<'a> QMatrix<'a> {
    /// Checks that `data` holds exactly `rows × cols` weights of `ty` and that
    /// memwall has a dot product for `ty`.
    pub fn new(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        VecDotType::of(ty).ok_or(KernelError::UnsupportedType(ty))?;
        let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
        let row_bytes = cols / bs * ts;
        if cols % bs != 0 || rows.checked_mul(row_bytes) != Some(data.len()) {
            return Err(KernelError::Shape(format!(
                "{} bytes of {ty} for a {rows}×{cols} matrix",
                data.len()
            )));
        }
        Ok(QMatrix {
            ty,
            data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (weights per row).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The bytes of rows `r..r + n`.
    pub(crate) fn row_span(&self, r: usize, n: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + n) * self.row_bytes]
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// Tokens whose activations are reused against one chunk of weight rows
/// before moving on (keeps both the rows and the tile in L2).
const TOKEN_TILE: usize = 16;

/// Weight rows per work item of a batch at most.
const MAX_CHUNK: usize = 64;

/// Most floats of F16 weight rows a work item widens once for all its
/// tiles of tokens (1 MiB a thread; wider work items convert per tile).
const WIDE_ROWS_FLOATS: usize = 1 << 18;

/// A thread's buffer of widened F16 weight rows, grown once to the largest
/// work item and kept (64-byte aligned, as the activations are).
struct WideRows(Vec<f32>);

impl WideRows {
    /// `n` floats at a 64-byte boundary.
    fn get(&mut self, n: usize) -> &mut [f32] {
        super::aligned(&mut self.0, n)
    }
}

/// Fewest tokens a batch takes the tiled products for (fewer tokens do not
/// repay unpacking the rows).
pub(crate) const TILED_MIN_TOKENS: usize = 8;

/// Most bytes of a work item's panels (its rows unpacked for the tiled
/// products), so that they stay in L2 while every tile of tokens reads them.
const PANEL_BYTES: usize = 1 << 20;

thread_local! {
    /// A thread's tile of products (`rows × TOKEN_TILE`) and its transpose,
    /// kept rather than zeroed for every work item.
    static TILES: std::cell::RefCell<[[f32; MAX_CHUNK * TOKEN_TILE]; 2]> =
        const { std::cell::RefCell::new([[0.0; MAX_CHUNK * TOKEN_TILE]; 2]) };
    static WIDE_ROWS: std::cell::RefCell<WideRows> =
        const { std::cell::RefCell::new(WideRows(Vec::new())) };
    /// A thread's panels, grown once to the largest work item and kept.
    static PANELS: std::cell::RefCell<AlignedBytes> =
        std::cell::RefCell::new(AlignedBytes::default());
}

/// A reusable matrix-multiply context: the kernels, a persistent thread pool
/// and the buffers of quantized activations, kept between calls so decoding
/// allocates nothing once warm.
pub struct Matmul {
    kernels: Kernels,
    threads: usize,
    pool: Option<Arc<Pool>>,
    acts: Activations,
    /// The name of the input quantized into `acts` (unique in the process,
    /// so a name from another context never matches).
    input: u64,
}

impl std::fmt::Debug for Matmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matmul")
            .field("kernels", &self.kernels)
            .field("threads", &self.threads)
            .finish()
    }
}

impl Matmul {
    /// A context running `kernels` on `threads` threads (at least 1; with 1,
    /// everything runs on the calling thread and no pool is made).
    pub fn new(kernels: Kernels, threads: usize) -> Self {
        let threads = threads.max(1);
        let pool = (threads > 1)
            .then(|| Pool::new(threads))
            .flatten()
            .map(Arc::new);
        let threads = if pool.is_some() { threads } else { 1 };
        Matmul {
            kernels,
            threads,
            pool,
            acts: Activations::new(),
            input: 0,
        }
    }

    /// The kernels used.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The thread pool (none for one thread), shared with the other parallel
    /// loops of a forward pass so that one set of workers serves them all.
    pub fn pool(&self) -> Option<Arc<Pool>> {
        self.pool.clone()
    }

    /// Threads used (1 if the pool could not be made).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t = x.len() / w.cols()` tokens:
    /// `x` is `t × cols`, `y` is `t × rows`, both row-major. The activations
    /// are quantized to the weight type's vec_dot type first, as ggml does.
    pub fn matmul(&mut self, w: &QMatrix<'_>, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_sharing(w, x, y, &mut None)
    }

    /// [`Matmul::matmul`] for matrices that read one input in turn (Q, K,
    /// V; gate, up): `shared` starts as `None` and is passed, with the same
    /// `x`, to each of them. While the activations quantized for the first
    /// are still held and of the kind the next needs, they are not quantized
    /// again (same bytes, one pass over `x` fewer).
    pub fn matmul_sharing(
        &mut self,
        w: &QMatrix<'_>,
        x: &[f32],
        y: &mut [f32],
        shared: &mut Option<u64>,
    ) -> Result<(), KernelError> {
        let kind = VecDotType::of(w.ty).ok_or(KernelError::UnsupportedType(w.ty))?;
        let held = *shared == Some(self.input)
            && self.acts.kind() == Some(kind)
            && self.acts.cols() == w.cols
            && self.acts.rows() * w.cols == x.len();
        if !held {
            // Named first: a failed quantization must not leave a name
            // that matches what is (partly) held.
            static INPUTS: AtomicU64 = AtomicU64::new(1);
            self.input = INPUTS.fetch_add(1, Ordering::Relaxed);
            *shared = None;
            self.acts
                .quantize_on(self.pool.as_deref(), &self.kernels, kind, x, w.cols)?;
            *shared = Some(self.input);
        }
        run(
            self.kernels,
            self.pool.as_deref(),
            self.threads,
            w,
            &self.acts,
            y,
        )
    }

    /// [`Matmul::matmul`] with activations already quantized (several
    /// matrices that read the same input — Q, K, V; gate, up — share one
    /// [`Activations`]).
    pub fn matmul_quantized(
        &mut self,
        w: &QMatrix<'_>,
        acts: &Activations,
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        run(self.kernels, self.pool.as_deref(), self.threads, w, acts, y)
    }
}

/// One-shot `y = W·x` (see [`Matmul::matmul`]) with the kernels of
/// [`Kernels::from_env`] on a pool of `threads` made for this call. For
/// decoding, keep a [`Matmul`] instead.
pub fn matmul(
    w: &QMatrix<'_>,
    x: &[f32],
    y: &mut [f32],
    threads: usize,
) -> Result<(), KernelError> {
    Matmul::new(Kernels::from_env()?, threads).matmul(w, x, y)
}

fn run(
    kernels: Kernels,
    pool: Option<&Pool>,
    threads: usize,
    w: &QMatrix<'_>,
    acts: &Activations,
    y: &mut [f32],
) -> Result<(), KernelError> {
    let want = VecDotType::of(w.ty).ok_or(KernelError::UnsupportedType(w.ty))?;
    let t_n = acts.rows();
    if acts.kind() != Some(want) || acts.cols() != w.cols {
        return Err(KernelError::Shape(format!(
            "{} weights of {} columns against {:?} activations of {} columns",
            w.ty,
            w.cols,
            acts.kind(),
            acts.cols()
        )));
    }
    if y.len() != t_n * w.rows {
        return Err(KernelError::Shape(format!(
            "output of {} values for {t_n} tokens × {} rows",
            y.len(),
            w.rows
        )));
    }
    if t_n == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        // Empty rows: every product is the empty sum.
        y.fill(0.0);
        return Ok(());
    }
    // Work items of `chunk` rows; several per thread so uneven progress evens out.
    let chunk = if t_n > 1 {
        batch_chunk(w.rows, threads)
    } else {
        w.rows.div_ceil(threads * 4).max(1)
    };
    // F16 weights: the activations widened to `f32` once (converting them for
    // every row bound the product), tiles of rows × tokens.
    let wide = acts.widened();
    let widened = kernels
        .f16_rows_f32()
        .filter(|_| w.ty == GgmlType::F16 && wide.len() == t_n * w.cols);
    if t_n == 1 {
        // F16 weights on a backend that converts one token's f16 activations
        // in the loop (AMD's): the same bits as over the widened ones.
        let halves = match (kernels.f16_row_f16(), acts.row(0)) {
            (Some(f), super::ActRow::F16(h)) if w.ty == GgmlType::F16 => Some((f, h)),
            _ => None,
        };
        for_each_chunk(pool, y, chunk, |c, ys| {
            if let Some((row_f16, h)) = halves {
                row_f16(w.row_span(c * chunk, ys.len()), w.cols, h, ys);
                return;
            }
            if let Some(rows_f32) = widened {
                rows_f32(w.row_span(c * chunk, ys.len()), w.cols, wide, ys, 1);
                return;
            }
            let (span, n) = (w.row_span(c * chunk, ys.len()), ys.len());
            if kernels.dot_column(w.ty, span, acts.row(0), ys) {
                return;
            }
            let dst = GridOut { out: ys, stride: 1 };
            kernels.dot_grid(w.ty, span, n, 0..1, |t| acts.row(t), dst);
        });
        return Ok(());
    }
    if let Some((f, layout)) = kernels
        .tiled(w.ty)
        .filter(|_| acts.kind() == Some(VecDotType::Q8K) && !acts.q8k_tiles.is_empty())
    {
        run_tiled(pool, threads, (f, layout), w, acts, y);
        return Ok(());
    }
    // Several tokens: each work item computes its rows for a tile of tokens
    // at a time into `tile` (each weight row read once per tile), then copies
    // them transposed into `y` while they are in L1 (through a `rows × t`
    // scratch and a transposing pass, 10 % of an F16 pp512 went to page
    // faults and to reading the scratch back).
    let rows = w.rows;
    let out = Disjoint::new(y);
    let n_chunks = rows.div_ceil(chunk);
    // F16 weights that more than one tile of tokens reads: each work item
    // widens its rows to `f32` once, for all its tiles (the tile kernels
    // would convert them again for every tile: 15 % of an F16 pp512's
    // product time on AVX-512). The products are the same bits.
    let wide_rows = widened
        .and(kernels.f16_wide_rows())
        .filter(|_| t_n > TOKEN_TILE && chunk * w.cols <= WIDE_ROWS_FLOATS);
    let run_chunk = |c: usize| {
        let r0 = c * chunk;
        let nr = chunk.min(rows - r0);
        // `pre`: the wide kernel and this item's rows widened for it.
        let tiles = |pre: Option<(super::RowsWideF16, &[f32])>| {
            TILES.with_borrow_mut(|[tile, tr]| {
                for t0 in (0..t_n).step_by(TOKEN_TILE) {
                    let t1 = (t0 + TOKEN_TILE).min(t_n);
                    let nt = t1 - t0;
                    // The widened activations of the tile (F16 weights only).
                    let a = || &wide[t0 * w.cols..t1 * w.cols];
                    match (pre, widened) {
                        (Some((rows_wide, ww)), _) => {
                            rows_wide(ww, w.cols, a(), tile, TOKEN_TILE);
                        }
                        (None, Some(rows_f32)) => {
                            rows_f32(w.row_span(r0, nr), w.cols, a(), tile, TOKEN_TILE);
                        }
                        (None, None) => {
                            kernels.dot_rows(w, r0..r0 + nr, acts, t0..t1, tile, TOKEN_TILE);
                        }
                    }
                    let tr = &mut tr[..nt * nr];
                    kernels.transpose(tile, TOKEN_TILE, nr, nt, tr);
                    for (t, v) in tr.chunks_exact(nr).enumerate() {
                        // SAFETY: outputs of rows `r0..r0 + nr` belong to this
                        // work item alone (the pool runs each item once).
                        unsafe { out.write((t0 + t) * rows + r0, v) };
                    }
                }
            })
        };
        match wide_rows {
            Some(rows_wide) => WIDE_ROWS.with_borrow_mut(|buf| {
                let ww = buf.get(nr * w.cols);
                kernels.widen_f16_le(w.row_span(r0, nr), ww);
                tiles(Some((rows_wide, ww)));
            }),
            None => tiles(None),
        }
    };
    match pool {
        Some(p) => p.run(n_chunks, &run_chunk),
        None => (0..n_chunks).for_each(run_chunk),
    }
    Ok(())
}

/// [`run`] through a tiled product: each work item unpacks its rows into
/// panels once, then takes every tile of tokens against them.
fn run_tiled(
    pool: Option<&Pool>,
    threads: usize,
    (f, layout): (TiledFn, Layout),
    w: &QMatrix<'_>,
    acts: &Activations,
    y: &mut [f32],
) {
    let (rows, t_n, nb) = (w.rows, acts.rows(), w.cols / QK_K);
    let panel = nb * tiled::record_bytes(layout.nsub);
    let group = nb * tiled::ACT_BYTES;
    let chunk = tiled_chunk(rows, threads, panel);
    let out = Disjoint::new(y);
    let run_chunk = |c: usize| {
        let r0 = c * chunk;
        let nr = chunk.min(rows - r0);
        PANELS.with_borrow_mut(|buf| {
            let panels = buf.reuse(nr.div_ceil(tiled::ROWS) * panel);
            tiled::unpack(w, r0..r0 + nr, panels);
            // Token-major: token `t`'s outputs of the work item's rows at
            // `tile[t·width..]`, a whole number of panels wide.
            let width = nr.next_multiple_of(tiled::ROWS);
            TILES.with_borrow_mut(|[tile, _]| {
                for t0 in (0..t_n).step_by(TOKEN_TILE) {
                    let nt = TOKEN_TILE.min(t_n - t0);
                    let groups = t0 / tiled::TOKENS..(t0 + nt).div_ceil(tiled::TOKENS);
                    let a = &acts.q8k_tiles.bytes()[groups.start * group..groups.end * group];
                    f(layout, nb, panels, a, tile, width);
                    for (t, v) in tile.chunks_exact(width).take(nt).enumerate() {
                        // SAFETY: outputs of rows `r0..r0 + nr` belong to this
                        // work item alone (the pool runs each item once).
                        unsafe { out.write((t0 + t) * rows + r0, &v[..nr]) };
                    }
                }
            });
        });
    };
    let n_chunks = rows.div_ceil(chunk);
    match pool {
        Some(p) => p.run(n_chunks, &run_chunk),
        None => (0..n_chunks).for_each(run_chunk),
    }
}

/// Rows per work item of a tiled product: whole panels, at most
/// [`MAX_CHUNK`] rows, [`PANEL_BYTES`] of panels (`panel` bytes each) and a
/// quarter of a thread's share where that leaves a panel, chosen as
/// [`batch_chunk`] does.
fn tiled_chunk(rows: usize, threads: usize, panel: usize) -> usize {
    let fit = (PANEL_BYTES / panel.max(1)).clamp(1, MAX_CHUNK / tiled::ROWS);
    let share = rows.div_ceil(threads * 4).div_ceil(tiled::ROWS);
    let most = share.clamp(1, fit) * tiled::ROWS;
    let cost = |c: usize| rows.div_ceil(c).div_ceil(threads) * c;
    (tiled::ROWS..=most)
        .step_by(tiled::ROWS)
        .min_by_key(|&c| (cost(c), std::cmp::Reverse(c)))
        .unwrap_or(tiled::ROWS)
}

/// Rows per work item of a batch: at most [`MAX_CHUNK`] and a quarter of a
/// thread's share, chosen so the rounds of work items over `threads` cover
/// the fewest rows; ties go to a multiple of six (the several-row kernels
/// take rows by twos and threes), then to the larger chunk. 576 rows on
/// two threads as nine items of 64 kept one thread idle a ninth of the time;
/// twelve of 48 split evenly.
fn batch_chunk(rows: usize, threads: usize) -> usize {
    let most = rows.div_ceil(threads * 4).clamp(1, MAX_CHUNK);
    if most < 6 {
        return most;
    }
    let cost = |c: usize| rows.div_ceil(c).div_ceil(threads) * c;
    (6..=most)
        .step_by(6)
        .chain([most])
        .min_by_key(|&c| (cost(c), c % 6 != 0, std::cmp::Reverse(c)))
        .unwrap_or(most)
}

/// An output matrix shared by the work items of one product, each of which
/// writes only its own rows' outputs (columns of the token-major result).
struct Disjoint<'a> {
    ptr: *mut f32,
    len: usize,
    _y: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: `write` is the only access, and its callers write disjoint ranges.
unsafe impl Sync for Disjoint<'_> {}

impl<'a> Disjoint<'a> {
    fn new(y: &'a mut [f32]) -> Self {
        Disjoint {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            _y: std::marker::PhantomData,
        }
    }

    /// Copies `v` to `at..at + v.len()`. Panics if that is out of bounds.
    ///
    /// # Safety
    /// No other thread accesses `at..at + v.len()` during the call.
    unsafe fn write(&self, at: usize, v: &[f32]) {
        assert!(
            at.checked_add(v.len()).is_some_and(|end| end <= self.len),
            "output range"
        );
        // SAFETY: in bounds (checked above); the caller guarantees no other
        // thread touches the range; `v` is not part of `y` (it borrows
        // other memory while `y` is mutably borrowed by `self`).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(at), v.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_chunks_split_rows_evenly_over_threads() {
        // SmolLM2's matrices on two threads: whole rounds of equal items.
        assert_eq!(batch_chunk(576, 2), 48);
        assert_eq!(batch_chunk(192, 2), 24);
        assert_eq!(batch_chunk(1536, 2), 48);
        for threads in 1..=8 {
            for rows in 1..=700 {
                let c = batch_chunk(rows, threads);
                assert!(
                    (1..=MAX_CHUNK).contains(&c),
                    "{rows} rows, {threads} threads: {c}"
                );
                // Never more rounds than the old quarter-share chunk needed.
                let old = rows.div_ceil(threads * 4).clamp(1, MAX_CHUNK);
                let rounds = |c: usize| rows.div_ceil(c).div_ceil(threads);
                assert!(
                    rounds(c) * c <= rounds(old) * old,
                    "{rows} rows, {threads} threads"
                );
            }
        }
    }
}
