//! llama.cpp's spellings that clap cannot read as they are meant.
//!
//! llama.cpp's tools have multi-letter flags after a single dash (`-ngl 99`,
//! `-cnv`, `-sys`); clap reads those as a short flag with a value (`-n gl`,
//! `-c nv`), which would fail with a confusing message or, worse, mean
//! something else. Before clap sees the command line, each such flag is
//! rewritten to the memwall flag with the same meaning, or refused with a
//! note that says what memwall does instead. Flags whose meaning differs
//! between the tools (`--device`) are refused where memwall has no such flag.
//! `quantize --tensor-type-file FILE` becomes the `--tensor-type` rules the
//! file lists, in its place among the others (the first match wins).

use std::ffi::OsString;

/// What becomes of one of llama.cpp's flags.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// The memwall spelling with the same meaning.
    Rename(&'static str),
    /// No memwall equivalent: the note says why and what to do instead.
    Refuse(&'static str),
}

const GPU: &str = "memwall computes on the CPU (no GPU offload); drop it";
const SERVER: &str = "memwall has no server; drop it";
const DOWNLOAD: &str = "memwall reads local files: fetch the model first (`memwall convert \
                        org/name` downloads a checkpoint) and pass its path";
const KV_TYPE: &str = "memwall's runtime keeps the KV cache in f16, as llama.cpp does by \
                       default; drop it (`memwall plan --kv-type q8_0` plans llama.cpp's \
                       8-bit cache)";

/// llama.cpp's flags, in every command.
const FLAGS: &[(&str, Action)] = &[
    ("-ngl", Action::Refuse(GPU)),
    ("--n-gpu-layers", Action::Refuse(GPU)),
    ("--gpu-layers", Action::Refuse(GPU)),
    ("-ts", Action::Refuse(GPU)),
    ("--tensor-split", Action::Refuse(GPU)),
    ("-sm", Action::Refuse(GPU)),
    ("--split-mode", Action::Refuse(GPU)),
    ("-mg", Action::Refuse(GPU)),
    ("--main-gpu", Action::Refuse(GPU)),
    ("-dev", Action::Refuse(GPU)),
    ("-ot", Action::Refuse(GPU)),
    ("--override-tensor", Action::Refuse(GPU)),
    ("-nkvo", Action::Refuse(GPU)),
    ("--no-kv-offload", Action::Refuse(GPU)),
    ("-kvo", Action::Refuse(GPU)),
    ("--kv-offload", Action::Refuse(GPU)),
    ("-cmoe", Action::Refuse(GPU)),
    ("--cpu-moe", Action::Refuse(GPU)),
    ("-ncmoe", Action::Refuse(GPU)),
    ("--n-cpu-moe", Action::Refuse(GPU)),
    (
        "-fa",
        Action::Refuse(
            "memwall's attention has no flash-attention switch (its results are the same \
             either way); drop it",
        ),
    ),
    (
        "--flash-attn",
        Action::Refuse(
            "memwall's attention has no flash-attention switch (its results are the same \
             either way); drop it",
        ),
    ),
    ("-ctk", Action::Refuse(KV_TYPE)),
    ("--cache-type-k", Action::Refuse(KV_TYPE)),
    ("-ctv", Action::Refuse(KV_TYPE)),
    ("--cache-type-v", Action::Refuse(KV_TYPE)),
    (
        "-tb",
        Action::Refuse("-t sets the threads of prompt processing and decoding alike; drop it"),
    ),
    (
        "--threads-batch",
        Action::Refuse("-t sets the threads of prompt processing and decoding alike; drop it"),
    ),
    (
        "-ub",
        Action::Refuse(
            "memwall evaluates -b tokens per forward call and has no separate physical \
             batch; drop it",
        ),
    ),
    (
        "--ubatch-size",
        Action::Refuse(
            "memwall evaluates -b tokens per forward call and has no separate physical \
             batch; drop it",
        ),
    ),
    ("-hf", Action::Refuse(DOWNLOAD)),
    ("-hfr", Action::Refuse(DOWNLOAD)),
    ("--hf-repo", Action::Refuse(DOWNLOAD)),
    ("-hff", Action::Refuse(DOWNLOAD)),
    ("--hf-file", Action::Refuse(DOWNLOAD)),
    ("-mu", Action::Refuse(DOWNLOAD)),
    ("--model-url", Action::Refuse(DOWNLOAD)),
    ("-np", Action::Refuse(SERVER)),
    ("--parallel", Action::Refuse(SERVER)),
    ("-cb", Action::Refuse(SERVER)),
    ("--cont-batching", Action::Refuse(SERVER)),
    // llama-cli's conversation flags: `memwall run` handles their meaning.
    ("-cnv", Action::Rename("--conversation")),
    ("-no-cnv", Action::Rename("--no-conversation")),
    ("-st", Action::Rename("--single-turn")),
    ("-sys", Action::Rename("--system-prompt")),
];

/// Commands where `--device` would be llama.cpp's (GPUs to offload to):
/// only `plan` and `compare` have a device, and theirs is a phone profile.
const NO_DEVICE_PROFILE: &[&str] = &[
    "run",
    "bench",
    "perplexity",
    "validate",
    "tokenize",
    "imatrix",
    "quantize",
];

/// The subcommand path of a command line (`run`, or `calibrate imatrix`).
fn command_of(args: &[OsString]) -> Vec<String> {
    args.iter()
        .skip(1)
        .map(|a| a.to_string_lossy())
        .filter(|a| !a.starts_with('-'))
        .take(2)
        .map(|a| a.into_owned())
        .collect()
}

/// Rewrites llama.cpp's spellings in `args` (program name first), or says
/// why one cannot be taken. Arguments after `--` are left alone.
pub fn translate(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let path = command_of(&args);
    let command = match path.as_slice() {
        [first, second, ..] if first == "calibrate" => second.as_str(),
        [first, ..] => first.as_str(),
        [] => "",
    };
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.into_iter();
    if let Some(program) = rest.next() {
        out.push(program);
    }
    let mut literal = false;
    while let Some(arg) = rest.next() {
        let Some(text) = arg.to_str().filter(|_| !literal) else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            literal = true;
            out.push(arg);
            continue;
        }
        let (flag, value) = match text.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v)),
            _ => (text, None),
        };
        // llama-quantize's --tensor-type-file: its rules take its place among
        // the --tensor-type rules (first match wins, so the order matters).
        if flag == "--tensor-type-file" && command == "quantize" {
            let file = match value {
                Some(v) => v.to_owned(),
                None => rest
                    .next()
                    .map(|v| v.to_string_lossy().into_owned())
                    .ok_or("--tensor-type-file needs a FILE")?,
            };
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("--tensor-type-file {file}: cannot read it: {e}"))?;
            for rule in text.split_whitespace() {
                out.push("--tensor-type".into());
                out.push(rule.into());
            }
            continue;
        }
        if flag == "--device" && NO_DEVICE_PROFILE.contains(&command) {
            return Err(format!(
                "--device is llama.cpp's list of GPUs; memwall computes on the CPU, and \
                 `memwall {command}` has no device profile (plan and compare take one): drop it"
            ));
        }
        // llama-bench's -mmp 0|1 (and llama.cpp's --mmap/--no-mmap).
        if flag == "-mmp" || flag == "--mmap" {
            let value = match value {
                Some(v) => Some(v.to_owned()),
                None if flag == "-mmp" => rest.next().map(|v| v.to_string_lossy().into_owned()),
                None => Some("1".to_owned()),
            };
            match value.as_deref() {
                Some("0") => out.push("--no-mmap".into()),
                Some("1") => {}
                other => {
                    return Err(format!(
                        "{flag} takes 0 or 1 (found {}); memwall maps the model by default, \
                         --no-mmap reads it into memory",
                        other.unwrap_or("nothing")
                    ));
                }
            }
            continue;
        }
        match FLAGS.iter().find(|(name, _)| *name == flag) {
            Some((_, Action::Rename(to))) => {
                let mut renamed = OsString::from(*to);
                if let Some(v) = value {
                    renamed.push("=");
                    renamed.push(v);
                }
                out.push(renamed);
            }
            Some((name, Action::Refuse(note))) => {
                return Err(format!("{name} is a llama.cpp option: {note}"));
            }
            None => out.push(arg),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<OsString> {
        line.split(' ').map(OsString::from).collect()
    }

    fn text(v: Vec<OsString>) -> String {
        v.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn conversation_flags_become_memwall_flags() {
        let out = translate(args("memwall run -m m.gguf -cnv -sys hi -st")).unwrap();
        assert_eq!(
            text(out),
            "memwall run -m m.gguf --conversation --system-prompt hi --single-turn"
        );
    }

    #[test]
    fn gpu_flags_are_refused_with_a_note() {
        let err = translate(args("memwall run -m m.gguf -ngl 99")).unwrap_err();
        assert!(err.starts_with("-ngl is a llama.cpp option"), "{err}");
        assert!(err.contains("CPU"), "{err}");
        let err = translate(args("memwall bench -m m.gguf --n-gpu-layers=99")).unwrap_err();
        assert!(err.starts_with("--n-gpu-layers"), "{err}");
    }

    #[test]
    fn device_is_refused_only_where_it_would_be_a_gpu_list() {
        assert!(translate(args("memwall run -m m.gguf --device cuda0")).is_err());
        assert!(translate(args("memwall calibrate imatrix -m m.gguf --device x")).is_err());
        assert!(translate(args("memwall plan m.gguf --device phone-8gb")).is_ok());
        assert!(translate(args("memwall compare m.gguf --device=phone-8gb")).is_ok());
    }

    #[test]
    fn mmap_zero_means_no_mmap() {
        assert_eq!(
            text(translate(args("memwall bench -m m.gguf -mmp 0")).unwrap()),
            "memwall bench -m m.gguf --no-mmap"
        );
        assert_eq!(
            text(translate(args("memwall bench -m m.gguf -mmp 1")).unwrap()),
            "memwall bench -m m.gguf"
        );
        assert!(translate(args("memwall bench -m m.gguf -mmp x")).is_err());
    }

    #[test]
    fn a_tensor_type_file_takes_its_place_among_the_rules() {
        let dir = std::env::temp_dir().join(format!("memwall-spellings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rules.txt");
        std::fs::write(&file, "ffn_down=q6_k attn_v=q8_0\n  output=q5_k\n").unwrap();
        let line = format!(
            "memwall quantize in.gguf out.gguf Q4_K_M --tensor-type a=q4_0 --tensor-type-file {} \
             --tensor-type b=q5_0",
            file.display()
        );
        let out = text(translate(args(&line)).unwrap());
        assert!(
            out.ends_with(
                "--tensor-type a=q4_0 --tensor-type ffn_down=q6_k --tensor-type attn_v=q8_0 \
                 --tensor-type output=q5_k --tensor-type b=q5_0"
            ),
            "{out}"
        );
        let missing = "memwall quantize in.gguf Q4_K_M --tensor-type-file /nonexistent/rules.txt";
        let err = translate(args(missing)).unwrap_err();
        assert!(err.contains("/nonexistent/rules.txt: cannot read"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn arguments_after_a_double_dash_are_left_alone() {
        let out = translate(args("memwall run -m m.gguf -p -- -ngl")).unwrap();
        assert_eq!(text(out), "memwall run -m m.gguf -p -- -ngl");
    }
}
