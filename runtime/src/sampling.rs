//! Choosing the next token from logits: greedy, or the chain llama.cpp's
//! common sampler applies — repetition penalty over a window, top-k, top-p,
//! min-p, then temperature and a seeded draw.
//!
//! The defaults are temperature 0.7 and top-p 0.9: below a temperature of
//! about 0.3 small models start to repeat themselves, and top-p 0.9 cuts the
//! long tail that makes them ramble.

use std::collections::VecDeque;

use crate::forward::math::exp;

/// Sampling settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; 0 or below picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probabilities sum to `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens by this (1: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the draw.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x006d_656d_7761_6c6c, // "memwall"
        }
    }
}

/// A sampler: its settings, the random state and the recent tokens.
pub struct Sampler {
    config: SamplerConfig,
    state: u64,
    recent: VecDeque<u32>,
}

impl Sampler {
    /// A sampler with `config`.
    pub fn new(config: SamplerConfig) -> Self {
        Sampler {
            state: config.seed,
            recent: VecDeque::with_capacity(config.repeat_last_n),
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Records a token as generated or given (the penalty window sees it).
    pub fn accept(&mut self, token: u32) {
        if self.config.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.config.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Forgets the recent tokens.
    pub fn reset(&mut self) {
        self.recent.clear();
    }

    /// A uniform draw in [0, 1).
    fn uniform(&mut self) -> f64 {
        uniform(&mut self.state)
    }

    /// Chooses the next token from one row of logits (which must not be empty).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let c = &self.config;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if c.repeat_penalty != 1.0 && c.repeat_penalty > 0.0 {
            let mut seen: Vec<u32> = self.recent.iter().copied().collect();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(entry) = cand.get_mut(id as usize) {
                    entry.1 = if entry.1 > 0.0 {
                        entry.1 / c.repeat_penalty
                    } else {
                        entry.1 * c.repeat_penalty
                    };
                }
            }
        }
        // Most likely first; ties to the lower id, so greedy is the first maximum.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if c.temperature <= 0.0 {
            return cand.iter().min_by(|a, b| order(a, b)).map_or(0, |e| e.0);
        }
        if c.top_k > 0 && c.top_k < cand.len() {
            cand.select_nth_unstable_by(c.top_k - 1, order);
            cand.truncate(c.top_k);
        }
        cand.sort_by(order);
        let probs = softmax(&cand, 1.0);
        if c.top_p < 1.0 {
            let mut sum = 0.0;
            let keep = probs
                .iter()
                .position(|&p| {
                    sum += p;
                    sum >= c.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            let floor = probs[0] * c.min_p;
            let keep = probs[..cand.len()]
                .iter()
                .take_while(|&&p| p >= floor)
                .count();
            cand.truncate(keep.max(1));
        }
        let probs = softmax(&cand, c.temperature);
        let mut r = self.uniform() as f32;
        for (e, p) in cand.iter().zip(&probs) {
            if r < *p {
                return e.0;
            }
            r -= p;
        }
        cand.last().map_or(0, |e| e.0)
    }
}

/// Probabilities of candidates sorted most likely first, at `temperature`.
fn softmax(cand: &[(u32, f32)], temperature: f32) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |e| e.1);
    let mut p: Vec<f32> = cand
        .iter()
        .map(|e| exp((e.1 - max) / temperature))
        .collect();
    let sum: f32 = p.iter().sum();
    p.iter_mut().for_each(|v| *v /= sum);
    p
}

/// The next uniform draw in [0, 1) of the SplitMix64 sequence at `state`.
pub(crate) fn uniform(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn the_penalty_pushes_recent_tokens_down() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..greedy()
        });
        s.accept(1);
        // 3.0 / 2 = 1.5 < 2.0: token 2 wins now; negative logits are multiplied.
        assert_eq!(s.sample(&[0.1, 3.0, 2.0, -1.0]), 2);
    }

    #[test]
    fn filters_keep_only_likely_tokens_and_the_seed_repeats() {
        let logits: Vec<f32> = (0..100).map(|i| -(i as f32) * 0.5).collect();
        let config = SamplerConfig {
            temperature: 1.0,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        };
        let mut a = Sampler::new(config.clone());
        let mut b = Sampler::new(config);
        let draws: Vec<u32> = (0..200).map(|_| a.sample(&logits)).collect();
        assert!(draws.iter().all(|&t| t < 5), "top-k 5");
        assert!(draws.iter().any(|&t| t > 0), "not greedy");
        assert_eq!(
            draws,
            (0..200).map(|_| b.sample(&logits)).collect::<Vec<_>>()
        );
        // top-p 0.5 where the first token holds 63 %: only token 0.
        let steep: Vec<f32> = (0..100).map(|i| -(i as f32)).collect();
        let mut c = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_p: 0.5,
            top_k: 0,
            min_p: 0.0,
            ..SamplerConfig::default()
        });
        assert!((0..50).all(|_| c.sample(&steep) == 0));
        // min-p 0.5: tokens at least half as likely as the best (0 and 1 here).
        let mut d = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.5,
            ..SamplerConfig::default()
        });
        assert!((0..50).all(|_| d.sample(&logits) <= 1));
    }
}
