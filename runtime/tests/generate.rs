//! Generation (`memwall_runtime::generate`) on tiny-zh: greedy text is the
//! token-by-token argmax of the forward pass, stop strings cut it where they
//! begin and only what precedes them reaches the sink, a cached prefix is
//! reused without changing the result, and prompts that cannot run are
//! refused by name.

use std::path::{Path, PathBuf};

use memwall_format::gguf::GgufModel;
use memwall_runtime::forward::Model;
use memwall_runtime::generate::{GenerateError, Generator, Stop};
use memwall_runtime::sampling::{Sampler, SamplerConfig};
use memwall_runtime::tokenizer::Tokenizer;

fn tiny_zh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-zh/reference/tiny-zh-f16.gguf")
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    })
}

fn generator(gguf: &GgufModel, n_ctx: usize) -> Generator<'_> {
    let model = Model::new(gguf, n_ctx).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf.metadata()).unwrap();
    Generator::new(model, tokenizer, greedy(), 7)
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_text_is_the_argmax_of_each_step_and_reaches_the_sink_whole() {
    let gguf = GgufModel::open(&tiny_zh()).unwrap();
    let mut g = generator(&gguf, 256);
    let prompt = g.tokenizer().encode("北京是", true, true);
    let mut pieces = String::new();
    let (text, stats) = g
        .generate(&prompt, 24, &[], &mut |p| pieces.push_str(p))
        .unwrap();
    assert_eq!(pieces, text);
    assert_eq!(stats.prompt_tokens, prompt.len());

    // The same steps by hand: the whole prompt, then one token at a time.
    let model = Model::new(&gguf, 256).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf.metadata()).unwrap();
    let n_vocab = model.config.n_vocab;
    let mut session = model.session();
    let logits = model.forward(&mut session, &prompt).unwrap();
    let mut next = argmax(&logits[logits.len() - n_vocab..]);
    let mut ids = Vec::new();
    while ids.len() < 24 && !tokenizer.is_eog(next) {
        ids.push(next);
        let logits = model.forward(&mut session, &[next]).unwrap();
        next = argmax(&logits);
    }
    assert_eq!(stats.generated, ids.len());
    let by_hand: String = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(&tokenizer.token_to_piece(id, false)).into_owned())
        .collect();
    assert_eq!(text, by_hand.trim_end_matches('\u{fffd}'));
    let want = if ids.len() == 24 {
        Stop::Length
    } else {
        Stop::EndOfGeneration
    };
    assert_eq!(stats.stopped_by, want);
}

#[test]
fn a_stop_string_cuts_the_text_where_it_begins() {
    let gguf = GgufModel::open(&tiny_zh()).unwrap();
    let mut g = generator(&gguf, 256);
    let prompt = g.tokenizer().encode("北京是", true, true);
    let (full, _) = g.generate(&prompt, 24, &[], &mut |_| {}).unwrap();
    // A stop string from the middle of the greedy text (two characters).
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() >= 6, "greedy text too short: {full:?}");
    let (at, _) = chars[chars.len() / 2];
    let end = chars[chars.len() / 2 + 2].0;
    let stop = full[at..end].to_owned();
    let first = full.find(&stop).unwrap();
    let mut pieces = String::new();
    let (text, stats) = g
        .generate(&prompt, 24, std::slice::from_ref(&stop), &mut |p| {
            pieces.push_str(p)
        })
        .unwrap();
    assert_eq!(text, &full[..first]);
    assert_eq!(pieces, text, "nothing of the stop string reaches the sink");
    assert_eq!(stats.stopped_by, Stop::StopString);
}

#[test]
fn a_cached_prefix_is_reused_with_the_same_result() {
    let gguf = GgufModel::open(&tiny_zh()).unwrap();
    let mut g = generator(&gguf, 256);
    let tokens = g.tokenizer().encode("北京是中国的首都，上海是", true, true);
    let (first, _) = g.generate(&tokens, 12, &[], &mut |_| {}).unwrap();
    let (again, _) = g.generate(&tokens, 12, &[], &mut |_| {}).unwrap();
    assert_eq!(first, again);
    // Feeding a longer prompt after the cache holds its prefix gives the
    // logits a fresh model gives.
    let longer = g
        .tokenizer()
        .encode("北京是中国的首都，上海是中国的", true, true);
    let reused = g.feed(&longer).unwrap();
    let model = Model::new(&gguf, 256).unwrap();
    let mut session = model.session();
    let fresh = model.forward(&mut session, &longer).unwrap();
    let n_vocab = model.config.n_vocab;
    let last = &fresh[fresh.len() - n_vocab..];
    assert_eq!(reused.len(), n_vocab);
    assert!(
        reused
            .iter()
            .zip(last)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "prefix reuse changed the logits"
    );
}

#[test]
fn empty_and_too_long_prompts_are_refused() {
    let gguf = GgufModel::open(&tiny_zh()).unwrap();
    let mut g = generator(&gguf, 8);
    assert!(matches!(
        g.generate(&[], 4, &[], &mut |_| {}),
        Err(GenerateError::EmptyPrompt)
    ));
    let long = vec![g.tokenizer().bos().unwrap_or(1); 9];
    let err = g.generate(&long, 4, &[], &mut |_| {}).unwrap_err();
    assert!(matches!(
        err,
        GenerateError::PromptTooLong { need: 9, n_ctx: 8 }
    ));
    assert_eq!(
        err.to_string(),
        "the prompt needs 9 tokens; the context holds 8 (raise -c)"
    );
}
