//! Recipes on tiny-zh: the types each preset gives, the recipe recorded in
//! the output's metadata, and the exact files stock llama-perplexity ran on
//! (fixtures/tiny-zh/reference/recipes.json, from recipe_reference.sh).

use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use memwall_format::gguf::{GgufFile, GgufModel};
use memwall_format::progress::Silent;
use memwall_quantize::job::{self, Options};
use memwall_quantize::recipe::{PRESETS, Recipe};
use sha2::{Digest, Sha256};

fn tiny_zh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-zh")
}

fn run_recipe(name: &str, out: &Path) -> GgufFile {
    let input = tiny_zh().join("reference/tiny-zh-f16.gguf");
    let model = GgufModel::open(&input).unwrap();
    let recipe = Recipe::preset(name).unwrap();
    let mut options = Options::new(recipe.base);
    options.recipe = Some(recipe);
    let plan = job::plan(&model, &input, &options).unwrap();
    assert!(plan.warnings.is_empty(), "{name}: {:?}", plan.warnings);
    job::run(&model, &plan, None, false, out, &Silent).unwrap();
    GgufFile::open(out).unwrap()
}

#[test]
fn presets_give_the_types_they_promise() {
    let dir = tempfile::tempdir().unwrap();
    let expect = |name: &str, tensor: &str| -> GgmlType {
        let (recipe, t) = (name, tensor);
        let attn = if recipe == "attn-f16-ffn-q4" {
            GgmlType::F16
        } else {
            GgmlType::Q8_0
        };
        if t.ends_with("_norm.weight") {
            GgmlType::F32
        } else if t.contains(".attn_") {
            attn
        } else if t.contains("ffn_down") && recipe.ends_with("down-q6") {
            GgmlType::Q6_K
        } else if t.contains(".ffn_") {
            GgmlType::Q4_K
        } else {
            GgmlType::Q6_K // token_embd, output
        }
    };
    for (name, _) in PRESETS {
        let out = dir.path().join(format!("{name}.gguf"));
        let file = run_recipe(name, &out);
        for t in file.tensors() {
            assert_eq!(t.ty, expect(name, &t.name), "{name}: {}", t.name);
        }
        let meta = file.metadata();
        assert_eq!(meta.get_str("memwall.recipe.name").unwrap(), Some(name));
        let recorded = meta.get_str("memwall.recipe").unwrap().unwrap();
        let again = Recipe::parse(recorded).unwrap();
        assert_eq!(again.to_toml(), Recipe::preset(name).unwrap().to_toml());
        // general.file_type is the base's.
        assert_eq!(meta.get_u32("general.file_type").unwrap(), Some(15));
    }
}

#[test]
fn recipe_outputs_are_the_files_llama_perplexity_ran_on() {
    let text = std::fs::read_to_string(tiny_zh().join("reference/recipes.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, expected) in reference["recipes"].as_object().unwrap() {
        let out = dir.path().join(format!("{name}.gguf"));
        run_recipe(name, &out);
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(
            bytes.len() as u64,
            expected["bytes"].as_u64().unwrap(),
            "{name}"
        );
        let sha = format!("{:x}", Sha256::digest(&bytes));
        assert_eq!(sha, expected["sha256"].as_str().unwrap(), "{name}");
        // Perplexity within 1% of the F16 model's (46.79), as recorded from llama.cpp.
        let ppl = expected["ppl"].as_f64().unwrap();
        assert!(
            ppl > 46.79 && ppl < 46.79 * 1.01,
            "{name}: perplexity {ppl}"
        );
    }
}

#[test]
fn layer_ranges_and_cli_rules_come_first() {
    let input = tiny_zh().join("reference/tiny-zh-f16.gguf");
    let model = GgufModel::open(&input).unwrap();
    let recipe = Recipe::parse(
        r#"name = "edges"
base = "Q4_K_S"
[[rule]]
match = 'ffn_down'
layers = "0, 3"
type = "Q8_0"
"#,
    )
    .unwrap();
    let mut options = Options::new(recipe.base);
    options.recipe = Some(recipe);
    options.tensor_types.push(
        memwall_quantize::recipe::make_override(
            "blk\\.3\\.ffn_down",
            GgmlType::Q5_0,
            vec![],
            false,
        )
        .unwrap(),
    );
    let plan = job::plan(&model, &input, &options).unwrap();
    let ty = |n: &str| plan.tensors.iter().find(|t| t.name == n).unwrap().target;
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.3.ffn_down.weight"), GgmlType::Q5_0); // --tensor-type before the recipe
    // Layers 1 and 2 fall through to Q4_K_S's own rule (Q5_K for ffn_down in the first eighth
    // only; tiny-zh has 4 layers, so n/8 = 0 and they keep the base type).
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q4_K);
}
