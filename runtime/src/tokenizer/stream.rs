//! Incremental detokenization for printing tokens as they are generated.

use super::Tokenizer;

/// Turns tokens into text one at a time, yielding only whole UTF-8
/// characters: a character whose bytes arrive in several tokens (byte-level
/// BPE splits most Chinese characters and emoji that way) is held back until
/// its last byte arrives. Bytes that can never form a character are yielded
/// as U+FFFD as soon as that is certain.
///
/// ```no_run
/// # fn demo(tok: &memwall_runtime::tokenizer::Tokenizer, ids: &[u32]) {
/// let mut stream = tok.stream_decoder(false);
/// let mut text = String::new();
/// for &id in ids {
///     text.push_str(&stream.push(id));
/// }
/// text.push_str(&stream.finish());
/// # }
/// ```
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    special: bool,
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder rendering each token with [`Tokenizer::token_to_piece`]
    /// (`special` says whether control tokens print their text).
    pub fn new(tokenizer: &'t Tokenizer, special: bool) -> Self {
        Self {
            tokenizer,
            special,
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text that is now complete (often
    /// empty while a multi-byte character is still arriving).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tokenizer.token_to_piece(id, self.special);
        self.push_bytes(&piece)
    }

    /// Adds raw bytes and returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is exactly the part from_utf8 accepted.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        out
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: an unfinished character at the end becomes U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}
