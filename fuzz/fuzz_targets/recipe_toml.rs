//! Mixed-precision recipes: any text either fails with an error, or parses into
//! a recipe whose canonical TOML parses back to the same recipe. Applied to a
//! tiny llama and a MoE shape, `memwall plan`'s arithmetic (`fit::Choice`)
//! gives every tensor a type whose blocks divide its rows, or an error naming
//! the tensor; on the llama model `memwall quantize --dry-run`'s plan agrees
//! with it tensor for tensor, and its output file sizes can be computed.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memwall_quantize::fit::{Choice, Shape};
use memwall_quantize::job::{self, Options};
use memwall_quantize::recipe::Recipe;
use memwall_format::gguf::{GgufModel, GgufWriter, LoadMode, Metadata, TensorSpec};

/// Rows of 256 (K-quant blocks fit) and of 96 (they do not: fallbacks).
fn llama() -> Shape {
    Shape::dense("llama", 3, 256, 96, 4, 2, 64, 64, false)
}

/// 576-wide rows (SmolLM2's width) and expert stacks, tied embeddings.
fn moe() -> Shape {
    let mut s = Shape::dense("qwen3moe", 2, 576, 0, 9, 3, 64, 100, true);
    (s.n_expert, s.n_expert_used, s.n_ff_expert) = (8, 2, 64);
    s
}

/// The llama shape as a GGUF model (zero weights), built once.
fn model() -> &'static GgufModel {
    static MODEL: OnceLock<GgufModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let shape = llama();
        let mut meta = Metadata::new();
        meta.set("general.architecture", "llama");
        meta.set("llama.block_count", shape.n_layer);
        meta.set("llama.attention.head_count", shape.n_head);
        meta.set("llama.attention.head_count_kv", shape.n_head_kv);
        let tensors = shape.tensors();
        let specs = tensors
            .iter()
            .map(|t| TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
            })
            .collect();
        let mut w = GgufWriter::new(Vec::new(), Path::new("llama"), 3, meta, specs).unwrap();
        for t in &tensors {
            let bytes = t.ty.tensor_size(&t.dims).unwrap().bytes as usize;
            w.write_tensor(&t.name, &vec![0; bytes]).unwrap();
        }
        let path = format!("/dev/shm/memwall-fuzz-recipe-{}.gguf", std::process::id());
        std::fs::write(&path, w.finish().unwrap()).unwrap();
        let model = GgufModel::open_with(path.as_ref(), LoadMode::Read).unwrap();
        std::fs::remove_file(&path).unwrap();
        model
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(recipe) = Recipe::parse(text) else {
        return;
    };

    let printed = recipe.to_toml();
    let again = Recipe::parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(again.to_toml(), printed, "printing is not stable");
    assert_eq!(
        (
            &again.name,
            &again.description,
            again.base.name,
            again.output,
            again.token_embedding
        ),
        (
            &recipe.name,
            &recipe.description,
            recipe.base.name,
            recipe.output,
            recipe.token_embedding
        )
    );
    assert_eq!(again.rules.len(), recipe.rules.len());
    for (a, b) in again.rules.iter().zip(&recipe.rules) {
        assert_eq!(
            (&a.text, a.ty, &a.layers, a.always),
            (&b.text, b.ty, &b.layers, b.always)
        );
    }

    let choice = Choice::recipe(recipe.clone());
    let mut planned = None;
    for shape in [llama(), moe()] {
        let tensors = shape.tensors();
        match choice.weights(&shape.facts(), &tensors) {
            Ok(w) => {
                assert_eq!(w.parts.len(), tensors.len());
                for (part, t) in w.parts.iter().zip(&tensors) {
                    assert_eq!(
                        part.bytes,
                        part.ty.tensor_size(&t.dims).unwrap().bytes,
                        "{}",
                        t.name
                    );
                }
                if shape.arch == "llama" {
                    planned = Some(w);
                }
            }
            Err(e) => assert!(
                tensors.iter().any(|t| e.to_string().contains(&t.name)),
                "{e}"
            ),
        }
    }

    let mut options = Options::new(recipe.base);
    options.recipe = Some(recipe);
    match job::plan(model(), Path::new("llama.gguf"), &options) {
        Ok(plan) => {
            let w = planned.expect("the planner accepts what quantize accepts");
            assert_eq!(plan.target_bytes(), w.bytes(), "plan and quantize disagree");
            plan.file_sizes().expect("a plan's files can be sized");
        }
        Err(e) => assert!(planned.is_none(), "quantize refuses what plan accepts: {e}"),
    }
});
