//! Rotary position embedding as ggml computes it (`ggml_rope_ext`): angles by
//! repeated multiplication with `base^(-2/n_rot)`, optional per-pair
//! frequency factors (`rope_freqs`), linear scaling and YaRN, applied in the
//! NORM layout (pairs `2i, 2i+1`) or the NEOX layout (pairs `i, i + n_rot/2`).
//! Powers, logarithms, sines and cosines come from [`math`], identical on every CPU.

use super::math;

/// YaRN parameters (`<arch>.rope.scaling.*` when the type is `yarn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Context length the model was trained with before extension.
    pub orig_ctx: u32,
    /// `beta_fast` (default 32).
    pub beta_fast: f32,
    /// `beta_slow` (default 1).
    pub beta_slow: f32,
}

/// Everything that determines the rotation of one position.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Base frequency.
    pub base: f32,
    /// Positions (linear) or interpolated angles (YaRN) are multiplied by this: `1 / factor`.
    pub freq_scale: f32,
    /// Whether pairs are `i, i + n_rot/2` (NEOX) rather than `2i, 2i+1` (NORM).
    pub neox: bool,
    /// YaRN ramp parameters, when the scaling type is YaRN.
    pub yarn: Option<Yarn>,
    /// Magnitude factor of cos/sin (YaRN's attention factor; 1 otherwise).
    pub mscale: f32,
    /// Per-pair frequency divisors (`rope_freqs.weight`, Llama 3).
    pub freq_factors: Option<Vec<f32>>,
    /// Qwen3.5's interleaved multi-axis sections (`rope.dimension_sections`,
    /// ggml's IMROPE): pair `i`'s sector `i mod Σ` rotates with the text
    /// position when it belongs to one of the first three axes, and not at all
    /// when it falls to the fourth, whose position a text token has at 0.
    pub sections: Option<[u32; 4]>,
}

impl Rope {
    /// `(cos, sin)` of every pair at `pos`.
    pub fn table(&self, pos: usize, out: &mut Vec<(f32, f32)>) {
        out.clear();
        let theta_scale = math::powf(self.base, -2.0 / self.n_rot as f32);
        let (corr, ext) = match self.yarn {
            Some(y) => (corr_dims(self.n_rot, y, self.base), 1.0f32),
            None => ([0.0, 0.0], 0.0),
        };
        let mut theta = pos as f32;
        for i in 0..self.n_rot / 2 {
            if self.still(i) {
                out.push((self.mscale, 0.0));
                theta *= theta_scale;
                continue;
            }
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let (angle, mscale) = if ext != 0.0 {
                let mix = ramp(corr[0], corr[1], 2 * i) * ext;
                (interp * (1.0 - mix) + extrap * mix, self.mscale)
            } else {
                (interp, self.mscale)
            };
            let (sin, cos) = math::sin_cos(angle);
            out.push((cos * mscale, sin * mscale));
            theta *= theta_scale;
        }
    }

    /// Whether pair `i` takes the fourth axis of [`Rope::sections`] (ggml's
    /// IMROPE order: the second, third, first axis, else the fourth).
    fn still(&self, i: usize) -> bool {
        let Some(s) = self.sections else {
            return false;
        };
        let total = s.iter().sum::<u32>() as usize;
        if total == 0 {
            return false;
        }
        let sector = i % total;
        let within = |axis: usize| sector % 3 == axis && sector < 3 * s[axis] as usize;
        !(within(1) || within(2) || within(0))
    }

    /// Rotates one head in place with a table from [`Rope::table`].
    pub fn apply(&self, head: &mut [f32], table: &[(f32, f32)]) {
        let half = self.n_rot / 2;
        for (i, &(cos, sin)) in table.iter().enumerate() {
            let (a, b) = if self.neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// The dimension (of `n_dims`) at which the wavelength equals `n_ctx / n_rot` turns.
fn corr_dim(n_dims: usize, n_ctx: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * math::ln(n_ctx as f32 / (n_rot * 2.0 * std::f32::consts::PI))
        / (2.0 * math::ln(base))
}

/// The dimension range over which YaRN blends interpolation into extrapolation.
fn corr_dims(n_dims: usize, y: Yarn, base: f32) -> [f32; 2] {
    let start = corr_dim(n_dims, y.orig_ctx, y.beta_fast, base).floor();
    let end = corr_dim(n_dims, y.orig_ctx, y.beta_slow, base).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

/// 1 below `low` (pure extrapolation), 0 above `high`, linear between; `i0`
/// is the even dimension index.
fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// YaRN's magnitude correction `0.1 · mscale · ln(factor) + 1` (1 for factor ≤ 1).
pub fn yarn_mscale(factor: f32, mscale: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * math::ln(factor) + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(neox: bool) -> Rope {
        Rope {
            n_rot: 8,
            base: 10000.0,
            freq_scale: 1.0,
            neox,
            yarn: None,
            mscale: 1.0,
            freq_factors: None,
            sections: None,
        }
    }

    #[test]
    fn interleaved_sections_leave_the_fourth_axis_unrotated() {
        // Eight pairs in sections [2, 3, 3, 0]: sector 6 is 0 mod 3 but past the
        // first axis's 2 × 3 sectors, so it takes the fourth axis (position 0).
        let mut r = rope(true);
        r.n_rot = 16;
        let mut plain = Vec::new();
        r.table(5, &mut plain);
        r.sections = Some([2, 3, 3, 0]);
        let mut t = Vec::new();
        r.table(5, &mut t);
        for (i, (a, b)) in plain.iter().zip(&t).enumerate() {
            if i == 6 {
                assert_eq!(*b, (1.0, 0.0));
            } else {
                assert_eq!(a, b, "pair {i}");
            }
        }
        // Qwen3.5's own [11, 11, 10] covers all 32 pairs of its 64 rotated dims.
        r.n_rot = 64;
        r.sections = Some([11, 11, 10, 0]);
        assert!((0..32).all(|i| !r.still(i)));
    }

    #[test]
    fn position_zero_is_identity() {
        let r = rope(false);
        let mut t = Vec::new();
        r.table(0, &mut t);
        let mut head: Vec<f32> = (0..8).map(|i| i as f32).collect();
        r.apply(&mut head, &t);
        assert_eq!(head, (0..8).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn layouts_pair_different_dimensions() {
        let mut t = Vec::new();
        let (norm, neox) = (rope(false), rope(true));
        norm.table(1, &mut t);
        let mut a = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        norm.apply(&mut a, &t);
        // Pair 0 turns by one radian: dimension 1 receives sin(1).
        assert!((a[1] - 1f32.sin()).abs() < 1e-6 && a[4] == 0.0);
        let mut b = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        neox.apply(&mut b, &t);
        assert!((b[4] - 1f32.sin()).abs() < 1e-6 && b[1] == 0.0);
    }

    #[test]
    fn rotation_keeps_the_norm_and_yarn_scales_it() {
        let mut r = rope(true);
        r.yarn = Some(Yarn {
            orig_ctx: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
        });
        r.freq_scale = 0.25;
        r.mscale = yarn_mscale(4.0, 1.0);
        let mut t = Vec::new();
        r.table(37, &mut t);
        let mut head: Vec<f32> = (0..8).map(|i| 0.5 + i as f32).collect();
        let before: f32 = head.iter().map(|v| v * v).sum();
        r.apply(&mut head, &t);
        let after: f32 = head.iter().map(|v| v * v).sum();
        let m = r.mscale * r.mscale;
        assert!((after / before - m).abs() < 1e-4, "{after} {before} {m}");
    }
}
