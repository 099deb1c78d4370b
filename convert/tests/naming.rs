//! Model naming against gguf-py (fixtures/synth/naming.json, recorded by
//! fixtures/synth/naming_reference.py from llama.cpp 0c1e570's gguf-py): the
//! parts of 21 model ids at 6 parameter counts, size labels, and the keys a
//! checkpoint folder gets from its name and `_name_or_path`.

use std::path::Path;

use memwall_convert::naming::{IdParts, id_parts, naming, size_label};
use serde_json::Value;

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/synth/naming.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn opt(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

#[test]
fn id_parts_equal_gguf_py() {
    for case in reference()["components"].as_array().unwrap() {
        let id = case["id"].as_str().unwrap();
        let total = case["total_params"].as_i64().unwrap();
        let r = &case["result"];
        let want = IdParts {
            full_name: opt(&r[0]),
            organization: opt(&r[1]),
            basename: opt(&r[2]),
            finetune: opt(&r[3]),
            version: opt(&r[4]),
            size_label: opt(&r[5]),
        };
        assert_eq!(id_parts(id, total), want, "{id} at {total} parameters");
    }
}

#[test]
fn size_labels_equal_gguf_py() {
    for case in reference()["size_label"].as_array().unwrap() {
        let a: Vec<u64> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(
            size_label(a[0], a[1], a[2], a[3]),
            case["result"].as_str().unwrap(),
            "{a:?}"
        );
    }
}

#[test]
fn folder_naming_equals_gguf_py() {
    let dir = tempfile::tempdir().unwrap();
    for case in reference()["load"].as_array().unwrap() {
        let folder = dir.path().join(case["dir"].as_str().unwrap());
        std::fs::create_dir_all(&folder).unwrap();
        let config = match case["name_or_path"].as_str() {
            Some(p) => serde_json::json!({ "_name_or_path": p }),
            None => serde_json::json!({}),
        };
        let total = case["total_params"].as_u64().unwrap();
        let n = naming(&folder, &config, (total, total, 0, 0), &Default::default());
        let label = format!("{}", case["dir"]);
        assert_eq!(n.name, opt(&case["name"]), "{label}");
        assert_eq!(n.organization, opt(&case["organization"]), "{label}");
        assert_eq!(n.basename, opt(&case["basename"]), "{label}");
        assert_eq!(n.finetune, opt(&case["finetune"]), "{label}");
        assert_eq!(n.version, opt(&case["version"]), "{label}");
        // gguf-py's Metadata.load leaves the size label unset when the name has none;
        // the converter then derives it from the parameter count.
        match opt(&case["size_label"]) {
            Some(s) => assert_eq!(n.size_label.as_deref(), Some(s.as_str()), "{label}"),
            None => assert_eq!(
                n.size_label,
                Some(size_label(total, total, 0, 0)),
                "{label}"
            ),
        }
    }
}

#[test]
fn pre_tokenizers_are_recognised_like_llama_cpp() {
    use memwall_convert::vocab::{detect_pre, probe_hash};
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    // SmolLM2's tokenizer: llama.cpp's converter wrote `smollm` for it (smollm2/reference).
    assert_eq!(detect_pre(&fixtures.join("smollm2")).unwrap(), "smollm");
    // tiny-zh's own vocabulary is not in llama.cpp's table either: an error naming
    // the file and the hash, suggesting --pre.
    let err = detect_pre(&fixtures.join("tiny-zh"))
        .unwrap_err()
        .to_string();
    let hash = probe_hash(&fixtures.join("tiny-zh")).unwrap();
    assert!(
        err.contains("tiny-zh/tokenizer.json") && err.contains(&hash) && err.contains("--pre"),
        "{err}"
    );
}
