//! The work folder of a calibrated quantization (`OUT.gguf.calibrating/`):
//! what every finished layer produced — its quantized tensors, the norms
//! AWQ rescaled, its importance entries, the report so far — and the hidden
//! states after it, committed layer by layer so that a run stopped by Ctrl-C,
//! `kill -9`, a reboot or an error (a full disk) continues from its last
//! finished layer when the same command runs again, and ends in the bytes an
//! uninterrupted run writes ([`crate::quantize::Settings::resume`] insists on
//! continuing: a folder of another run is then refused, not replaced).
//!
//! Layout: `manifest.json` (what the run is: model, calibration tokens,
//! options, plan, the recipe's text — compared field by field on resume), `tensors.bin`
//! (append-only blobs), `hidden-L.bin` (the samples' hidden states at the
//! input of layer `L`, `f32` little-endian) and `state.json` (the layers
//! done, where their blobs are, the report). A layer is committed by
//! syncing `tensors.bin`, writing `hidden-L.bin` and then replacing
//! `state.json` through a renamed temporary, so a crash at any point leaves
//! the previous commit whole.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::CalibrateError;
use crate::quantize::{GroupReport, Report};

/// What identifies a run: two runs with equal manifests write the same file.
pub(crate) type Manifest = BTreeMap<String, Value>;

/// What a resumed run takes over from the work folder.
pub(crate) struct Resumed {
    /// Layers finished.
    pub layers: usize,
    /// The hidden states at the input of layer `layers`, per sample.
    pub xs: Vec<Vec<f32>>,
    /// Norms AWQ rescaled, by tensor name.
    pub norms: BTreeMap<String, Vec<f32>>,
    /// Importance entries of the finished layers.
    pub imatrix: BTreeMap<String, Vec<f32>>,
    /// The report of the finished layers.
    pub report: Report,
}

/// The work folder of one run.
pub(crate) struct Work {
    dir: PathBuf,
    tensors: BufWriter<File>,
    /// Bytes of `tensors.bin` written (committed or not).
    at: u64,
    /// Committed and pending blobs: (kind, name) → (offset, length).
    index: BTreeMap<(String, String), (u64, u64)>,
    layers: usize,
    /// Remove the folder when dropped (nothing worth keeping, or done).
    discard: bool,
}

const STATE: &str = "state.json";
const MANIFEST: &str = "manifest.json";
const TENSORS: &str = "tensors.bin";

fn io(path: &Path) -> impl Fn(std::io::Error) -> CalibrateError + '_ {
    move |error| CalibrateError::Io {
        path: path.to_owned(),
        error,
    }
}

fn input(dir: &Path, what: impl std::fmt::Display) -> CalibrateError {
    CalibrateError::Input(format!(
        "{}: {what} (delete the folder to start over)",
        dir.display()
    ))
}

/// Writes `bytes` to `path` through a synced temporary renamed over it.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), CalibrateError> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn floats_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_to_floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Work {
    /// The folder of the run writing `out`.
    pub(crate) fn folder(out: &Path) -> PathBuf {
        let mut name = out.file_name().unwrap_or_default().to_os_string();
        name.push(".calibrating");
        out.with_file_name(name)
    }

    /// Opens the work folder of `out`: the one an interrupted run of the same
    /// manifest left, with its finished layers, or a new one (`sizes` are
    /// the samples' hidden-state lengths, to check what is read back). With
    /// `resume`, finished layers of another manifest are refused, naming the
    /// difference, rather than replaced.
    pub(crate) fn open(
        out: &Path,
        manifest: &Manifest,
        resume: bool,
        sizes: &[usize],
    ) -> Result<(Work, Option<Resumed>), CalibrateError> {
        let dir = Self::folder(out);
        let state_path = dir.join(STATE);
        if state_path.exists() {
            let done = read_json(&state_path)
                .ok()
                .and_then(|s| s.get("layers").and_then(Value::as_u64))
                .unwrap_or(0);
            // The same run stopped after finished layers continues; with
            // --resume anything else is refused, without it a folder of
            // another run is replaced.
            if done > 0 && (resume || same_run(&dir, manifest)) {
                return Self::resume(dir, manifest, sizes).map(|(w, r)| (w, Some(r)));
            }
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let tensors_path = dir.join(TENSORS);
        let tensors = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&tensors_path)
            .map_err(io(&tensors_path))?;
        let work = Work {
            tensors: BufWriter::new(tensors),
            dir,
            at: 0,
            index: BTreeMap::new(),
            layers: 0,
            discard: true,
        };
        let m = serde_json::to_vec_pretty(manifest).unwrap_or_default();
        replace_file(&work.dir.join(MANIFEST), &m)?;
        work.write_state(&Report::default())?;
        Ok((work, None))
    }

    fn resume(
        dir: PathBuf,
        manifest: &Manifest,
        sizes: &[usize],
    ) -> Result<(Work, Resumed), CalibrateError> {
        let recorded = read_json(&dir.join(MANIFEST))?;
        let recorded = recorded
            .as_object()
            .ok_or_else(|| input(&dir, "manifest.json is not an object"))?;
        for (key, want) in manifest {
            let got = recorded.get(key).unwrap_or(&Value::Null);
            if got != want {
                // A recipe's text is long: name it, do not print it.
                let change = if key == "recipe" {
                    "the recipe differs from the interrupted run's".to_owned()
                } else {
                    format!("{key} was {got} in the interrupted run, is {want} now")
                };
                return Err(CalibrateError::Input(format!(
                    "{}: cannot resume: {change} (run it with the same model, data and options, or delete the folder to start over)",
                    dir.display()
                )));
            }
        }
        let state = read_json(&dir.join(STATE))?;
        let layers = state.get("layers").and_then(Value::as_u64).unwrap_or(0) as usize;
        let end = state.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        let tensors_path = dir.join(TENSORS);
        let mut file = File::options()
            .read(true)
            .write(true)
            .open(&tensors_path)
            .map_err(io(&tensors_path))?;
        let len = file.metadata().map_err(io(&tensors_path))?.len();
        if len < end {
            return Err(input(
                &dir,
                format!("tensors.bin has {len} bytes, the state records {end}"),
            ));
        }
        // What an interrupted layer appended after the last commit goes.
        file.set_len(end).map_err(io(&tensors_path))?;
        let mut index = BTreeMap::new();
        for e in state
            .get("blobs")
            .and_then(Value::as_array)
            .map_or(&[][..], |v| &v[..])
        {
            let field = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
            let num = |k: &str| e.get(k).and_then(Value::as_u64);
            let (Some(kind), Some(name), Some(at), Some(n)) =
                (field("kind"), field("name"), num("at"), num("len"))
            else {
                return Err(input(&dir, "state.json has a malformed entry"));
            };
            if at.checked_add(n).is_none_or(|e| e > end) {
                return Err(input(
                    &dir,
                    format!("{name}: bytes {at}+{n} past the end {end} of tensors.bin"),
                ));
            }
            index.insert((kind, name), (at, n));
        }
        let hidden = dir.join(format!("hidden-{layers}.bin"));
        let want: u64 = sizes.iter().map(|&n| n as u64 * 4).sum();
        let mut h = File::open(&hidden).map_err(io(&hidden))?;
        let have = h.metadata().map_err(io(&hidden))?.len();
        if have != want {
            return Err(input(
                &dir,
                format!(
                    "{} has {have} bytes; the samples' hidden states take {want}",
                    hidden.display()
                ),
            ));
        }
        let mut xs = Vec::with_capacity(sizes.len());
        for &n in sizes {
            let mut b = vec![0u8; n * 4];
            h.read_exact(&mut b).map_err(io(&hidden))?;
            xs.push(bytes_to_floats(&b));
        }
        file.seek(SeekFrom::End(0)).map_err(io(&tensors_path))?;
        let mut work = Work {
            tensors: BufWriter::new(file),
            dir,
            at: end,
            index,
            layers,
            discard: false,
        };
        let mut norms = BTreeMap::new();
        let mut imatrix = BTreeMap::new();
        let blobs: Vec<(String, String)> = work.index.keys().cloned().collect();
        for (kind, name) in blobs {
            let target = match kind.as_str() {
                "norm" => &mut norms,
                "imatrix" => &mut imatrix,
                _ => continue,
            };
            let bytes = work.get_kind(&kind, &name)?.unwrap_or_default();
            target.insert(name, bytes_to_floats(&bytes));
        }
        let report = report_from(state.get("report").unwrap_or(&Value::Null));
        Ok((
            work,
            Resumed {
                layers,
                xs,
                norms,
                imatrix,
                report,
            },
        ))
    }

    /// Adds a quantized tensor of the layer being made.
    pub(crate) fn put(&mut self, name: &str, bytes: &[u8]) -> Result<(), CalibrateError> {
        self.put_kind("tensor", name, bytes)
    }

    fn put_kind(&mut self, kind: &str, name: &str, bytes: &[u8]) -> Result<(), CalibrateError> {
        let path = self.dir.join(TENSORS);
        self.tensors.write_all(bytes).map_err(io(&path))?;
        self.index.insert(
            (kind.to_owned(), name.to_owned()),
            (self.at, bytes.len() as u64),
        );
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// A quantized tensor's bytes, if one was put.
    pub(crate) fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>, CalibrateError> {
        self.get_kind("tensor", name)
    }

    fn get_kind(&mut self, kind: &str, name: &str) -> Result<Option<Vec<u8>>, CalibrateError> {
        let Some(&(at, len)) = self.index.get(&(kind.to_owned(), name.to_owned())) else {
            return Ok(None);
        };
        let path = self.dir.join(TENSORS);
        self.tensors.flush().map_err(io(&path))?;
        let f = self.tensors.get_mut();
        let mut bytes = vec![0u8; len as usize];
        f.seek(SeekFrom::Start(at))
            .and_then(|_| f.read_exact(&mut bytes))
            .and_then(|_| f.seek(SeekFrom::End(0)).map(|_| ()))
            .map_err(io(&path))?;
        Ok(Some(bytes))
    }

    /// Commits layer `l` as finished: its norms and importance entries (the
    /// layer's entries of `norms` and `imatrix`), the report so far, and
    /// `xs`, the hidden states at the input of layer `l + 1`.
    pub(crate) fn commit_layer(
        &mut self,
        l: usize,
        xs: &[Vec<f32>],
        norms: &BTreeMap<String, Vec<f32>>,
        imatrix: &BTreeMap<String, Vec<f32>>,
        report: &Report,
    ) -> Result<(), CalibrateError> {
        let prefix = format!("blk.{l}.");
        for (kind, map) in [("norm", norms), ("imatrix", imatrix)] {
            for (name, v) in map.range(prefix.clone()..) {
                if !name.starts_with(&prefix) {
                    break;
                }
                self.put_kind(kind, name, &floats_to_bytes(v))?;
            }
        }
        let path = self.dir.join(TENSORS);
        self.tensors
            .flush()
            .and_then(|_| self.tensors.get_ref().sync_data())
            .map_err(io(&path))?;
        let hidden = self.dir.join(format!("hidden-{}.bin", l + 1));
        {
            let mut f = BufWriter::new(File::create(&hidden).map_err(io(&hidden))?);
            for x in xs {
                f.write_all(&floats_to_bytes(x)).map_err(io(&hidden))?;
            }
            f.into_inner()
                .map_err(|e| io(&hidden)(e.into_error()))?
                .sync_all()
                .map_err(io(&hidden))?;
        }
        self.layers = l + 1;
        self.write_state(report)?;
        self.discard = false;
        let old = self.dir.join(format!("hidden-{l}.bin"));
        let _ = std::fs::remove_file(old);
        Ok(())
    }

    fn write_state(&self, report: &Report) -> Result<(), CalibrateError> {
        let blobs: Vec<Value> = self
            .index
            .iter()
            .map(|((kind, name), (at, len))| json!({"kind": kind, "name": name, "at": at, "len": len}))
            .collect();
        let state = json!({
            "layers": self.layers,
            "bytes": self.at,
            "blobs": blobs,
            "report": report_json(report),
        });
        replace_file(
            &self.dir.join(STATE),
            &serde_json::to_vec(&state).unwrap_or_default(),
        )
    }

    /// The output is written: the folder goes.
    pub(crate) fn finish(mut self) {
        self.discard = true;
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if self.discard {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether the folder's manifest is `manifest`.
fn same_run(dir: &Path, manifest: &Manifest) -> bool {
    read_json(&dir.join(MANIFEST))
        .ok()
        .and_then(|v| v.as_object().cloned())
        .is_some_and(|m| manifest.iter().all(|(k, v)| m.get(k) == Some(v)))
}

/// The recipe (TOML) an interrupted run of `out` that finished layers was
/// quantizing to, as its work folder records it.
pub fn interrupted_recipe(out: &Path) -> Option<String> {
    if finished_layers(out) == 0 {
        return None;
    }
    let manifest = read_json(&Work::folder(out).join(MANIFEST)).ok()?;
    manifest.get("recipe")?.as_str().map(str::to_owned)
}

/// The layers an interrupted run of `out` finished, kept in its work folder.
pub fn finished_layers(out: &Path) -> u64 {
    read_json(&Work::folder(out).join(STATE))
        .ok()
        .and_then(|s| s.get("layers").and_then(Value::as_u64))
        .unwrap_or(0)
}

fn read_json(path: &Path) -> Result<Value, CalibrateError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        CalibrateError::Input(format!(
            "{}: not the JSON a calibration wrote ({e}); delete the folder to start over",
            path.display()
        ))
    })
}

fn report_json(r: &Report) -> Value {
    let groups: Vec<Value> = r.groups.iter().map(GroupReport::to_json).collect();
    json!({
        "groups": groups, "calibrated": r.calibrated, "unreached_experts": r.unreached_experts,
        "layer_seconds": r.layer_seconds, "forward_seconds": r.forward_seconds,
        "hessian_seconds": r.hessian_seconds, "awq_seconds": r.awq_seconds,
        "quantize_seconds": r.quantize_seconds, "factor_seconds": r.factor_seconds,
    })
}

fn report_from(v: &Value) -> Report {
    let f = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let u = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
    let groups = v
        .get("groups")
        .and_then(Value::as_array)
        .map_or(&[][..], |g| &g[..])
        .iter()
        .map(|g| GroupReport {
            input: g
                .get("input")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            alpha: g.get("alpha").and_then(Value::as_f64).map(|a| a as f32),
            awq_error_ratio: g.get("awq_error_ratio").and_then(Value::as_f64),
            damp: g.get("damp").and_then(Value::as_f64),
            tokens: g.get("tokens").and_then(Value::as_u64).unwrap_or(0),
        })
        .collect();
    Report {
        groups,
        calibrated: u("calibrated"),
        unreached_experts: u("unreached_experts"),
        layer_seconds: v
            .get("layer_seconds")
            .and_then(Value::as_array)
            .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_f64).collect()),
        forward_seconds: f("forward_seconds"),
        hessian_seconds: f("hessian_seconds"),
        awq_seconds: f("awq_seconds"),
        quantize_seconds: f("quantize_seconds"),
        factor_seconds: f("factor_seconds"),
        ..Report::default()
    }
}
