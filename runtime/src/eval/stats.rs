//! Log-softmax and the KL-divergence statistics, with llama-perplexity's
//! arithmetic (f32 logits, f64 sums) so that the numbers agree with it.

use super::logits_file::Record;
use crate::forward::math::exp;

/// `log p(tok)` of a row of logits: `f32` maximum, `f64` sum of `expf`.
pub(super) fn log_softmax(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let sum_exp: f64 = logits.iter().map(|&l| exp(l - max) as f64).sum();
    (logits[tok] - max) as f64 - sum_exp.ln()
}

/// Round to nearest (ties to even) for `|x| < 2^22`, by the float trick ggml uses.
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// A mean and its standard error, as llama-perplexity's `mean_and_uncertainty`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// The mean.
    pub mean: f64,
    /// Its uncertainty (0 when fewer than 11 values).
    pub plus_minus: f64,
}

fn summary(sum: f64, sum2: f64, count: usize) -> Summary {
    if count < 1 {
        return Summary::default();
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let plus_minus = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    Summary {
        mean: f,
        plus_minus,
    }
}

fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

/// The value at `fraction` of sorted `values`, interpolating linearly.
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n % 2 == 0 {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

/// `(id, log-probability)` pairs of a top-k record's little-endian u32 and f32 fields.
fn pairs<'a>(ids: &'a [u8], log_p: &'a [u8]) -> impl Iterator<Item = (usize, f32)> + 'a {
    let (ids, log_p) = (ids.chunks_exact(4), log_p.chunks_exact(4));
    ids.zip(log_p).map(|(id, lp)| {
        let i = u32::from_le_bytes([id[0], id[1], id[2], id[3]]) as usize;
        (i, f32::from_le_bytes([lp[0], lp[1], lp[2], lp[3]]))
    })
}

/// Running sums over scored positions.
#[derive(Default)]
pub(super) struct KldAccumulator {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    same_top: usize,
    kld: Vec<f32>,
    p_diff: Vec<f32>,
}

impl KldAccumulator {
    /// Adds one position: the model's logits, the reference record, the next token.
    pub(super) fn add(&mut self, logits: &[f32], base: Record<'_>, tok: usize) {
        let mut imax = 0;
        let mut max = logits[0];
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max {
                max = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| exp(l - max) as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let nll = max + log_sum_exp - logits[tok];
        let log_norm = max + log_sum_exp;
        let (nll_base, kld, imax_base) = match base {
            Record::Full {
                scale,
                min_log_prob,
                q,
            } => {
                let base_lp = |i: usize| {
                    scale * u16::from_le_bytes([q[2 * i], q[2 * i + 1]]) as f32 + min_log_prob
                };
                let mut sum = 0f64;
                let (mut imax_base, mut base_max) = (0, 0f32);
                for (i, &l) in logits.iter().enumerate() {
                    let lp = base_lp(i);
                    if i == 0 || lp > base_max {
                        base_max = lp;
                        imax_base = i;
                    }
                    if lp > -16.0 {
                        sum += (exp(lp) * (lp - l + log_norm)) as f64;
                    }
                }
                (-base_lp(tok), sum, imax_base)
            }
            Record::TopK {
                log_p_next,
                log_p_rest,
                ids,
                log_p,
                drawn_ids,
                drawn_log_p,
            } => {
                // The k tokens term by term; the rest as one outcome, plus the
                // divergence within the rest estimated from the draws as the
                // mean of r − 1 − ln r, r = q/p within the rest (unbiased, and
                // never negative).
                let mut sum = 0f64;
                let mut kept = 0f64;
                for (i, lp) in pairs(ids, log_p) {
                    sum += (exp(lp) * (lp - logits[i] + log_norm)) as f64;
                    kept += exp(logits[i] - max) as f64;
                }
                if log_p_rest > f32::NEG_INFINITY {
                    let rest = (sum_exp - kept).max(f64::MIN_POSITIVE);
                    let log_q_rest = rest.ln() - sum_exp.ln();
                    let lp_rest = log_p_rest as f64;
                    let (mut within, mut draws) = (0f64, 0usize);
                    for (i, lp) in pairs(drawn_ids, drawn_log_p) {
                        let log_r = (logits[i] as f64 - log_norm as f64 - log_q_rest)
                            - (lp as f64 - lp_rest);
                        within += log_r.exp() - 1.0 - log_r;
                        draws += 1;
                    }
                    sum += lp_rest.exp() * (lp_rest - log_q_rest + within / draws as f64);
                }
                let top = u32::from_le_bytes([ids[0], ids[1], ids[2], ids[3]]) as usize;
                (-log_p_next, sum, top)
            }
        };
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        if imax == imax_base {
            self.same_top += 1;
        }
        let p_diff = exp(-nll) - exp(-nll_base);
        self.sum_p_diff += p_diff as f64;
        let d2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += d2;
        self.sum_p_diff4 += d2 * d2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld.push(kld as f32);
        self.p_diff.push(p_diff);
    }

    pub(super) fn finish(mut self) -> KldStats {
        let count = self.kld.len();
        self.kld.sort_by(f32::total_cmp);
        self.p_diff.sort_by(f32::total_cmp);
        let log_ppl = summary(self.sum_nll, self.sum_nll2, count);
        let log_ppl_base = summary(self.sum_nll_base, self.sum_nll_base2, count);
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            count,
        );
        let ratio_unc = (log_ppl.plus_minus.powi(2) + log_ppl_base.plus_minus.powi(2) - 2.0 * cov)
            .max(0.0)
            .sqrt();
        let ppl = log_ppl.mean.exp();
        let ppl_base = log_ppl_base.mean.exp();
        let p_diff_mse = summary(self.sum_p_diff2, self.sum_p_diff4, count);
        let rms = p_diff_mse.mean.sqrt();
        let same = if count > 0 {
            self.same_top as f64 / count as f64
        } else {
            0.0
        };
        let pct = |v: &[f32], f: f32| {
            if v.is_empty() {
                0.0
            } else {
                percentile(v, f) as f64
            }
        };
        let kld_pct = [0.999f32, 0.99, 0.95, 0.90, 0.10, 0.05, 0.01, 0.001];
        let dp_pct = [
            0.999f32, 0.99, 0.95, 0.90, 0.75, 0.25, 0.10, 0.05, 0.01, 0.001,
        ];
        KldStats {
            count,
            ppl: Summary {
                mean: ppl,
                plus_minus: ppl * log_ppl.plus_minus,
            },
            ppl_base: Summary {
                mean: ppl_base,
                plus_minus: ppl_base * log_ppl_base.plus_minus,
            },
            log_ppl_correlation: cov / (log_ppl.plus_minus * log_ppl_base.plus_minus),
            log_ppl_ratio: Summary {
                mean: log_ppl.mean - log_ppl_base.mean,
                plus_minus: ratio_unc,
            },
            kld: summary(self.sum_kld, self.sum_kld2, count),
            kld_max: pct(&self.kld, 1.0),
            kld_median: if count > 0 {
                median(&self.kld) as f64
            } else {
                0.0
            },
            kld_min: pct(&self.kld, 0.0),
            kld_percentiles: kld_pct.map(|f| (f as f64, pct(&self.kld, f))).to_vec(),
            p_diff: summary(self.sum_p_diff, self.sum_p_diff2, count),
            p_diff_max: pct(&self.p_diff, 1.0),
            p_diff_median: if count > 0 {
                median(&self.p_diff) as f64
            } else {
                0.0
            },
            p_diff_min: pct(&self.p_diff, 0.0),
            p_diff_percentiles: dp_pct.map(|f| (f as f64, pct(&self.p_diff, f))).to_vec(),
            p_diff_rms: Summary {
                mean: rms,
                plus_minus: if rms > 0.0 {
                    0.5 / rms * p_diff_mse.plus_minus
                } else {
                    0.0
                },
            },
            max_abs_p_diff: self.max_p_diff as f64,
            same_top: Summary {
                mean: same,
                plus_minus: if count > 1 {
                    (same * (1.0 - same) / (count - 1) as f64).sqrt()
                } else {
                    0.0
                },
            },
        }
    }
}

/// KL divergence of a model from a reference, with llama-perplexity's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct KldStats {
    /// Scored positions.
    pub count: usize,
    /// Perplexity of the model.
    pub ppl: Summary,
    /// Perplexity of the reference (from its saved log-probabilities).
    pub ppl_base: Summary,
    /// Correlation of the two per-token log-likelihoods.
    pub log_ppl_correlation: f64,
    /// `ln(PPL / PPL_base)`.
    pub log_ppl_ratio: Summary,
    /// Mean KL divergence (nats).
    pub kld: Summary,
    /// Largest KL divergence of a position.
    pub kld_max: f64,
    /// Median.
    pub kld_median: f64,
    /// Smallest.
    pub kld_min: f64,
    /// `(fraction, value)` for 99.9, 99, 95, 90, 10, 5, 1 and 0.1 %.
    pub kld_percentiles: Vec<(f64, f64)>,
    /// Mean of `p(next) − p_base(next)`.
    pub p_diff: Summary,
    /// Largest Δp.
    pub p_diff_max: f64,
    /// Median Δp.
    pub p_diff_median: f64,
    /// Smallest Δp.
    pub p_diff_min: f64,
    /// `(fraction, value)` for 99.9, 99, 95, 90, 75, 25, 10, 5, 1 and 0.1 %.
    pub p_diff_percentiles: Vec<(f64, f64)>,
    /// Root mean square of Δp.
    pub p_diff_rms: Summary,
    /// Largest |Δp|.
    pub max_abs_p_diff: f64,
    /// Share of positions whose most likely token is the reference's.
    pub same_top: Summary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(-1.4), -1);
    }

    #[test]
    fn percentiles_interpolate() {
        let v = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert!((percentile(&v, 0.9) - 3.6).abs() < 1e-6);
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 2.5);
    }

    #[test]
    fn log_softmax_of_equal_logits_is_uniform() {
        let l = [0.5f32; 4];
        assert!((log_softmax(&l, 2) - (0.25f64).ln()).abs() < 1e-12);
    }
}
