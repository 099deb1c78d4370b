//! The names users give for what to write: llama.cpp's file types
//! (`Q4_K_M`, or llama-quantize's number, `15`) and tensor types (`q8_0`),
//! which of them memwall can write, and the messages for names it does not
//! know or cannot write yet ("did you mean …?", the valid list).

use memwall_format::GgmlType;
use memwall_format::ggml_type::{FILE_TYPES, FileTypeInfo, file_type, file_type_by_name};
use memwall_format::suggest::did_you_mean;

use crate::ENCODABLE;

/// File types llama.cpp defines but `llama-quantize` does not offer (no
/// entry in its list of types, no rules in `llama-quant.cpp`): NVFP4 tensors
/// are written over another file type with `--tensor-type`.
const NOT_OFFERED: [&str; 1] = ["NVFP4"];

/// Whether `llama-quantize` offers this file type.
fn offered(ftype: &FileTypeInfo) -> bool {
    !NOT_OFFERED.contains(&ftype.name)
}

/// Whether memwall can write a file of this type: llama-quantize offers it
/// and its base type has an encoder (the mixes of such file types only
/// choose types that have one).
pub fn can_write(ftype: &FileTypeInfo) -> bool {
    offered(ftype) && ftype.base.is_some_and(|t| ENCODABLE.contains(&t))
}

/// The file types memwall writes, in llama-quantize's order of ids.
pub fn writable_file_types() -> impl Iterator<Item = &'static FileTypeInfo> {
    FILE_TYPES.iter().filter(|f| can_write(f))
}

/// The file types `--dry-run` plans that memwall cannot write yet.
pub fn planned_file_types() -> impl Iterator<Item = &'static FileTypeInfo> {
    FILE_TYPES
        .iter()
        .filter(|f| offered(f) && f.base.is_some() && !can_write(f))
}

fn names(types: impl Iterator<Item = &'static FileTypeInfo>) -> String {
    types.map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// "memwall writes …" (and "; planned, --dry-run only: …" while there are
/// such types), for messages.
pub fn file_type_list() -> String {
    let planned = names(planned_file_types());
    let writes = format!("memwall writes {}", names(writable_file_types()));
    if planned.is_empty() {
        writes
    } else {
        format!("{writes}; planned, --dry-run only: {planned}")
    }
}

/// A file type by llama-quantize's name (any case) or number.
pub fn parse_file_type(name: &str) -> Option<&'static FileTypeInfo> {
    file_type_by_name(name).or_else(|| {
        name.parse::<u32>()
            .ok()
            .and_then(file_type)
            .filter(|f| f.base.is_some())
    })
}

/// The message for a name that is no file type: the nearest name, then the list.
pub fn unknown_file_type(name: &str) -> String {
    let candidates = FILE_TYPES
        .iter()
        .filter(|f| f.base.is_some())
        .map(|f| f.name);
    format!(
        "unknown quantization type '{name}'{}. {}",
        did_you_mean(name, candidates),
        file_type_list()
    )
}

/// Why a file type cannot be written or a tensor type name cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TypeNameError {
    /// The file type is known, but memwall has no encoder for its base type.
    #[error(
        "memwall cannot write {ftype} yet (its {} blocks have no encoder); it can plan it with \
         --dry-run. {}",
        .base.map_or("?", GgmlType::name),
        file_type_list()
    )]
    CannotWrite {
        /// The file type's name (`IQ2_XS`).
        ftype: &'static str,
        /// Its base type, if it has one.
        base: Option<GgmlType>,
    },
    /// llama.cpp names the file type, but neither it nor memwall has rules for it.
    #[error(
        "llama.cpp has no {ftype} file type to write (llama-quantize does not offer it); \
         write {ftype} tensors over another type with --tensor-type, e.g. \
         `Q8_0 --tensor-type ffn={tensor_type} --tensor-type attn={tensor_type}`"
    )]
    NotOffered {
        /// The file type's name.
        ftype: &'static str,
        /// Its tensor type (`nvfp4`).
        tensor_type: &'static str,
    },
    /// The tensor type is known, but memwall has no encoder for it.
    #[error(
        "memwall cannot encode {} yet; it encodes {}",
        .ty.name().to_ascii_uppercase(),
        encodable()
    )]
    CannotEncode {
        /// The type.
        ty: GgmlType,
    },
    /// No tensor type has this name.
    #[error(
        "unknown tensor type '{name}'{}; memwall encodes {}",
        did_you_mean_type(name),
        encodable()
    )]
    UnknownTensorType {
        /// The name as given.
        name: String,
    },
}

/// The types memwall encodes, upper case, for messages.
fn encodable() -> String {
    ENCODABLE
        .iter()
        .map(|t| t.name().to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(", ")
}

/// " (did you mean Q8_0?)" for the tensor type nearest to `name`, or nothing.
fn did_you_mean_type(name: &str) -> String {
    let upper: Vec<String> = GgmlType::all()
        .map(|t| t.name().to_ascii_uppercase())
        .collect();
    did_you_mean(name, upper.iter().map(String::as_str))
}

/// Refuses a file type that llama-quantize does not offer either (before
/// planning it).
pub fn check_offered(ftype: &FileTypeInfo) -> Result<(), TypeNameError> {
    if offered(ftype) {
        return Ok(());
    }
    Err(TypeNameError::NotOffered {
        ftype: ftype.name,
        tensor_type: ftype.base.map_or("?", GgmlType::name),
    })
}

/// Refuses a file type memwall cannot write, before any work.
pub fn check_writable(ftype: &FileTypeInfo) -> Result<(), TypeNameError> {
    check_offered(ftype)?;
    if can_write(ftype) {
        return Ok(());
    }
    Err(TypeNameError::CannotWrite {
        ftype: ftype.name,
        base: ftype.base,
    })
}

/// A tensor type (`q8_0`, `F16`; any case) that memwall can encode, or why not.
pub fn parse_tensor_type(name: &str) -> Result<GgmlType, TypeNameError> {
    match GgmlType::all().find(|t| t.name().eq_ignore_ascii_case(name)) {
        Some(t) if ENCODABLE.contains(&t) => Ok(t),
        Some(ty) => Err(TypeNameError::CannotEncode { ty }),
        None => Err(TypeNameError::UnknownTensorType {
            name: name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_valid_list_names_only_what_can_be_written() {
        let writable: Vec<&str> = writable_file_types().map(|f| f.name).collect();
        for name in [
            "Q4_0",
            "Q8_0",
            "Q2_K",
            "Q2_K_S",
            "Q4_K_M",
            "IQ4_XS",
            "F16",
            "BF16",
            "TQ1_0",
            "TQ2_0",
            "MXFP4_MOE",
            "IQ2_XXS",
            "IQ2_M",
            "IQ3_XXS",
            "IQ1_S",
            "IQ1_M",
        ] {
            assert!(writable.contains(&name), "{name}");
        }
        for name in ["Q1_0", "Q2_0", "NVFP4"] {
            assert!(
                writable.contains(&name) != (name == "NVFP4"),
                "{name}: {writable:?}"
            );
        }
        assert_eq!(planned_file_types().count(), 0);
        let list = file_type_list();
        assert!(
            list.starts_with("memwall writes F32, F16, Q4_0") && !list.contains("planned"),
            "{list}"
        );
        let e = check_writable(parse_file_type("NVFP4").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tensor-type ffn=nvfp4"), "{e}");
    }

    #[test]
    fn names_and_numbers_parse_as_llama_quantize_reads_them() {
        assert_eq!(parse_file_type("q4_k_m").unwrap().name, "Q4_K_M");
        assert_eq!(parse_file_type("15").unwrap().name, "Q4_K_M");
        assert!(parse_file_type("Q4KM").is_none());
        assert!(parse_file_type("4").is_none(), "a removed file type");
    }

    #[test]
    fn unknown_names_get_the_nearest_one() {
        let m = unknown_file_type("Q4KM");
        assert!(m.contains("(did you mean Q4_K_M?)"), "{m}");
        assert!(!unknown_file_type("out.gguf").contains("did you mean"));
        let e = parse_tensor_type("q80").unwrap_err().to_string();
        assert!(e.contains("did you mean Q8_0?"), "{e}");
        assert_eq!(parse_tensor_type("nvfp4"), Ok(GgmlType::NVFP4));
        let e = parse_tensor_type("q8_k").unwrap_err().to_string();
        assert!(e.contains("cannot encode Q8_K yet"), "{e}");
        assert!(check_writable(parse_file_type("Q4_K_M").unwrap()).is_ok());
    }
}
